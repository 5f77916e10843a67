"""Multitask data: the long table (x_n, t_n, y_n), its per-task padded layout and minibatches.

Task t has N^t points (X^t, y^t) (Boustati et al., Sec. 2.2). The tasks need not share inputs
(heterotopic data), N^t may be 0 and no output is imputed: only observed pairs (n, t) enter the
ELBO (eq. 9). The data come as a list of per-task pairs [(X^t, y^t)] or in long format
(x_n, t_n, y_n); both become one :class:`TaskData`.

The models compute in a per-task layout: the rows of a batch arranged as [T, P] slots (P the
largest per-task count, padded), so that every task's processes are evaluated as one batch.
A minibatch is a :class:`TaskBatch`: the row of every slot and its weight, the factor that makes
the scaled data term unbiased (Sec. 1.7 of the spec):

- stacked: B rows drawn uniformly (with replacement) from all Σ_t N^t rows, weight Σ_t N^t / B;
- stratified: b rows drawn uniformly from every task, weight N^t / b;

and weight 0 on padding, so a task absent from a batch contributes nothing but its KL terms.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from pyrogp_models.errors import DataError

MINIBATCHES = ("stacked", "stratified")


@dataclass(frozen=True)
class TaskData:
    """Long-format multitask data: inputs X [N, D], the task t_n ∈ {0, …, T−1} of every row
    [N] (int64) and its target y [N] (a class label for classifiers)."""

    X: torch.Tensor
    task: torch.Tensor
    y: torch.Tensor
    num_tasks: int

    def __post_init__(self):
        if self.X.dim() != 2 or self.task.shape != self.X.shape[:1] \
                or self.y.shape != self.X.shape[:1]:
            raise DataError(f"expected X [N, D], task [N] and y [N]; got {tuple(self.X.shape)}, "
                            f"{tuple(self.task.shape)} and {tuple(self.y.shape)}")
        if self.num_tasks < 1:
            raise DataError("multitask data need at least one task")
        if len(self.task) and not (0 <= int(self.task.min()) and int(self.task.max())
                                   < self.num_tasks):
            raise DataError(f"task indices must lie in 0..{self.num_tasks - 1}")
        if not bool(torch.isfinite(self.X).all()):
            raise DataError("inputs contain NaN or inf")

    @classmethod
    def from_list(cls, pairs: Sequence[tuple], dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None) -> TaskData:
        """From per-task pairs [(X^t [N^t, D], y^t [N^t])]; a task may have no rows (an X^t of
        shape [N^t] is one input dimension)."""
        if not pairs:
            raise DataError("multitask data need at least one task")
        Xs = [_as_tensor(X, dtype, device) for X, _ in pairs]
        ys = [_as_tensor(y, dtype, device).reshape(-1) for _, y in pairs]
        width = max((X.shape[-1] for X in Xs if X.dim() == 2), default=1)
        Xs = [X.reshape(-1, width) for X in Xs]
        counts = torch.as_tensor([len(X) for X in Xs], device=Xs[0].device)
        task = torch.repeat_interleave(torch.arange(len(pairs), device=counts.device), counts)
        return cls(torch.cat(Xs), task, torch.cat(ys), len(pairs))

    @classmethod
    def from_long(cls, X, task, y, num_tasks: int | None = None,
                  dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None) -> TaskData:
        """From the long format: rows (x_n, t_n, y_n); T = max t + 1 unless given."""
        X = _as_tensor(X, dtype, device)
        task = torch.as_tensor(task, device=X.device).long()
        num_tasks = int(task.max()) + 1 if num_tasks is None else num_tasks
        return cls(X, task, _as_tensor(y, dtype, device).reshape(-1), num_tasks)

    @property
    def num_points(self) -> int:
        return self.X.shape[0]

    @property
    def counts(self) -> torch.Tensor:
        """N^t per task [T]."""
        return torch.bincount(self.task, minlength=self.num_tasks)

    def in_canonical_order(self) -> TaskData:
        """The same rows sorted by task, then input (lexicographically), then target: whatever a
        fit derives from the order of its rows (k-means starts, held-out regions, minibatches)
        then depends on the rows alone, not on the order they came in."""
        order = torch.arange(self.num_points, device=self.task.device)
        for key in (self.y, *reversed(self.X.unbind(-1)), self.task):  # least significant first
            order = order[torch.argsort(key[order], stable=True)]
        return TaskData(self.X[order], self.task[order], self.y[order], self.num_tasks)

    def to(self, dtype: torch.dtype | None = None,
           device: torch.device | str | None = None) -> TaskData:
        """The same data with X and y in ``dtype`` and all tensors on ``device``."""
        return TaskData(self.X.to(dtype=dtype, device=device), self.task.to(device=device),
                        self.y.to(dtype=dtype, device=device), self.num_tasks)


def as_task_data(data, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> TaskData:
    """A :class:`TaskData` from itself, from a list of (X^t, y^t) pairs or from a long-format
    triple (X, task, y)."""
    if isinstance(data, TaskData):
        return data.to(dtype, device)
    if len(data) == 3 and not isinstance(data[0], tuple | list):
        return TaskData.from_long(*data, dtype=dtype, device=device)
    return TaskData.from_list(data, dtype, device)


def _as_tensor(values, dtype, device) -> torch.Tensor:
    dtype = dtype or torch.get_default_dtype()
    if isinstance(values, torch.Tensor):
        return values.to(dtype=dtype, device=device)
    return torch.as_tensor(np.asarray(values, dtype=np.float64), dtype=dtype, device=device)


# The per-task layout ---------------------------------------------------------------------------
@dataclass(frozen=True)
class TaskLayout:
    """B rows of known tasks arranged per task: ``index`` [T, P] is the position (among the B) of
    the row in every slot (0 on padding), ``mask`` [T, P] marks real slots, and ``slot`` [B] is
    the slot of every row in its task's line."""

    index: torch.Tensor
    mask: torch.Tensor
    tasks: torch.Tensor
    slot: torch.Tensor

    @classmethod
    def of(cls, tasks: torch.Tensor, num_tasks: int) -> TaskLayout:
        """Rows in their given order within each task; P = the largest count (at least 1)."""
        counts = torch.bincount(tasks, minlength=num_tasks)
        width = max(int(counts.max()), 1)
        order = torch.argsort(tasks, stable=True)
        start = counts.cumsum(0) - counts
        slot = torch.empty_like(tasks)
        slot[order] = torch.arange(len(tasks), device=tasks.device) - start[tasks[order]]
        index = tasks.new_zeros(num_tasks, width)
        index[tasks, slot] = torch.arange(len(tasks), device=tasks.device)
        mask = torch.zeros(num_tasks, width, dtype=torch.bool, device=tasks.device)
        mask[tasks, slot] = True
        return cls(index, mask, tasks, slot)

    @property
    def counts(self) -> torch.Tensor:
        return self.mask.sum(-1)

    def gather(self, values: torch.Tensor, event_dims: int = 0) -> torch.Tensor:
        """Per-row values [..., B, *E] (``event_dims`` = len(E)) → per slot [..., T, P, *E]."""
        dim = values.dim() - event_dims - 1
        return values.index_select(dim, self.index.flatten()).unflatten(dim, self.index.shape)

    def to_long(self, values: torch.Tensor, event_dims: int = 0) -> torch.Tensor:
        """Per-slot values [..., T, P, *E] → per row [..., B, *E] (the inverse of
        :meth:`gather` on the real slots)."""
        dim = values.dim() - event_dims - 2
        flat = self.tasks * self.index.shape[1] + self.slot
        return values.flatten(dim, dim + 1).index_select(dim, flat)


