"""Where a multitask model starts: per-task inducing inputs and the fixed linear inner mean.

- Inducing inputs: k-means centres (or a grid) of every task's inputs, M per task; a task with
  fewer than M rows takes them from all tasks' inputs. A shared process has M of its own, the
  centres of all tasks' inputs (not the M·T stacked sets of dgplib: the same budget as every
  other process, a cost linear in the number of tasks); the top layer's inducing inputs are the
  task's pushed through the inner layer's linear mean (spec Sec. 4.1, item 2).
- A single-layer model (iGP, cGP) whose inducing inputs are every input its GPs see — M at least
  the distinct inputs, where k-means puts a centre on each — is the exact GP on them (Titsias'
  bound is tight at Z = X): :meth:`Initialisation.covers` tells, and the inducing inputs then
  stay where they are (moving them cannot raise the bound, and L-BFGS converges in far fewer
  steps without them).
- Fixed linear mean of an inner process with W outputs (Salimbeni & Deisenroth 2017; dgplib):
  identity, zero-padded, when D_in ≤ W; otherwise the top-W principal directions of the inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pyrogp_models.data.inducing import init_inducing
from pyrogp_models.models.multitask.data import TaskData, TaskLayout

#: Rounding units (of the dtype, times 1 + |x|) within which an input counts as an inducing
#: input: a k-means centre on duplicated inputs is their mean.
COVER_ULPS = 64


@dataclass
class Initialisation:
    """Per-task inducing inputs Z^t [T, M, D] and those of a shared process [M, D] (model
    units), the principal directions of the inputs [D, D] (columns by decreasing variance) and
    the random source of the mixing coefficients of coregionalised models."""

    inducing: torch.Tensor
    shared_inducing: torch.Tensor
    directions: torch.Tensor
    generator: torch.Generator

    @classmethod
    def from_data(cls, data: TaskData, num_inducing: int, method: str = "kmeans",
                  generator: torch.Generator | None = None) -> Initialisation:
        """``num_inducing`` inducing inputs per task by ``method`` and the principal directions
        [D, D] of all tasks' inputs (for the fixed linear means)."""
        generator = generator or torch.Generator(device=data.X.device).manual_seed(0)
        inducing = task_inducing(data, num_inducing, method, generator)
        shared = init_inducing(data.X, num_inducing, None, method, generator)
        centred = data.X - data.X.mean(0)
        directions = torch.linalg.svd(centred, full_matrices=True).Vh.mT
        return cls(inducing, shared, directions, generator)

    @classmethod
    def blank(cls, num_tasks: int, num_inducing: int, input_dim: int,
              dtype: torch.dtype | None = None,
              device: torch.device | str | None = None) -> Initialisation:
        """Placeholders of the right shapes, for a model whose state is loaded next."""
        inducing = torch.zeros(num_tasks, num_inducing, input_dim, dtype=dtype, device=device)
        return cls(inducing, inducing[0].clone(), torch.eye(input_dim, dtype=dtype, device=device),
                   torch.Generator(device=device).manual_seed(0))

    @property
    def num_tasks(self) -> int:
        return self.inducing.shape[0]

    @property
    def input_dim(self) -> int:
        return self.inducing.shape[-1]

    def covers(self, data: TaskData, per_task: bool) -> bool:
        """Whether every input is one of the inducing inputs of the GP that sees it: task t's
        (Z^t, ``per_task``) or the shared set's (every task's inputs), up to rounding
        (:data:`COVER_ULPS`)."""
        exact = "donot_use_mm_for_euclid_dist"     # no |x|² − 2x·z + |z|² cancellation
        if per_task:
            layout = TaskLayout.of(data.task, data.num_tasks)
            points, inducing, real = layout.gather(data.X, 1), self.inducing, layout.mask
        else:
            points, inducing, real = data.X, self.shared_inducing, None
        nearest = torch.cdist(points, inducing, compute_mode=exact).amin(-1)
        rounding = COVER_ULPS * torch.finfo(points.dtype).eps * (1 + points.abs().amax(-1))
        covered = nearest <= rounding
        return bool(covered.all() if real is None else (covered | ~real).all())

    def mean_weights(self, width: int) -> torch.Tensor:
        """The fixed linear mean x ↦ xW of an inner process with ``width`` outputs: W [D, width]."""
        if width >= self.input_dim:
            return torch.eye(self.input_dim, width, dtype=self.directions.dtype,
                             device=self.directions.device)
        return self.directions[:, :width].clone()

    def normal(self, *shape: int, scale: float = 1.0) -> torch.Tensor:
        """Seeded N(0, scale²) draws (initial mixing coefficients)."""
        return scale * torch.randn(shape, generator=self.generator, dtype=self.inducing.dtype,
                                   device=self.inducing.device)


def task_inducing(data: TaskData, num_inducing: int, method: str = "kmeans",
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """M inducing inputs per task [T, M, D]: centres of the task's inputs, or of all inputs for
    a task with fewer than M rows."""
    layout = TaskLayout.of(data.task, data.num_tasks)
    own = layout.gather(data.X, 1)                                      # [T, P, D]
    enough = layout.counts >= num_inducing
    if bool(enough.all()):
        return init_inducing(own, num_inducing, layout.mask, method, generator)
    padding = data.num_points - own.shape[1]
    own = torch.nn.functional.pad(own, (0, 0, 0, padding))
    own_mask = torch.nn.functional.pad(layout.mask, (0, padding))
    candidates = torch.where(enough[:, None, None], own, data.X)
    mask = torch.where(enough[:, None], own_mask, True)
    return init_inducing(candidates, num_inducing, mask, method, generator)
