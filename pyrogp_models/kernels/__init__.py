"""Batched stationary kernels (:mod:`.stationary`) and the fused RBF cross-covariance
(:mod:`.fused_rbf`)."""

from pyrogp_models.kernels.stationary import (
    PROFILES,
    RBF,
    Matern12,
    Matern32,
    Matern52,
    Stationary,
    scaled_squared_distance,
    stationary_covariance,
    stationary_diagonal,
)

__all__ = ["PROFILES", "RBF", "Matern12", "Matern32", "Matern52", "Stationary",
           "scaled_squared_distance", "stationary_covariance", "stationary_diagonal"]
