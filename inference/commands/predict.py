"""``pyrogp predict``: predictions for the rows of a data file, written as CSV or .npz."""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import numpy as np
import torch

from inference.commands.common import add_predictor_arguments, predictor_from_args, read_inputs
from pyrogp_models.data import load_table
from pyrogp_models.errors import DataError
from pyrogp_models.modules.files import atomic_write

NAME = "predict"
HELP = "predict the rows of a data file with a module or a module folder"

OUTPUT_SUFFIXES = (".csv", ".npz")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_predictor_arguments(parser)
    parser.add_argument("--out", required=True, type=Path, metavar="FILE",
                        help="output file, .csv or .npz: the features, then mean and var "
                             "(regression) or prob / prob_0..prob_{C-1} (classification)")


def run(args: argparse.Namespace) -> int:
    _check_output_path(args.out)
    predictor, modules, rule = predictor_from_args(args)
    table = load_table(args.data)
    features, X, labels = read_inputs(table, modules, rule)
    with torch.no_grad():
        mean, var = predictor.predict_y(X, labels)
    columns = {name: X[:, j] for j, name in enumerate(features)}
    outputs = _output_columns(predictor.is_classifier, mean.double().numpy(),
                              var.double().numpy())
    clashes = sorted(set(columns) & set(outputs))
    if clashes:
        raise DataError(f"feature column(s) {', '.join(clashes)} clash with output column names")
    columns.update(outputs)
    atomic_write(args.out, _encode(columns, args.out.suffix.lower()))
    print(f"wrote {len(X)} predictions to {args.out}")
    return 0


def _check_output_path(path: Path) -> None:
    if path.suffix.lower() not in OUTPUT_SUFFIXES:
        raise DataError(f"{path}: unknown output extension '{path.suffix}'; use .csv or .npz")
    if not path.parent.is_dir():
        raise DataError(f"{path}: the output folder {path.parent} does not exist")
    if path.is_dir():
        raise DataError(f"{path} is a folder; --out needs a file name")


def _output_columns(is_classifier: bool, mean: np.ndarray, var: np.ndarray
                    ) -> dict[str, np.ndarray]:
    if not is_classifier:
        return {"mean": mean, "var": var}
    if mean.ndim == 1:
        return {"prob": mean}
    return {f"prob_{c}": mean[:, c] for c in range(mean.shape[1])}


def _encode(columns: dict[str, np.ndarray], suffix: str) -> bytes:
    buffer = io.BytesIO()
    if suffix == ".npz":
        np.savez(buffer, **columns)
    else:
        np.savetxt(buffer, np.column_stack(list(columns.values())), fmt="%.17g", delimiter=",",
                   header=",".join(columns), comments="")
    return buffer.getvalue()