@dataclass(frozen=True)
class TaskBatch:
    """The rows [T, P] of a batch in the per-task layout and their weights [T, P] (0 on padding,
    else the minibatch scaling of the row)."""

    rows: torch.Tensor
    weights: torch.Tensor
    #: Whether the batch is every bound row in the bound layout (:func:`full_batch`).
    full: bool = False


@dataclass(frozen=True)
class DistinctInputs:
    """The distinct inputs X [U, D] of a per-task layout's slots and, for every slot [T, P], the
    position of its input among them: a process shared by all tasks is evaluated once per
    distinct input where the tasks share inputs."""

    X: torch.Tensor
    index: torch.Tensor

    @classmethod
    def of(cls, X: torch.Tensor) -> DistinctInputs | None:
        """From the slots' inputs X [T, P, D]; None when there are as many distinct inputs as
        slots. Reads the count on the host (once, where data are bound)."""
        values, index = torch.unique(X.flatten(0, 1), dim=0, return_inverse=True)
        if len(values) == X.shape[0] * X.shape[1]:
            return None
        return cls(values, index.reshape(X.shape[:2]))

    def to_slots(self, values: torch.Tensor) -> torch.Tensor:
        """Values [..., U] at the distinct inputs as values [..., T·P] at the slots."""
        return values[..., self.index.flatten()]


def weighted_batch(task: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor,
                   num_tasks: int) -> TaskBatch:
    """The batch of the given rows [B] of a table whose rows have tasks ``task`` [N], with
    per-row weights [B]."""
    layout = TaskLayout.of(task[rows], num_tasks)
    return TaskBatch(rows[layout.index], layout.gather(weights) * layout.mask)


def full_batch(layout: TaskLayout, dtype: torch.dtype) -> TaskBatch:
    """All rows of a table laid out by ``layout``, each with weight 1."""
    return TaskBatch(layout.index, layout.mask.to(dtype), full=True)


def stacked_batch(task: torch.Tensor, batch_size: int, num_tasks: int,
                  dtype: torch.dtype) -> TaskBatch:
    """B rows drawn uniformly from all N rows, each with weight N/B (unbiased)."""
    num_points = len(task)
    rows = torch.randint(num_points, (batch_size,), device=task.device)
    weights = torch.full((batch_size,), num_points / batch_size, dtype=dtype, device=task.device)
    return weighted_batch(task, rows, weights, num_tasks)


def stratified_batch(layout: TaskLayout, per_task: int, dtype: torch.dtype) -> TaskBatch:
    """b rows drawn uniformly from every task's N^t rows (``layout`` of all rows), each with
    weight N^t/b (unbiased); a task without rows gets weight 0."""
    counts = layout.counts.to(dtype)
    uniform = torch.rand(layout.index.shape[0], per_task, dtype=dtype,
                         device=layout.index.device)
    slots = (uniform * counts.unsqueeze(-1)).long()
    return TaskBatch(layout.index.gather(1, slots),
                     (counts / per_task).unsqueeze(-1).expand(-1, per_task).clone())
