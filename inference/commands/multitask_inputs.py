"""What the multitask commands read: a multitask file and a table of several tasks.

Two table layouts (Boustati et al. Sec. 2.2: tasks need not share inputs):

- long form: a task column and one target column, one row per observation (x_n, t_n, y_n); the
  tasks are the task column's distinct values, named by them (``ozone``, ``3``, ``0.5``);
- wide form: one target column per task, named by it; a missing cell (empty, ``NA``, ``nan``
  in a CSV) is an output not observed, so a row may carry any subset of the tasks' labels.

Features are numeric columns that must be finite; :class:`TaskColumns` records the layout in a
fitted file's ``info`` so that ``predict`` and ``evaluate`` read new tables the same way.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np
from pyrogp_models.inference.commands.common import default_features

from pyrogp_models import io
from pyrogp_models.data import Table, require_finite
from pyrogp_models.data.tables import is_missing
from pyrogp_models.errors import DataError
from pyrogp_models.models.multitask import MultitaskPredictor
from pyrogp_models.models.multitask.files import MULTITASK_FILE

#: What a file's ``info`` must hold for the commands to read a table for it.
LAYOUT_KEYS = ("features", "targets", "task_column", "tasks")


@dataclass(frozen=True)
class TaskRows:
    """Observations in long form: inputs X [N, D], task indices [N] (int64), targets y [N]."""

    X: np.ndarray
    task: np.ndarray
    y: np.ndarray


@dataclass(frozen=True)
class TaskColumns:
    """The columns of a multitask table: features, the target column(s), the task column (None in
    wide form) and the task names, in task order."""

    features: list[str]
    targets: list[str]
    task_column: str | None
    tasks: list[str]

    @classmethod
    def of_table(cls, table: Table, targets: list[str], task_column: str | None,
                 features: list[str] | None) -> TaskColumns:
        """The layout the fit's arguments describe, its tasks found in ``table``."""
        if task_column is None and len(targets) < 2:
            raise DataError("give --task-column with one --target column (long form), or one "
                            "--target column per task (wide form)")
        if task_column is not None and len(targets) != 1:
            raise DataError(f"--task-column '{task_column}' takes one --target column (long "
                            f"form), got {len(targets)}; without it each target is a task")
        layout = [*targets, *([task_column] if task_column else [])]
        if len(set(layout)) != len(layout):
            raise DataError(f"--target and --task-column name a column twice: {' '.join(layout)}")
        for name in targets:
            table.column(name)
        if task_column is not None:
            table.labels(task_column)  # present: numbers or names
        if features is None:
            features = default_features(table, set(layout))
        elif set(features) & set(layout):
            raise DataError(f"column(s) {', '.join(sorted(set(features) & set(layout)))} are "
                            "both features and target or task column")
        if not features:
            raise DataError("no feature columns left besides the target and task columns")
        if task_column is None:
            return cls(features, targets, None, targets)
        names = set(task_labels(table, task_column).tolist())  # numbers in ascending order
        numeric = table.labels(task_column) is None
        return cls(features, targets, task_column, sorted(names, key=float if numeric else None))

    @classmethod
    def from_info(cls, info: dict, source: object) -> TaskColumns:
        """The layout recorded by :meth:`to_info` in the file ``source``."""
        missing = [key for key in LAYOUT_KEYS if key not in info]
        if missing:
            raise DataError(f"{source} does not record its table layout ({', '.join(missing)}); "
                            "files written by fit-multitask do")
        return cls(*(info[key] for key in LAYOUT_KEYS))

    def to_info(self) -> dict:
        return {key: getattr(self, key) for key in LAYOUT_KEYS}

    @property
    def is_long(self) -> bool:
        return self.task_column is not None

    def inputs(self, table: Table) -> np.ndarray:
        """The feature columns X [N, D], checked to be finite."""
        X = table.select(self.features)
        for j, name in enumerate(self.features):
            require_finite(X[:, j], f"column '{name}'")
        return X

    def row_tasks(self, table: Table) -> np.ndarray:
        """Long form: the task index of every row [N]; a value that is not a task is an
        error."""
        values, inverse = np.unique(task_labels(table, self.task_column), return_inverse=True)
        index = {name: t for t, name in enumerate(self.tasks)}
        unknown = [name for name in values.tolist() if name not in index]
        if unknown:
            raise DataError(f"task column '{self.task_column}' holds {', '.join(unknown[:5])}, "
                            f"which {'is' if len(unknown) == 1 else 'are'} not among the "
                            f"tasks {', '.join(self.tasks)}")
        return np.asarray([index[name] for name in values.tolist()], dtype=np.int64)[inverse]

    def observed_outputs(self, table: Table) -> np.ndarray:
        """Wide form: every task's column [N, T] where the table has it, NaN where a cell or the
        whole column is missing (a table to predict need not hold the targets)."""
        Y = np.full((table.num_rows, len(self.targets)), np.nan)
        for j, name in enumerate(self.targets):
            if name in table.columns:
                Y[:, j] = table.column(name)
                require_finite(np.where(np.isnan(Y[:, j]), 0.0, Y[:, j]), f"column '{name}'")
        return Y

    def observations(self, table: Table, target: str | None = None) -> TaskRows:
        """Every observed (x, task, y) in long form. ``target`` replaces the long form's target
        column."""
        X = self.inputs(table)
        if self.is_long:
            name = target or self.targets[0]
            y = table.column(name)
            require_finite(y, f"column '{name}'")
            return TaskRows(X, self.row_tasks(table), y.copy())
        if target is not None:
            raise DataError("a wide-form model reads one target column per task; --target "
                            "applies to the long form")
        Y = table.select(self.targets)
        for j, name in enumerate(self.targets):
            require_finite(np.where(np.isnan(Y[:, j]), 0.0, Y[:, j]), f"column '{name}'")
        rows, task = np.nonzero(~np.isnan(Y))
        return TaskRows(X[rows], task, Y[rows, task])


