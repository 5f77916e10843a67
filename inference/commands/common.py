"""Helpers shared by the command modules: predictors from module paths, inputs, safe writes."""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

import numpy as np

from pyrogp_models.data import Table, require_finite
from pyrogp_models.errors import DataError, ModuleFileError, PyrogpError
from pyrogp_models.models.distributed_kernel.files import is_distributed_kernel_file
from pyrogp_models.modules.files import (
    INDEX_NAME,
    SUFFIX,
    load_modules_from,
    read_index,
    save_modules,
)
from pyrogp_models.modules.record import Module
from pyrogp_models.modules.routing import Predictor, as_predictor, load_predictor


# Reading modules ------------------------------------------------------------------------------
def add_predictor_arguments(parser: argparse.ArgumentParser) -> None:
    """The module path, the data file and the optional expert-combination settings."""
    parser.add_argument("modules", metavar="MODULE_OR_DIR", type=Path,
                        help="a module file or a folder of modules")
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
    if is_distributed_kernel_file(args.modules):
        if (args.rule, args.weights, args.temperature) != (None, None, None):
            raise DataError("--rule, --weights and --temperature combine modules; a "
                            "distributed-kernel file is a single model")
        predictor = load_predictor(args.modules)
        return predictor, {args.modules.name: predictor}, None
    modules = load_modules_from(args.modules)
    rule = read_index(args.modules).get("partition") if args.modules.is_dir() else None
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
