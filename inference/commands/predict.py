"""``pyrogp predict``: predictions for the rows of a data file, written as CSV or .npz."""

from __future__ import annotations

import argparse
import csv
import io
from pathlib import Path
from typing import TYPE_CHECKING

from pyrogp_models.inference.commands.arguments import (
    add_predictor_arguments,
    add_rows_in_fit,
)

if TYPE_CHECKING:
    import numpy as np

NAME = "predict"
HELP = "predict the rows of a data file with a module, a module folder or a model file"

OUTPUT_SUFFIXES = (".csv", ".npz")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_predictor_arguments(parser)
    add_rows_in_fit(parser)
    add_out(parser)


def add_out(parser: argparse.ArgumentParser, metavar: str = "FILE") -> None:
    """``--out``: the predictions file."""
    parser.add_argument("--out", required=True, type=Path, metavar=metavar,
                        help="output file, .csv or .npz: the features (and a multitask file's "
                             "task column), then mean and var (regression) or prob / "
                             "prob_0..prob_{C-1} (classification); a wide-form multitask file "
                             "gives these per task, e.g. mean_<task>")


def run(args: argparse.Namespace) -> int:
    from pyrogp_models.inference.commands.common import PREDICTIONS, check_output
    from pyrogp_models.inference.commands.multitask_inputs import conditions_on_rows, is_multitask

    from pyrogp_models.errors import DataError
    from pyrogp_models.modules.signed import atomic_write

    if args.out.suffix.lower() not in OUTPUT_SUFFIXES:
        raise DataError(f"{args.out}: unknown output extension '{args.out.suffix}'; use .csv or "
                        ".npz")
    check_output(args.out, PREDICTIONS)
    if is_multitask(args.modules):
        columns, outputs = _multitask_predictions(args)
    else:
        conditions_on_rows(args, None, None)  # refuses --rows-in-fit
        columns, outputs = _module_predictions(args)
    clashes = sorted(set(columns) & set(outputs))
    if clashes:
        raise DataError(f"feature column(s) {', '.join(clashes)} clash with output column names")
    columns.update(outputs)
    atomic_write(args.out, _encode(columns, args.out.suffix.lower()))
    print(f"wrote {len(next(iter(columns.values())))} predictions to {args.out}")
    return 0


def _module_predictions(args: argparse.Namespace
                        ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The input columns and the predictions of a module, module folder or distributed-kernel
    file."""
    import torch
    from pyrogp_models.inference.commands.common import predictor_from_args, read_inputs

    from pyrogp_models.data import load_table

    predictor = predictor_from_args(args)
    features, X, labels = read_inputs(load_table(args.data), predictor)
    with torch.no_grad():
        mean, var = predictor.predict_y(X, labels)
    columns = {name: X[:, j] for j, name in enumerate(features)}
    return columns, output_columns(predictor.is_classifier, mean.double().numpy(),
                                   var.double().numpy())


def _multitask_predictions(args: argparse.Namespace
                           ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The input columns and the predictions of a multitask file: long form, each row for its
    own task; wide form, every row for every task (columns ``mean_<task>``, ``var_<task>``,
    ``prob_<task>``, ...) — for igp and cgp each given the row's other observed outputs (the
    table's target columns, where present)."""
    import numpy as np
    import torch
    from pyrogp_models.inference.commands.multitask_inputs import (
        conditions_on_rows,
        multitask_from_args,
    )

    from pyrogp_models.data import load_table

    predictor, layout = multitask_from_args(args)
    table = load_table(args.data)
    X = layout.inputs(table)
    columns = {name: X[:, j] for j, name in enumerate(layout.features)}
    given_outputs = conditions_on_rows(args, predictor, layout)
    if layout.is_long:
        names = table.labels(layout.task_column)  # a text column's task names, as written
        columns[layout.task_column] = (table.column(layout.task_column) if names is None
                                       else np.asarray(names))
        with torch.no_grad():
            mean, var = (value.double().numpy()
                         for value in predictor.predict_y(X, layout.row_tasks(table)))
        return columns, output_columns(predictor.is_classifier, mean, var)
    if given_outputs:
        mean, var = (value.double().numpy() for value in predictor.predict_given_outputs(
            X, layout.observed_outputs(table), args.rows_in_fit))
    else:
        tasks = np.repeat(np.arange(len(layout.tasks)), len(X))
        with torch.no_grad():
            mean, var = (np.split(value.double().numpy(), len(layout.tasks)) for value in
                         predictor.predict_y(np.tile(X, (len(layout.tasks), 1)), tasks))
    per_task = zip(layout.tasks, mean, var, strict=True)
    return columns, {f"{key}_{name}": values for name, task_mean, task_var in per_task
                     for key, values in output_columns(predictor.is_classifier, task_mean,
                                                       task_var).items()}


def output_columns(is_classifier: bool, mean: np.ndarray, var: np.ndarray
                   ) -> dict[str, np.ndarray]:
    """The prediction columns: mean and var, or the class probabilities."""
    if not is_classifier:
        return {"mean": mean, "var": var}
    if mean.ndim == 1:
        return {"prob": mean}
    return {f"prob_{c}": mean[:, c] for c in range(mean.shape[1])}


def _encode(columns: dict[str, np.ndarray], suffix: str) -> bytes:
    import numpy as np

    buffer = io.BytesIO()
    if suffix == ".npz":
        np.savez(buffer, **columns)
    elif all(values.dtype.kind in "biuf" for values in columns.values()):
        np.savetxt(buffer, np.column_stack(list(columns.values())), fmt="%.17g", delimiter=",",
                   header=",".join(columns), comments="")
    else:  # a text column (long-form task names): quoted where a name needs it
        text = io.StringIO()
        writer = csv.writer(text, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows(zip(*([f"{value:.17g}" for value in values.tolist()]
                               if values.dtype.kind in "biuf" else values.tolist()
                               for values in columns.values()), strict=True))
        buffer.write(text.getvalue().encode())
    return buffer.getvalue()
