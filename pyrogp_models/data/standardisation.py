"""Affine standardisation of inputs and outputs, and its inverse for predictions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pyrogp_models.data.tables import ArrayLike, as_float64_numpy, require_finite
from pyrogp_models.errors import DataError


@dataclass(frozen=True, eq=False)
class Standardisation:
    """Affine maps of inputs and outputs to zero mean and unit scale, and back: x̃ = (x −
    x_mean)/x_scale with ``x_mean``, ``x_scale`` [D], ỹ = (y − y_mean)/y_scale (scalars; 0 and
    1 when targets are not standardised)."""

    x_mean: np.ndarray
    x_scale: np.ndarray
    y_mean: float
    y_scale: float

    @classmethod
    def fit(
        cls, X: ArrayLike, y: ArrayLike | None = None, standardise_y: bool = True
    ) -> Standardisation:
        """Means and population standard deviations (1.0 where a column is constant)."""
        X = as_float64_numpy(X)
        if X.ndim != 2 or X.shape[0] == 0:
            raise DataError(
                f"standardisation needs inputs of shape [N, D] with N > 0, got {X.shape}"
            )
        require_finite(X, "inputs")
        x_scale = X.std(axis=0)
        x_scale[x_scale == 0] = 1.0
        if y is None or not standardise_y:
            return cls(X.mean(axis=0), x_scale, 0.0, 1.0)
        y = as_float64_numpy(y)
        require_finite(y, "outputs")
        y_scale = float(y.std())
        return cls(X.mean(axis=0), x_scale, float(y.mean()), y_scale if y_scale > 0 else 1.0)

    def transform_x(self, X: ArrayLike) -> ArrayLike:
        """Inputs [..., D] in model units: (X − x_mean)/x_scale."""
        return (X - _like(self.x_mean, X)) / _like(self.x_scale, X)

    def inverse_x(self, X: ArrayLike) -> ArrayLike:
        """Inputs [..., D] in data units: X x_scale + x_mean (e.g. inducing inputs)."""
        return X * _like(self.x_scale, X) + _like(self.x_mean, X)

    def transform_y(self, y: ArrayLike) -> ArrayLike:
        """Targets [...] in model units: (y − y_mean)/y_scale."""
        return (y - self.y_mean) / self.y_scale

    def inverse_y_mean(self, mean: ArrayLike) -> ArrayLike:
        """Map a predictive mean in standardised units back to the original units."""
        return mean * self.y_scale + self.y_mean

    def inverse_y_var(self, var: ArrayLike) -> ArrayLike:
        """Map a predictive variance in standardised units back to the original units."""
        return var * self.y_scale**2

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able record: ``x_mean`` and ``x_scale`` [D] as lists, ``y_mean``, ``y_scale``."""
        return {
            "x_mean": self.x_mean.tolist(),
            "x_scale": self.x_scale.tolist(),
            "y_mean": float(self.y_mean),
            "y_scale": float(self.y_scale),
        }

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> Standardisation:
        """The standardisation :meth:`to_dict` wrote."""
        return cls(
            np.asarray(record["x_mean"], dtype=np.float64),
            np.asarray(record["x_scale"], dtype=np.float64),
            float(record["y_mean"]),
            float(record["y_scale"]),
        )


def _like(values: np.ndarray, reference: ArrayLike) -> ArrayLike:
    if isinstance(reference, torch.Tensor):
        return torch.as_tensor(values, dtype=reference.dtype, device=reference.device)
    return values
