"""The latent predictions of a dictionary of modules, batched: the experts of a product of experts.

Modules are grouped by (kernel family, number of inducing inputs M); each group is stacked once
into tensors, and its whitened posterior and the inverse of its prior Cholesky factor
L_k⁻¹ = chol(K_zz^{(k)} + jitter_k)⁻¹ are cached, so the prediction of a group is a few batched
matrix products — one Gaussian conditional (:mod:`pyrogp_models.gaussian.conditionals`) per group,
never a
loop over modules. (The inverse factor is computed once by a triangular solve against I; batched
matrix products are several times faster than batched triangular solves on CPU.)

Every module must observe the same kind of data: one likelihood with the same options, the same
number of latent functions, the same input dimension, features and standardisation, so their
latent functions are in the same units and can be combined pointwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from pyrogp_models.data import Standardisation
from pyrogp_models.errors import IncompatibleModulesError
from pyrogp_models.gaussian import conditionals
from pyrogp_models.gaussian.linalg import triangular_solve
from pyrogp_models.kernels import stationary_covariance
from pyrogp_models.likelihoods import Likelihood, make_likelihood
from pyrogp_models.modules.record import Module

__all__ = ["ModuleExperts", "check_same_observations"]

#: Relative tolerance when comparing the standardisations of modules.
_RTOL = 1e-9

#: Test points per chunk are chosen so that a group's cross-covariance has about this many entries.
_CHUNK_ENTRIES = 1 << 21


@dataclass(frozen=True, eq=False)
class _Group:
    """G modules sharing a kernel family and M, stacked along dim 0 (L latent functions)."""

    indices: torch.Tensor  # positions among all modules, [G]
    family: str
    lengthscale: torch.Tensor  # [G, L, D]
    variance: torch.Tensor  # [G, L]
    inducing: torch.Tensor  # Z, [G, 1, M, D]
    inverse_prior_chol: torch.Tensor  # chol(K_zz + jitter)⁻¹, [G, L, M, M]
    mean_w: torch.Tensor  # whitened q(v) mean, [G, L, M]
    chol_w: torch.Tensor  # whitened q(v) Cholesky factor, [G, L, M, M]

    @classmethod
    def stack(cls, modules: list[Module], indices: list[int]) -> _Group:
        prior_chol = torch.stack([module.prior_cholesky() for module in modules])
        mean_w, chol_w = conditionals.whiten(
            prior_chol, torch.stack([m.q_mean for m in modules]),
            torch.stack([m.q_chol for m in modules]))
        eye = torch.eye(prior_chol.shape[-1], dtype=prior_chol.dtype, device=prior_chol.device)
        first = modules[0]
        return cls(
            indices=torch.as_tensor(indices, device=first.inducing.device),
            family=first.kernel_family,
            lengthscale=torch.stack([m.lengthscale.expand(m.num_latent, m.input_dim)
                                     for m in modules]),
            variance=torch.stack([m.variance for m in modules]),
            inducing=torch.stack([m.inducing for m in modules]).unsqueeze(1),
            inverse_prior_chol=triangular_solve(prior_chol, eye),
            mean_w=mean_w, chol_w=chol_w)

    def predict(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q(f) marginals at X [N, D] (model units) for every module: mean, var [G, L, N]."""
        cross = stationary_covariance(self.family, self.inducing, X, self.lengthscale,
                                      self.variance)  # [G, L, M, N]
        A = self.inverse_prior_chol @ cross
        prior_diag = self.variance.unsqueeze(-1).expand(*self.variance.shape, X.shape[0])
        return conditionals.whitened_conditional(A, prior_diag, self.mean_w, self.chol_w)


