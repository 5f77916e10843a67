"""What the commands share when they run: the output check, predictors and inputs from the
arguments, the columns of a data table, safe writes of module folders and warnings as one line.

Imported by the commands' ``run`` only (it imports the library), never when the parser is built.
"""

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

from pyrogp_models import io
from pyrogp_models.data import Table, require_finite
from pyrogp_models.data.columns import Columns
from pyrogp_models.errors import (
    CandidateDroppedWarning,
    ConstantFitWarning,
    DataError,
    ModuleFileError,
    NotConvergedWarning,
    PyrogpError,
    RoundingWarning,
    UnroutableModulesError,
)
from pyrogp_models.io.formats import MODULE_FOLDER
from pyrogp_models.modules.files import INDEX_NAME, SUFFIX, read_index, save_modules
from pyrogp_models.modules.predictor import Predictor
from pyrogp_models.modules.record import Module
from pyrogp_models.modules.routing import RoutedModules
from pyrogp_models.modules.signed import file_format

#: The output of ``predict``: a table of predictions, any existing file of that name replaced.
PREDICTIONS = "predictions"
LINKED_LIKELIHOODS = ("bernoulli", "categorical")


# The output, checked before any work ------------------------------------------------------------
def check_output(path: Path, kind: str) -> None:
    """Refuse, before anything is fitted, an ``--out`` that cannot or must not be written: its
    folder must exist, a file output must not be a folder, and what it would replace must be of
    its own kind — an empty folder or a module folder for a module folder (``kind``
    :data:`~pyrogp_models.io.formats.MODULE_FOLDER`), a file of the same format for a model
    file (``kind`` a format name), any file for :data:`PREDICTIONS`."""
    if not path.parent.is_dir():
        raise DataError(f"{path}: the output folder {path.parent} does not exist")
    if kind == MODULE_FOLDER:
        if path.exists() and not (path.is_dir() and (not any(path.iterdir())
                                                     or _is_module_folder(path))):
            raise DataError(f"output {path} exists and is not a module folder; refusing to "
                            "overwrite it (choose another --out)")
        return
    if path.is_dir():
        raise DataError(f"{path} is a folder; --out needs a file name")
    if kind != PREDICTIONS and path.exists() and file_format(path) != kind:
        raise DataError(f"output {path} exists and is not {io.FORMATS[kind].noun}; refusing to "
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
    check_output(folder, MODULE_FOLDER)
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


# Reading models and inputs --------------------------------------------------------------------
def predictor_from_args(args: argparse.Namespace) -> Predictor:
    """The predictor the arguments ask for: the file's own (:func:`pyrogp_models.io.
    load_predictor`), or with ``--rule`` the file's modules combined by that rule."""
    if args.rule is None:
        if args.weights is not None or args.temperature is not None:
            raise DataError("--weights and --temperature only apply together with --rule")
        try:
            return io.load_predictor(args.modules)
        except UnroutableModulesError as error:
            raise DataError(f"{error.reason}; combine them with --rule RULE (products of "
                            "experts) instead") from None
    fmt = io.format_of(args.modules)
    if not fmt.holds_modules:
        raise DataError(f"--rule, --weights and --temperature combine modules; "
                        f"{fmt.noun} is a single model")
    try:
        from pyrogp_models.models.experts.predictor import ExpertCombination
    except ImportError as error:
        raise PyrogpError(f"--rule needs pyrogp_models.models.experts.predictor, which cannot be "
                          f"imported ({error})") from None
    return ExpertCombination(io.load_modules(args.modules).modules, args.rule,
                             weights=args.weights, temperature=args.temperature)


def read_inputs(table: Table, predictor: Predictor, exclude: tuple[str, ...] = ()
                ) -> tuple[list[str], np.ndarray, np.ndarray | None]:
    """Feature names, inputs X [N, D] and (for modules routed by a label column) the labels.

    Features are the names the model records; a model without them takes every column except
    ``exclude`` and the label column.
    """
    rule = predictor.rule if isinstance(predictor, RoutedModules) else None
    label_column = rule["column"] if rule and rule.get("kind") == "label" else None
    features = predictor.columns.features
    if features is None:
        features = [name for name in table.columns if name not in {*exclude, label_column}]
    if len(features) != predictor.input_dim:
        raise DataError(f"the model takes {predictor.input_dim} inputs but {len(features)} "
                        f"feature columns were found: {', '.join(features)}")
    X = table.select(list(features))
    for j, name in enumerate(features):
        require_finite(X[:, j], f"column '{name}'")
    labels = None
    if label_column is not None:
        labels = table.column(label_column)
        require_finite(labels, f"column '{label_column}'")
    return list(features), X, labels


# Columns of a data table ----------------------------------------------------------------------
def feature_columns(table: Table, targets: list[str], listed: str | None,
                    others: tuple[str, ...] = ()) -> list[str]:
    """The ``--features`` named (comma-separated), or every column of ``table`` that holds
    numbers but the target column(s) and ``others`` (a partition or task column): a text column
    (dates, names) is no input unless named."""
    for name in targets:
        table.column(name)
    if listed is None:
        return default_features(table, {*targets, *others})
    return column_list(listed, "--features")


def default_features(table: Table, taken: set[str]) -> list[str]:
    """Every column of ``table`` not in ``taken`` that holds numbers; none is an error."""
    features = [name for name in table.columns if name not in taken and name not in table.text]
    if not features:
        text = sorted(set(table.text) - taken)
        raise DataError("no feature columns left besides the target" +
                        (f" but text columns ({', '.join(text)}): name inputs with --features"
                         if text else ""))
    return features


def column_list(text: str, flag: str) -> list[str]:
    """Comma-separated column names of ``flag``."""
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise DataError(f"{flag} has an empty column name: '{text}'")
    return names


def data_columns(features: list[str], target: str | None, units: str | None) -> Columns:
    """The columns a fit records, with the ``--units`` given (``COL=UNIT,...``)."""
    named: dict[str, str] = {}
    for item in column_list(units, "--units") if units else []:
        column, equals, unit = item.partition("=")
        if not equals or not column.strip() or not unit.strip():
            raise DataError(f"--units takes COL=UNIT pairs, got '{item}'")
        if column.strip() not in {*features, target}:
            raise DataError(f"--units names '{column.strip()}', which is neither a feature nor "
                            "the target")
        named[column.strip()] = unit.strip()
    return Columns(features, target, named)


def likelihood_options(args: argparse.Namespace, y: np.ndarray) -> dict:
    """The options of ``--likelihood``: ``--link``, and ``--classes`` (default: the largest
    label + 1) for categorical."""
    if args.link is not None and args.likelihood not in LINKED_LIKELIHOODS:
        raise DataError(f"--link applies to {' and '.join(LINKED_LIKELIHOODS)} likelihoods, "
                        f"not {args.likelihood}")
    if args.classes is not None and args.likelihood != "categorical":
        raise DataError("--classes applies to the categorical likelihood only")
    options = {} if args.link is None else {"link": args.link}
    if args.likelihood == "categorical":
        options["num_classes"] = args.classes or max(2, int(y.max()) + 1)
    return options


# Warnings -------------------------------------------------------------------------------------
#: Warnings printed as they are, one line each.
ONE_LINE_WARNINGS = (CandidateDroppedWarning, ConstantFitWarning, RoundingWarning)


@contextlib.contextmanager
def one_line_warnings(advice: str) -> Iterator[None]:
    """Print a fit's :class:`NotConvergedWarning` as one ``pyrogp: warning:`` line ending in
    ``advice`` (e.g. the flag that allows more steps), and a :class:`CandidateDroppedWarning`
    , :class:`ConstantFitWarning` or :class:`RoundingWarning` as one such line; other warnings
    pass through."""
    with warnings.catch_warnings(record=True) as caught:
        for category in (NotConvergedWarning, *ONE_LINE_WARNINGS):
            warnings.simplefilter("always", category)
        yield
    for warning in caught:
        if issubclass(warning.category, NotConvergedWarning):
            message = str(warning.message).removesuffix("; allow more steps")
            print(f"pyrogp: warning: {message}; {advice}", file=sys.stderr)
        elif issubclass(warning.category, ONE_LINE_WARNINGS):
            print(f"pyrogp: warning: {warning.message}", file=sys.stderr)
        else:
            warnings.warn_explicit(warning.message, warning.category, warning.filename,
                                   warning.lineno)
