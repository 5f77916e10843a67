"""Multitask standardisation: inputs with the statistics of all tasks, targets per task.

Every task's inputs feed the shared processes, so all inputs share one affine map. Targets of a
location–scale likelihood (Gaussian) are standardised per task (each SARCOS torque has its own
scale): ỹ_n = (y_n − μ_{t_n}) / s_{t_n}; densities in data units are divided by s_{t_n}.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pyrogp_models.data import Standardisation
from pyrogp_models.models.multitask.data import TaskData


@dataclass(frozen=True, eq=False)
class TaskStandardisation(Standardisation):
    """:class:`Standardisation` of the inputs (its ``y_mean`` = 0, ``y_scale`` = 1) with one
    target mean and scale per task [T] (0 and 1 when targets are not standardised)."""

    task_y_mean: np.ndarray
    task_y_scale: np.ndarray

    @classmethod
    def from_data(cls, data: TaskData, standardise_y: bool = True) -> TaskStandardisation:
        """Input means and standard deviations over all rows; per-task target means and
        standard deviations (0 and 1 for a task without rows, scale 1 for a constant task)."""
        inputs = Standardisation.fit(data.X.detach().cpu().numpy(), standardise_y=False)
        num_tasks = data.num_tasks
        mean, scale = np.zeros(num_tasks), np.ones(num_tasks)
        if standardise_y:
            task = data.task.cpu().numpy()
            y = data.y.detach().cpu().numpy().astype(np.float64)
            counts = np.bincount(task, minlength=num_tasks)
            seen = counts > 0
            mean[seen] = np.bincount(task, y, num_tasks)[seen] / counts[seen]
            spread = np.bincount(task, (y - mean[task]) ** 2, num_tasks)
            scale[seen] = np.sqrt(spread[seen] / counts[seen])
            scale[scale == 0] = 1.0
        return cls(inputs.x_mean, inputs.x_scale, 0.0, 1.0, mean, scale)

    def transform(self, data: TaskData) -> TaskData:
        """The data in model units."""
        return TaskData(self.transform_x(data.X), data.task,
                        self.transform_task_y(data.y, data.task), data.num_tasks)

    def transform_task_y(self, y: torch.Tensor, tasks: torch.Tensor) -> torch.Tensor:
        """Targets [N] in model units, each by its own task's statistics: (y − μ_t)/s_t."""
        mean, scale = self._per_point(y, tasks)
        return (y - mean) / scale

    def inverse_task_mean(self, mean: torch.Tensor, tasks: torch.Tensor) -> torch.Tensor:
        """Means (or draws) [..., N] in model units → data units."""
        shift, scale = self._per_point(mean, tasks)
        return mean * scale + shift

    def inverse_task_var(self, var: torch.Tensor, tasks: torch.Tensor) -> torch.Tensor:
        """Variances [..., N] in model units back in data units: var · s_t² of each point's task."""
        return var * self._per_point(var, tasks)[1].square()

    def log_task_scale(self, tasks: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """log s_{t_n} [N]: what log densities of standardised targets lose in data units."""
        return self._per_point(like, tasks)[1].log()

    def _per_point(self, like: torch.Tensor, tasks: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        def per_task(values):
            return torch.as_tensor(values, dtype=like.dtype, device=like.device)[tasks]
        return per_task(self.task_y_mean), per_task(self.task_y_scale)

    def to_dict(self) -> dict[str, Any]:
        """The input record of :class:`Standardisation` plus ``task_y_mean``, ``task_y_scale``
        [T]."""
        return {**super().to_dict(), "task_y_mean": self.task_y_mean.tolist(),
                "task_y_scale": self.task_y_scale.tolist()}

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> TaskStandardisation:
        """The standardisation :meth:`to_dict` wrote."""
        inputs = Standardisation.from_dict(record)
        return cls(inputs.x_mean, inputs.x_scale, 0.0, 1.0,
                   np.asarray(record["task_y_mean"], dtype=np.float64),
                   np.asarray(record["task_y_scale"], dtype=np.float64))