class ModuleExperts:
    """Latent predictions [J, N] (or [J, N, L]) of J modules at once, in model units.

    Args:
        modules: the experts by name; their order is the expert axis.
        dtype, device: where the cached tensors live (float64 by default).
    """

    def __init__(self, modules: Mapping[str, Module], dtype: torch.dtype = torch.float64,
                 device=None):
        check_same_observations(modules)
        self.names = list(modules)
        self.modules = [module.to(dtype=dtype, device=device) for module in modules.values()]
        first = self.modules[0]
        self.standardisation: Standardisation = first.standardisation
        self.num_latent = first.num_latent
        self.input_dim = first.input_dim
        keys: dict[tuple[str, int], list[int]] = {}
        for k, module in enumerate(self.modules):
            keys.setdefault((module.kernel_family, module.num_inducing), []).append(k)
        self._prior_variance = sum(m.variance for m in self.modules) / self.num_experts  # [L]
        self.groups = [_Group.stack([self.modules[k] for k in members], members)
                       for members in keys.values()]

    @property
    def num_experts(self) -> int:
        return len(self.modules)

    @property
    def dtype(self) -> torch.dtype:
        return self.modules[0].dtype

    def inputs(self, X) -> torch.Tensor:
        """Inputs in data units [N, D] → model units, on the experts' dtype and device."""
        X = torch.as_tensor(X, dtype=self.dtype, device=self.modules[0].inducing.device)
        if X.dim() != 2 or X.shape[-1] != self.input_dim:
            raise ValueError(f"expected inputs [N, {self.input_dim}], got {tuple(X.shape)}")
        return self.standardisation.transform_x(X)

    def predict_f(self, X) -> tuple[torch.Tensor, torch.Tensor]:
        """Every expert's latent mean and variance at X [N, D] in data units: [J, N] ([J, N, L]
        for several latent functions), in model units."""
        X = self.inputs(X)
        N, L = X.shape[0], self.num_latent
        mean = X.new_empty((self.num_experts, L, N))
        var = torch.empty_like(mean)
        for group in self.groups:
            chunk = max(1, _CHUNK_ENTRIES // (group.inducing.shape[-2] * len(group.indices) * L))
            for start in range(0, N, chunk):
                rows = slice(start, start + chunk)
                mean[group.indices, :, rows], var[group.indices, :, rows] = group.predict(X[rows])
        return _layout(mean), _layout(var)

    def prior_var(self, X) -> torch.Tensor:
        """k(x*, x*) per point: the mean over experts of k_j(x*, x*); [N] or [N, L] (model units).

        Experts with one shared kernel (e.g. exact experts, eq. 2) give exactly that kernel's
        prior variance; when the experts' kernels differ, the mean is the prior the BCM-type
        rules and the entropy weights compare against.
        """
        N = torch.as_tensor(X).shape[0]
        return _layout(self._prior_variance.unsqueeze(-1).expand(self.num_latent, N))

    def likelihood(self) -> Likelihood:
        """The experts' observation model; each parameter (e.g. the Gaussian noise variance σ²)
        is the mean of the experts' values."""
        first = self.modules[0]
        params = {key: sum(m.likelihood_params[key] for m in self.modules) / self.num_experts
                  for key in first.likelihood_params}
        likelihood = make_likelihood(first.likelihood_name, (), self.dtype,
                                     first.inducing.device, **first.likelihood_options, **params)
        return likelihood.requires_grad_(False)


def _layout(values: torch.Tensor) -> torch.Tensor:
    """[J, L, N] → [J, N] for one latent function, [J, N, L] for several (and [L, N] alike)."""
    return values.squeeze(-2) if values.shape[-2] == 1 else values.transpose(-1, -2)


def check_same_observations(modules: Mapping[str, Module]) -> None:
    """Raise :class:`IncompatibleModulesError`, naming the modules, unless all modules share the
    likelihood (name and options), number of latent functions, input dimension, features and the
    input and output standardisation."""
    if not modules:
        raise IncompatibleModulesError("no modules to combine")
    names = list(modules)
    first = modules[names[0]]

    def std(module: Module) -> np.ndarray:
        s = module.standardisation
        return np.concatenate([s.x_mean, s.x_scale, [s.y_mean, s.y_scale]])

    checks = [
        ("likelihood", lambda m: (m.likelihood_name, m.likelihood_options)),
        ("number of latent functions", lambda m: m.num_latent),
        ("input dimension", lambda m: m.input_dim),
        ("features", lambda m: m.info.get("features")),
    ]
    for what, key in checks:
        odd = [name for name in names if key(modules[name]) != key(first)]
        if odd:
            raise IncompatibleModulesError(
                f"modules {_listing(odd)} differ from module '{names[0]}' in {what}")
    odd = [name for name in names
           if std(modules[name]).shape != std(first).shape
           or not np.allclose(std(modules[name]), std(first), rtol=_RTOL, atol=0.0)]
    if odd:
        raise IncompatibleModulesError(
            f"modules {_listing(odd)} standardise their inputs or targets differently from "
            f"module '{names[0]}'; experts must share one standardisation to be combined")


def _listing(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(f"'{name}'" for name in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
