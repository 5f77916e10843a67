"""Helpers shared by the command modules: predictors from module paths, inputs, safe writes,
reports of module sets and warnings as one line."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from pyrogp_models.inference.health import elbo_per_point, module_flags
from pyrogp_models.inference.tables import format_table

from pyrogp_models.data import Table, require_finite
from pyrogp_models.errors import DataError, ModuleFileError, NotConvergedWarning, PyrogpError
from pyrogp_models.models.distributed_kernel.files import is_distributed_kernel_file
from pyrogp_models.modules.files import (
    INDEX_NAME,
    SUFFIX,
    load_modules_from,
    partition_rule,
    read_index,
    resolve_path,
    save_modules,
)
from pyrogp_models.modules.predictor import Predictor
from pyrogp_models.modules.record import Module
from pyrogp_models.modules.routing import as_predictor, load_predictor
from pyrogp_models.modules.signed import FORMAT_NAMES, file_format


# Reading modules ------------------------------------------------------------------------------
def add_predictor_arguments(parser: argparse.ArgumentParser) -> None:
    """The module path, the data file and the optional expert-combination settings."""
    parser.add_argument("modules", metavar="MODULE_OR_DIR", type=Path,
                        help="a module file, a folder of modules, or a distributed-kernel or "
                             "multitask model file")
    parser.add_argument("--data", required=True, type=Path, help="CSV (with header) or .npz")
    parser.add_argument("--rule", help="combine all modules by this product-of-experts rule "
                                       "instead of routing each point to one module")
    parser.add_argument("--weights", help="expert weighting for --rule")
    parser.add_argument("--temperature", type=float, help="softmax temperature for --rule")


def predictor_from_args(args: argparse.Namespace
                        ) -> tuple[Predictor, dict[str, Module], dict | None]:
    """The predictor asked for by the arguments, its modules and their partition rule.

    A distributed-kernel file is one predictor that stands in for its own module (it has the
    ``info`` and ``input_dim`` that :func:`read_inputs` reads) and has no partition rule."""
    args.modules = resolve_path(args.modules)
    if is_distributed_kernel_file(args.modules):
        if (args.rule, args.weights, args.temperature) != (None, None, None):
            raise DataError("--rule, --weights and --temperature combine modules; a "
                            "distributed-kernel file is a single model")
        predictor = load_predictor(args.modules)
        return predictor, {args.modules.name: predictor}, None
    modules = load_modules_from(args.modules)
    rule = partition_rule(args.modules)
    if args.rule is None:
        if args.weights is not None or args.temperature is not None:
            raise DataError("--weights and --temperature only apply together with --rule")
        return as_predictor(modules, rule), modules, rule
    try:
        from pyrogp_models.models.experts.predictor import ExpertCombination
    except ImportError as error:
        raise PyrogpError(f"--rule needs pyrogp_models.models.experts.predictor, which cannot be "
                          f"imported ({error})") from None
    combination = ExpertCombination(modules, args.rule, weights=args.weights,
                                    temperature=args.temperature)
    return combination, modules, rule


def read_inputs(table: Table, modules: dict[str, Module], rule: dict | None,
                exclude: tuple[str, ...] = ()
                ) -> tuple[list[str], np.ndarray, np.ndarray | None]:
    """Feature names, inputs X [N, D] and (for label-partitioned modules) the labels.

    Features are the names stored in the modules; modules without them take every column except
    ``exclude`` and the label column.
    """
    label_column = rule["column"] if rule and rule.get("kind") == "label" else None
    first = next(iter(modules.values()))
    features = first.info.get("features")
    if features is None:
        features = [name for name in table.columns if name not in {*exclude, label_column}]
    if len(features) != first.input_dim:
        raise DataError(f"the modules take {first.input_dim} inputs but {len(features)} "
                        f"feature columns were found: {', '.join(features)}")
    X = table.select(features)
    for j, name in enumerate(features):
        require_finite(X[:, j], f"column '{name}'")
    labels = None
    if label_column is not None:
        labels = table.column(label_column)
        require_finite(labels, f"column '{label_column}'")
    return features, X, labels


# Writing module folders ---------------------------------------------------------------------
def check_output_folder(folder: Path) -> None:
    """Refuse to write into anything but a new path, an empty folder or a module folder."""
    if not folder.exists():
        return
    if folder.is_dir() and (not any(folder.iterdir()) or _is_module_folder(folder)):
        return
    raise DataError(f"output {folder} exists and is not a module folder; refusing to overwrite "
                    "it (choose another --out)")


def check_output_file(path: Path, expected: str) -> None:
    """Refuse to write anything but a new file in an existing folder or a file of the format
    ``expected`` (:data:`~pyrogp_models.modules.signed.FORMAT_NAMES`) to replace."""
    if not path.parent.is_dir():
        raise DataError(f"{path}: the output folder {path.parent} does not exist")
    if path.is_dir():
        raise DataError(f"{path} is a folder; --out needs a file name")
    if path.exists() and file_format(path) != expected:
        raise DataError(f"output {path} exists and is not {FORMAT_NAMES[expected]}; refusing to "
                        "overwrite it (choose another --out)")


def _is_module_folder(folder: Path) -> bool:
    try:
        read_index(folder)
    except ModuleFileError:
        return False
    return True


def write_module_folder(modules: dict[str, Module], folder: Path, rule: dict) -> None:
    """Save modules into ``folder`` so that it never holds a half-written set.

    Everything is first written to a hidden sibling folder. A new folder is then renamed into
    place; an existing module folder receives the new files by rename, its index last, and loses
    the module files only its old index named.
    """
    check_output_folder(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = folder.parent / f".{folder.name}.tmp-{os.getpid()}"
    try:
        save_modules(modules, staging, rule)
        if not folder.exists():
            staging.rename(folder)
            return
        old_files = set(read_index(folder)["modules"].values()) if _is_module_folder(folder) \
            else set()
        new_files = {path.name for path in staging.iterdir() if path.name != INDEX_NAME}
        for name in new_files:
            os.replace(staging / name, folder / name)
        os.replace(staging / INDEX_NAME, folder / INDEX_NAME)
        for name in old_files - new_files:
            if Path(name).name == name and name.endswith(SUFFIX):
                (folder / name).unlink(missing_ok=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def describe_rule(rule: dict | None) -> str:
    """One phrase naming a partition rule, e.g. ``contiguous along input 0, 4 partitions``."""
    if not rule:
        return "none"
    kind, count = rule["kind"], rule["num_partitions"]
    detail = {"contiguous": f" along input {rule.get('dim')}",
              "label": f" by column '{rule.get('column')}'"}.get(kind, "")
    return f"{kind}{detail}, {count} partition{'s' if count != 1 else ''}"


# Reports ---------------------------------------------------------------------------------------
#: Module sets up to this size are printed row by row; larger ones as a summary.
MAX_ROWS = 20


def report_modules(modules: dict[str, Module], columns: dict, verbose: bool = False) -> str:
    """A table of the modules (``columns``: header → function of a module), with a "flags"
    column naming outliers and unconverged fits (:mod:`pyrogp_models.inference.health`); beyond
    :data:`MAX_ROWS` modules (unless ``verbose``) a summary instead: the count, quantiles of the
    ELBO per point, the five worst modules and the flagged ones."""
    flags = module_flags(modules)
    if verbose or len(modules) <= MAX_ROWS:
        rows = [(name, *(value(module) for value in columns.values()),
                 ", ".join(flags.get(name, [])) or "-") for name, module in modules.items()]
        return format_table(["module", *columns, "flags"], rows)
    per_point = elbo_per_point(modules)
    quantiles = np.quantile(per_point, [0.0, 0.05, 0.5, 0.95, 1.0])
    names = list(modules)
    worst = [f"{names[k]} ({per_point[k]:.3g})" for k in np.argsort(per_point)[:5]]
    lines = [f"{len(modules)} modules; ELBO per point: min {quantiles[0]:.4g}, 5% "
             f"{quantiles[1]:.4g}, median {quantiles[2]:.4g}, 95% {quantiles[3]:.4g}, max "
             f"{quantiles[4]:.4g}", f"lowest ELBO per point: {', '.join(worst)}"]
    for flag in ("outlier", "not converged"):
        flagged = [name for name, found in flags.items() if flag in found]
        if flagged:
            shown = ", ".join(flagged[:10]) + (" and more" if len(flagged) > 10 else "")
            lines.append(f"{len(flagged)} {'outliers' if flag == 'outlier' else flag}: {shown}")
    lines.append("(--verbose lists every module)")
    return "\n".join(lines)


@contextlib.contextmanager
def one_line_warnings(advice: str) -> Iterator[None]:
    """Print a fit's :class:`NotConvergedWarning` as one ``pyrogp: warning:`` line ending in
    ``advice`` (e.g. the flag that allows more steps); other warnings pass through."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", NotConvergedWarning)
        yield
    for warning in caught:
        if issubclass(warning.category, NotConvergedWarning):
            message = str(warning.message).removesuffix("; allow more steps")
            print(f"pyrogp: warning: {message}; {advice}", file=sys.stderr)
        else:
            warnings.warn_explicit(warning.message, warning.category, warning.filename,
                                   warning.lineno)
