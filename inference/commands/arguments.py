"""Arguments the commands share, declared without importing torch.

``pyrogp --help``, ``pyrogp --version`` and ``pyrogp COMMAND --help`` build the parser only, so a
command module imports nothing heavy at its top: the libraries it runs on are imported inside
its ``run``. Names the library registers (likelihoods, kernel families, ...) are offered as
:class:`LibraryNames`, which imports the registry only when a value is checked against it.
"""

from __future__ import annotations

import argparse
import copy
import importlib
from collections.abc import Iterator
from pathlib import Path


class LibraryNames:
    """The keys of a registry of the library (``"module:attribute"``), as argparse ``choices``:
    imported when a value is checked, so declaring the argument costs nothing."""

    def __init__(self, registry: str):
        self.registry = registry

    def names(self) -> list[str]:
        module_name, attribute = self.registry.split(":")
        return sorted(getattr(importlib.import_module(module_name), attribute))

    def __contains__(self, name: object) -> bool:
        return name in self.names()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, except that it leaves :class:`LibraryNames` unread unless a help
    text quotes ``%(choices)s`` (argparse would otherwise join them for every help line)."""

    def _expand_help(self, action: argparse.Action) -> str:
        if isinstance(action.choices, LibraryNames) and "%(choices)" not in (action.help or ""):
            action = copy.copy(action)
            action.choices = None
        return super()._expand_help(action)


class RawDescriptionHelpFormatter(HelpFormatter, argparse.RawDescriptionHelpFormatter):
    """:class:`HelpFormatter` that keeps the line breaks of the description and epilog."""


LIKELIHOOD_NAMES = LibraryNames("pyrogp_models.likelihoods:LIKELIHOODS")
#: The kernel kinds of :data:`pyrogp_models.kernels.KINDS`, written out so that help costs no
#: import (tests/test_cli_startup.py checks the two agree).
KERNEL_KINDS = ("constant", "linear", "matern12", "matern32", "matern52", "periodic", "rbf", "rq",
                "white")
KERNEL_HELP = (
    "the kernel, an expression: " + ", ".join(KERNEL_KINDS) + " joined by '+' and '*', with "
    "parentheses and optional values in data units, e.g. \"rbf + periodic(period=1) * rbf + "
    "rq + white\"; fixed(v) holds a value, ard gives one lengthscale per input column, "
    "dims=[0,2] selects input columns")


def add_restarts(parser: argparse.ArgumentParser, exact: bool = False) -> None:
    """``--restarts R``: starts per fit, the best kept (``exact``: the exact experts' starts)."""
    from pyrogp_models.inference.train_config import DEFAULT_RESTARTS, SPACING_MULTIPLE

    if exact:
        text = ("fit from R starts one after another (the library's rule, then shorter "
                f"lengthscales down to {SPACING_MULTIPLE:g}× the inputs' spacing and less "
                "noise) and keep the best log marginal likelihood "
                f"(default: {DEFAULT_RESTARTS})")
    else:
        text = ("screen R starts (the library's rule, then longer lengthscales and less noise) "
                "and fit from the one with the best bound "
                f"(default: {DEFAULT_RESTARTS}, 1 with --batch-size)")
    parser.add_argument("--restarts", type=int, default=None, metavar="R", help=text)


def add_kernel(parser: argparse.ArgumentParser, default: str | None = "rbf",
               default_text: str = "rbf") -> None:
    """``--kernel EXPR``: read by :func:`~pyrogp_models.kernels.expression.parse_kernel` once the
    data's columns are known (an error names the offending token, before any fitting)."""
    parser.add_argument("--kernel", metavar="EXPR", default=default,
                        help=f"{KERNEL_HELP} (default: {default_text})")


def add_data(parser: argparse.ArgumentParser) -> None:
    """The data file of a fit."""
    parser.add_argument("data", metavar="DATA", type=Path, help="CSV (with header) or .npz")


def add_features(parser: argparse.ArgumentParser, besides: str = "the target") -> None:
    """``--features``: comma-separated input columns."""
    parser.add_argument("--features", metavar="COL,...",
                        help=f"comma-separated feature columns (default: every column of "
                             f"numbers but {besides})")


def add_units(parser: argparse.ArgumentParser) -> None:
    """``--units``: the units of columns, stored with the fitted model."""
    parser.add_argument("--units", metavar="COL=UNIT,...",
                        help="units of feature or target columns, stored with the model and "
                             "shown by pyrogp info (e.g. co2=ppm,time=year)")


def add_seed(parser: argparse.ArgumentParser, what: str, default: int = 0) -> None:
    """``--seed``: the seed of the command's random draws, named by ``what``."""
    parser.add_argument("--seed", type=int, default=default, metavar="S",
                        help=f"seed of {what} (default: {default})")


def add_float32(parser: argparse.ArgumentParser) -> None:
    """``--float32``: fit in single precision."""
    parser.add_argument("--float32", action="store_true",
                        help="fit in single precision (half the memory; float64 by default)")


def add_predictor_arguments(parser: argparse.ArgumentParser) -> None:
    """The model path, the data file and the optional expert-combination settings."""
    parser.add_argument("modules", metavar="MODULE_OR_DIR", type=Path,
                        help="a module file, a folder of modules, or a distributed-kernel or "
                             "multitask model file")
    parser.add_argument("--data", required=True, type=Path, help="CSV (with header) or .npz")
    add_rule_arguments(parser, default=None)


def add_rows_in_fit(parser: argparse.ArgumentParser) -> None:
    """``--rows-in-fit``: a wide table's rows were in the fit (``predict``, ``evaluate``)."""
    parser.add_argument("--rows-in-fit", action="store_true",
                        help="multitask file, wide form (igp, cgp): the table's rows are rows "
                             "the model was fitted on (cells to fill in), so their observed "
                             "outputs inform the others through their shared noise alone — "
                             "exact there, far off on new rows (default: every row's observed "
                             "outputs are new observations of f and of the noise)")


#: The rule ``pyrogp combine`` takes by default: the rBCM with entropy-reduction weights, within
#: 0.01 nats of the full GP's NLPD on sunspots, diabetes and mcycle and the best of the rules on
#: banana, though not on digits (0.139 against PoE's 0.107): experts_experiments.md in
#: benchmarks/results.
DEFAULT_RULE = "rbcm"


def add_rule_arguments(parser: argparse.ArgumentParser, default: str | None) -> None:
    """``--rule`` (``default``: None routes each point to one module), ``--weights`` and
    ``--temperature`` of an expert combination."""
    rule = ("product-of-experts rule: poe, gpoe, bcm, rbcm, grbcm, barycenter or "
            "barycenter-paper")
    parser.add_argument("--rule", default=default, metavar="RULE",
                        help=f"{rule} (default: {default}, with entropy weights)" if default
                        else f"combine all modules by this {rule} instead of routing each point "
                             "to one module")
    parser.add_argument("--weights", help="expert weighting of --rule: uniform, entropy, "
                                          "softmax-var, ...")
    parser.add_argument("--temperature", type=float, help="softmax temperature of --weights")


def comma_list(text: str) -> list[str]:
    """``a,b,c`` → [a, b, c] (argparse type; an empty name is an error)."""
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"an empty column name in '{text}'")
    return names
