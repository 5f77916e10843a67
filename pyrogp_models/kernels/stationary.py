"""Batched stationary kernels: RBF and Matérn 1/2, 3/2, 5/2, isotropic or ARD.

One kernel object holds the hyperparameters of many GPs at once: ``lengthscale`` has shape
``[*batch, D]`` (ARD) or ``[*batch, 1]`` (isotropic) and ``variance`` has shape ``[*batch]``.
Inputs ``X`` of shape ``[*batch, N, D]`` give covariances ``[*batch, N, M]``, so K partitions with
their own hyperparameters are evaluated in one call. Positive parameters are Pyro parameters with
a positivity constraint (optimised in unconstrained log space). The RBF's cross-covariance and
Gram statistics take the fused path of :mod:`~pyrogp_models.kernels.fused_rbf`.

The functional form :func:`stationary_covariance` serves frozen modules, which carry plain tensors.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pyrogp_models.kernels.base import Role
from pyrogp_models.kernels.fused_rbf import (
    rbf_exponent_factors,
    rbf_weighted_cross_covariance,
    rbf_weighted_gram,
)
from pyrogp_models.kernels.leaf import Hyperparameter, Leaf
from pyrogp_models.kernels.profiles import (
    profile_function,
    scaled_inputs,
    scaled_profile_of_distances,
)

#: Correlation profile of each kernel family as a function of the scaled squared distance r²
#: (:mod:`pyrogp_models.kernels.profiles`: each one autograd step).
PROFILES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    family: profile_function(family) for family in ("rbf", "matern12", "matern32", "matern52")}


def stationary_covariance(family: str, X: torch.Tensor, Z: torch.Tensor,
                          lengthscale: torch.Tensor, variance: torch.Tensor,
                          weights: torch.Tensor | None = None,
                          shape: torch.Tensor | None = None) -> torch.Tensor:
    """k(X, Z) = σ² ρ(r²) for the named family, batched over leading dimensions (``weights``:
    √w_n k(x_n, z_m); ``shape``: the profile's shape parameter [*batch], the rational
    quadratic's α): ρ of the scaled inputs and the scale in one autograd step
    (:mod:`pyrogp_models.kernels.profiles`)."""
    scale = variance.unsqueeze(-1).unsqueeze(-1)
    if weights is not None:
        scale = scale * weights.sqrt().unsqueeze(-1)
    if shape is not None:
        shape = shape.unsqueeze(-1).unsqueeze(-1)
    return scaled_profile_of_distances(family, *scaled_inputs(X, Z, lengthscale), scale, shape)


def stationary_diagonal(X: torch.Tensor, variance: torch.Tensor) -> torch.Tensor:
    """diag k(X, X) = σ² for every stationary kernel; [*batch, N]."""
    return variance.unsqueeze(-1).expand(*variance.shape, X.shape[-2])


class Stationary(Leaf):
    """A batch of stationary kernels of one family: k(x, z) = σ² ρ(r²), r² = Σ_d (x_d − z_d)²/ℓ_d².

    Args:
        family: one of :data:`PROFILES` (``"rbf"``, ``"matern12"``, ``"matern32"``, ``"matern52"``).
        input_dim: D.
        batch_shape: leading shape of the hyperparameters (e.g. ``(K,)`` for K partitions).
        ard: one lengthscale per input dimension instead of one shared lengthscale.
        lengthscale, variance: initial values (scalars or broadcastable tensors); a value left
            out is not ``given`` (a fit initialises it from the data).
        learn_variance: σ² is a parameter (``False``: fixed, e.g. unit-variance latent
            functions whose amplitude lives elsewhere).
        active_dims, fixed, name: as for :class:`~pyrogp_models.kernels.leaf.Leaf`.
    """

    hyperparameters = (Hyperparameter("lengthscale", Role.INPUT_SCALE, per_dimension=True),
                       Hyperparameter("variance", Role.OUTPUT_SCALE))

    def __init__(self, family: str, input_dim: int, batch_shape: tuple[int, ...] = (),
                 ard: bool = False, lengthscale: float | torch.Tensor | None = None,
                 variance: float | torch.Tensor | None = None,
                 dtype: torch.dtype | None = None, device: torch.device | str | None = None,
                 learn_variance: bool = True, name: str | None = None,
                 active_dims=None, fixed=()):
        if family not in PROFILES:
            raise ValueError(f"unknown kernel family '{family}'; choose from {sorted(PROFILES)}")
        self.kind = family
        values = {k: v for k, v in (("lengthscale", lengthscale), ("variance", variance))
                  if v is not None}
        fixed = tuple(fixed) + (() if learn_variance else ("variance",))
        super().__init__(input_dim, active_dims=active_dims, batch_shape=batch_shape, ard=ard,
                         fixed=fixed, dtype=dtype, device=device, name=name, **values)

    @property
    def family(self) -> str:
        """The correlation profile's name (the kind)."""
        return self.kind

    def rebuilt(self, values, ard=None, batch_shape=None) -> Stationary:
        """A new kernel of this family with other ``values`` (see :meth:`Leaf.rebuilt`)."""
        reference = next(iter(values.values()))
        kernel = Stationary(self.family, self.input_dim,
                            self.batch_shape if batch_shape is None else batch_shape,
                            self.ard if ard is None else ard, dtype=reference.dtype,
                            device=reference.device, active_dims=self.active_dims,
                            fixed=self.fixed, **values)
        kernel.given = self.given
        return kernel

    def covariance(self, X: torch.Tensor, Z: torch.Tensor, same: bool) -> torch.Tensor:
        """σ² ρ(r²) [*batch, N, M]."""
        return stationary_covariance(self.family, X, Z, self.lengthscale, self.variance)

    def paired(self, X: torch.Tensor, Z: torch.Tensor) -> torch.Tensor:
        """k(x_n, z_n) = σ² ρ(Σ_d (x_nd − z_nd)²/ℓ_d²) [*batch, N], elementwise."""
        scaled = (self.slice(X) - self.slice(Z)) / self.lengthscale.unsqueeze(-2)
        return self.variance.unsqueeze(-1) * PROFILES[self.family](scaled.square().sum(-1))

    def weighted_cross(self, X: torch.Tensor, Z: torch.Tensor,
                       weights: torch.Tensor | None = None) -> torch.Tensor:
        """√w_n k(x_n, z_m) of shape [*batch, N, M] (w = 1 when ``weights`` is None); fused into
        one product and one exponential for the RBF (:mod:`pyrogp_models.kernels.fused_rbf`),
        one autograd step for the others (:func:`stationary_covariance`)."""
        if self.family == "rbf":
            return rbf_weighted_cross_covariance(self.slice(X), self.slice(Z), self.lengthscale,
                                                 self.variance, weights)
        return stationary_covariance(self.family, self.slice(X), self.slice(Z),
                                     self.lengthscale, self.variance, weights)

    def exponent_factors(self, X: torch.Tensor, Z: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The RBF's (P, Q) with k(X, Z) = exp(P Qᵀ) (:func:`~pyrogp_models.kernels.fused_rbf.
        rbf_exponent_factors`); None for other families and batched kernels."""
        if self.family != "rbf" or self.batch_shape != ():
            return None
        return rbf_exponent_factors(self.slice(X), self.slice(Z), self.lengthscale,
                                    self.variance)

    def weighted_gram(self, X: torch.Tensor, Z: torch.Tensor, weights: torch.Tensor,
                      y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Ψ₂ = k(Z, X)Wk(X, Z) [*batch, M, M] and Ψ₁ = k(Z, X)Wy [*batch, M] (W = diag w)."""
        if self.family == "rbf":
            return rbf_weighted_gram(self.slice(X), self.slice(Z), self.lengthscale,
                                     self.variance, weights, y)
        return super().weighted_gram(X, Z, weights, y)


def RBF(input_dim: int, **kwargs) -> Stationary:
    """Squared-exponential kernel k(x, x') = σ² exp(−r²/2), r² = Σ_d (x_d − x'_d)²/ℓ_d²: a
    :class:`Stationary` of family ``"rbf"`` (``kwargs`` as there)."""
    return Stationary("rbf", input_dim, **kwargs)


def Matern12(input_dim: int, **kwargs) -> Stationary:
    """Matérn ν = 1/2 (exponential) kernel σ² exp(−r), r as for :func:`RBF`: a
    :class:`Stationary` of family ``"matern12"``."""
    return Stationary("matern12", input_dim, **kwargs)


def Matern32(input_dim: int, **kwargs) -> Stationary:
    """Matérn ν = 3/2 kernel σ² (1 + √3 r) exp(−√3 r), r as for :func:`RBF`: a
    :class:`Stationary` of family ``"matern32"``."""
    return Stationary("matern32", input_dim, **kwargs)


def Matern52(input_dim: int, **kwargs) -> Stationary:
    """Matérn ν = 5/2 kernel σ² (1 + √5 r + 5r²/3) exp(−√5 r), r as for :func:`RBF`: a
    :class:`Stationary` of family ``"matern52"``."""
    return Stationary("matern52", input_dim, **kwargs)


def stationary_kernel(family: str, lengthscale: torch.Tensor, variance: torch.Tensor,
                      input_dim: int) -> Stationary:
    """A frozen kernel of ``family`` with one set of values per latent function: lengthscale
    [L, D] (ARD) or [L, 1] and variance [L] (batch shape (L,)), as module files before format 3
    stored it."""
    return Stationary(family, input_dim, tuple(variance.shape), ard=lengthscale.shape[-1] > 1,
                      lengthscale=lengthscale, variance=variance, dtype=lengthscale.dtype,
                      device=lengthscale.device).hold().requires_grad_(False)
