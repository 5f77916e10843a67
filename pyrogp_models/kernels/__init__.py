"""Kernels as composable objects: every leaf kind, sums and products, kernels from Pyro, kernel
expressions, and the JSON trees files store.

Leaf kinds: :class:`Stationary` (RBF, Matérn 1/2, 3/2, 5/2; :mod:`.stationary`, with the fused
RBF path of :mod:`.fused_rbf`), :class:`RationalQuadratic`, :class:`Periodic`, :class:`Linear`,
:class:`Constant` and :class:`White`; ``+`` and ``*`` build :class:`Sum` and :class:`Product`
(:mod:`.combination`); :func:`parse_kernel` reads ``"rbf + periodic(period=1) * rbf"``
(:mod:`.expression`); :func:`kernel_from_tree` rebuilds a stored kernel (:mod:`.registry`).
"""

from pyrogp_models.kernels.base import Kernel, Role
from pyrogp_models.kernels.combination import Product, Sum
from pyrogp_models.kernels.constant import Constant, White
from pyrogp_models.kernels.expression import KernelExpressionError, parse_kernel
from pyrogp_models.kernels.leaf import Hyperparameter, Leaf
from pyrogp_models.kernels.linear import Linear
from pyrogp_models.kernels.periodic import Periodic
from pyrogp_models.kernels.rational_quadratic import RationalQuadratic
from pyrogp_models.kernels.registry import KINDS, describable, kernel_from_tree
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

__all__ = ["KINDS", "PROFILES", "RBF", "Constant", "Hyperparameter", "Kernel",
           "KernelExpressionError", "Leaf", "Linear", "Matern12", "Matern32", "Matern52",
           "Periodic", "Product", "RationalQuadratic", "Role", "Stationary", "Sum", "White",
           "describable", "kernel_from_tree", "parse_kernel", "scaled_squared_distance",
           "stationary_covariance", "stationary_diagonal"]
