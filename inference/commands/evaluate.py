"""``pyrogp evaluate``: predictive metrics of a module or module folder on labelled data."""

from __future__ import annotations

import argparse
import json
import math

import torch

from inference.commands.common import add_predictor_arguments, predictor_from_args, read_inputs
from inference.metrics import classification_report, regression_report
from inference.tables import format_table
from pyrogp_models.data import load_table, require_finite
from pyrogp_models.errors import DataError

NAME = "evaluate"
HELP = "score a module or module folder on labelled data (NLPD, RMSE, accuracy, ...)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_predictor_arguments(parser)
    parser.add_argument("--target", help="the observed column (default: the modules' target)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object instead of a table")


def run(args: argparse.Namespace) -> int:
    predictor, modules, rule = predictor_from_args(args)
    target = args.target or next(iter(modules.values())).info.get("target")
    if target is None:
        raise DataError("the modules do not record their target column; pass --target")
    table = load_table(args.data)
    y = table.column(target)
    require_finite(y, f"column '{target}'")
    _, X, labels = read_inputs(table, modules, rule, exclude=(target,))
    with torch.no_grad():
        mean, var = predictor.predict_y(X, labels)
        log_density = predictor.log_predictive(X, y, labels)
    if predictor.is_classifier:
        report = classification_report(y, mean, log_density)
    else:
        report = regression_report(y, mean, var, log_density)
    if args.json:
        print(json.dumps({key: _json_number(value) for key, value in report.items()}))
    else:
        print(format_table(["metric", "value"], list(report.items())))
    return 0


def _json_number(value: float | int) -> float | int | None:
    """JSON has no NaN or infinity: those become null."""
    return value if isinstance(value, int) or math.isfinite(value) else None