def conditions_on_rows(args: argparse.Namespace, predictor: MultitaskPredictor | None,
                       layout: TaskColumns | None) -> bool:
    """Whether every output of a wide table is predicted given its row's other observed outputs
    (:meth:`~pyrogp_models.models.multitask.MultitaskPredictor.predict_given_outputs`): for a
    single-layer model with a Gaussian likelihood; ``--rows-in-fit`` anywhere else is an
    error."""
    model = None if predictor is None else predictor.model
    fits = (layout is not None and not layout.is_long and not model.is_deep
            and model.likelihood.name == "gaussian")
    if args.rows_in_fit and not fits:
        raise DataError("--rows-in-fit applies to wide-form multitask files of igp or cgp with "
                        "the gaussian likelihood")
    return fits


def task_name(value: float) -> str:
    """The name of a task-column value: ``3`` for a whole number, else the shortest repr."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def task_labels(table: Table, column: str) -> np.ndarray:
    """The task name of every row [N] (str): a text column's cells as written, a numeric
    column's values by :func:`task_name`; an empty or missing cell is an error."""
    labels = table.labels(column)
    if labels is None:
        values = table.column(column)
        require_finite(values, f"task column '{column}'")
        return np.asarray([task_name(value) for value in values])
    missing = [row for row, label in enumerate(labels, start=1) if is_missing(label)]
    if missing:
        raise DataError(f"task column '{column}' has no task name at row {missing[0]}")
    return np.asarray(labels)


def is_multitask(path) -> bool:
    """Whether ``path`` (as typed) is a multitask file."""
    return io.format_of(path).name == MULTITASK_FILE.name


def multitask_from_args(args: argparse.Namespace) -> tuple[MultitaskPredictor, TaskColumns]:
    """The multitask file of a ``predict`` or ``evaluate`` command and its table layout."""
    if (args.rule, args.weights, args.temperature) != (None, None, None):
        raise DataError("--rule, --weights and --temperature combine modules; a multitask file "
                        "is a single model")
    predictor = io.load(args.modules)
    return predictor, TaskColumns.from_info(predictor.info, args.modules)
