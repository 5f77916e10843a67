"""Kernels as composable objects: every leaf kind, sums and products, kernels from Pyro, kernel
expressions, and the JSON trees files store.

Leaf kinds: :class:`Stationary` (RBF, Matérn 1/2, 3/2, 5/2; :mod:`.stationary`, with the fused
RBF path of :mod:`.fused_rbf`), :class:`RationalQuadratic`, :class:`Periodic`, :class:`Linear`,
:class:`Constant` and :class:`White`; ``+`` and ``*`` build :class:`Sum` and :class:`Product`
(:mod:`.base`); :func:`parse_kernel` reads ``"rbf + periodic(period=1) * rbf"``
(:mod:`.expression`) and :func:`kernel_text` writes one back (:mod:`.text`);
:func:`kernel_from_tree` rebuilds a stored kernel (:mod:`.registry`); :func:`resolve_kernel`
accepts a name, an expression, a library kernel or one from ``pyro.contrib.gp``
(:class:`External`, :mod:`.external`); :mod:`.members` takes batches apart and stacks them.
"""

from pyrogp_models.kernels.base import Kernel, Product, Role, Sum
from pyrogp_models.kernels.choice import resolve_kernel
from pyrogp_models.kernels.constant import Constant, White
from pyrogp_models.kernels.expression import KernelExpressionError, parse_kernel
from pyrogp_models.kernels.external import External
from pyrogp_models.kernels.leaf import Hyperparameter, Leaf
from pyrogp_models.kernels.linear import Linear
from pyrogp_models.kernels.members import (
    frozen,
    held,
    hold_given,
    member,
    moved,
    signature,
    stack,
)
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
    stationary_covariance,
    stationary_diagonal,
    stationary_kernel,
)
from pyrogp_models.kernels.text import kernel_text

__all__ = ["KINDS", "PROFILES", "RBF", "Constant", "External", "Hyperparameter", "Kernel",
           "KernelExpressionError", "Leaf", "Linear", "Matern12", "Matern32", "Matern52",
           "Periodic", "Product", "RationalQuadratic", "Role", "Stationary", "Sum", "White",
           "describable", "frozen", "held", "hold_given",
           "kernel_from_tree", "kernel_text", "member", "moved", "parse_kernel", "resolve_kernel",
           "signature", "stack",
           "stationary_covariance", "stationary_diagonal", "stationary_kernel"]
