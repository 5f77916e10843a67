"""``pyrogp evaluate``: predictive metrics of a module, a module folder or a model file on labelled
data (per task and overall for a multitask file)."""

from __future__ import annotations

import argparse
import json
import math

from pyrogp_models.inference.commands.arguments import (
    add_predictor_arguments,
    add_rows_in_fit,
)

NAME = "evaluate"
HELP = ("score a module, a module folder or a model file on labelled data (NLPD, RMSE, "
        "accuracy, ...; per task for a multitask file)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_predictor_arguments(parser)
    add_rows_in_fit(parser)
    parser.add_argument("--target", help="the observed column (default: the modules' target; "
                                         "a multitask file's, long form)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object instead of a table")


def run(args: argparse.Namespace) -> int:
    import torch
    from pyrogp_models.inference.commands.common import predictor_from_args, read_inputs
    from pyrogp_models.inference.commands.multitask_inputs import conditions_on_rows, is_multitask

    from pyrogp_models.data import load_table, require_finite
    from pyrogp_models.errors import DataError
    from pyrogp_models.text import format_table

    if is_multitask(args.modules):
        return _evaluate_multitask(args)
    conditions_on_rows(args, None, None)  # refuses --rows-in-fit
    predictor = predictor_from_args(args)
    target = args.target or predictor.columns.target
    if target is None:
        raise DataError("the model does not record its target column; pass --target")
    table = load_table(args.data)
    y = table.column(target)
    require_finite(y, f"column '{target}'")
    _, X, labels = read_inputs(table, predictor, exclude=(target,))
    with torch.no_grad():
        mean, var = predictor.predict_y(X, labels)
        log_density = predictor.log_predictive(X, y, labels)
    report = _report(predictor.is_classifier, y, mean, var, log_density)
    if args.json:
        print(json.dumps(_json_report(report)))
    else:
        print(format_table(["metric", "value"], list(report.items())))
    return 0


def _evaluate_multitask(args: argparse.Namespace) -> int:
    """Metrics of a multitask file per task (the tasks with rows in the data) and over all
    rows; in wide form (igp, cgp), every cell's predictive given the row's other observed cells
    (as ``predict`` gives it)."""
    import numpy as np
    import torch
    from pyrogp_models.inference.commands.multitask_inputs import (
        conditions_on_rows,
        multitask_from_args,
    )

    from pyrogp_models.data import load_table
    from pyrogp_models.text import format_table

    predictor, layout = multitask_from_args(args)
    table = load_table(args.data)
    rows = layout.observations(table, args.target)
    if conditions_on_rows(args, predictor, layout):
        Y = layout.observed_outputs(table)
        row, task = np.nonzero(~np.isnan(Y))  # the observations' order
        mean, var = (value[task, row] for value in predictor.predict_given_outputs(
            layout.inputs(table), Y, args.rows_in_fit))
        log_density = torch.distributions.Normal(mean, var.sqrt()).log_prob(
            torch.as_tensor(rows.y, dtype=mean.dtype))
    else:
        with torch.no_grad():
            mean, var = predictor.predict_y(rows.X, rows.task)
            log_density = predictor.log_predictive(rows.X, rows.y, rows.task)
    mean, var, log_density = (value.double().numpy() for value in (mean, var, log_density))

    def report(where: np.ndarray) -> dict:
        return _report(predictor.is_classifier, rows.y[where], mean[where], var[where],
                       log_density[where])

    tasks = {name: report(rows.task == t) for t, name in enumerate(layout.tasks)
             if (rows.task == t).any()}
    overall = report(np.full(len(rows.y), True))
    if args.json:
        print(json.dumps({"tasks": {name: _json_report(values) for name, values in tasks.items()},
                          "overall": _json_report(overall)}))
        return 0
    keys = list(overall)
    print(format_table(["task", *keys], [(name, *(values[key] for key in keys))
                                          for name, values in {**tasks, "overall": overall}
                                          .items()]))
    missing = [name for name in layout.tasks if name not in tasks]
    if missing:
        print(f"no rows of task {', '.join(missing)} in {args.data}")
    return 0


def _report(is_classifier: bool, y, mean, var, log_density) -> dict[str, float | int]:
    from pyrogp_models.inference.metrics import classification_report, regression_report

    if is_classifier:
        return classification_report(y, mean, log_density)
    return regression_report(y, mean, var, log_density)


def _json_report(report: dict[str, float | int]) -> dict[str, float | int | None]:
    return {key: _json_number(value) for key, value in report.items()}


def _json_number(value: float | int) -> float | int | None:
    """JSON has no NaN or infinity: those become null."""
    return value if isinstance(value, int) or math.isfinite(value) else None
