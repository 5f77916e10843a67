"""The latent predictions of a dictionary of modules, batched: the experts of a product of experts.

The modules are stacked once (:class:`~pyrogp_models.modules.stack.ModuleStack`, grouped by
kernel family and M; each group predicts all its modules with one Gaussian conditional, never a
loop over modules). Every module must observe the same kind of data — one likelihood with the
same options, the same number of latent functions, input dimension and features (the stack's
``"combine"`` check); the stack converts them to common units, so their latent functions can be
combined pointwise.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from pyrogp_models.data import Standardisation
from pyrogp_models.likelihoods import Likelihood, latent_layout, make_likelihood
from pyrogp_models.modules.record import Module
from pyrogp_models.modules.stack import ModuleStack

__all__ = ["ModuleExperts"]


class ModuleExperts:
    """Latent predictions [J, N] (or [J, N, L]) of J modules at once, in model units.

    Args:
        modules: the experts by name; their order is the expert axis.
        dtype, device: where the cached tensors live (float64 by default).
    """

    def __init__(self, modules: Mapping[str, Module], dtype: torch.dtype = torch.float64,
                 device=None):
        self.stack = ModuleStack.from_modules(modules, "combine", dtype, device)
        self.names = self.stack.names
        self.modules = list(self.stack.modules.values())  # in the stack's common units
        first = self.modules[0]
        self.standardisation: Standardisation = self.stack.standardisation
        self.num_latent = first.num_latent
        self.input_dim = first.input_dim
        self._prior_mean = sum(m.prior_mean for m in self.modules) / self.num_experts  # [L]

    @property
    def num_experts(self) -> int:
        return len(self.modules)

    @property
    def dtype(self) -> torch.dtype:
        return self.modules[0].dtype

    def inputs(self, X) -> torch.Tensor:
        """Inputs in data units [N, D] → model units, on the experts' dtype and device."""
        X = torch.as_tensor(X, dtype=self.dtype, device=self.modules[0].device)
        if X.dim() != 2 or X.shape[-1] != self.input_dim:
            raise ValueError(f"expected inputs [N, {self.input_dim}], got {tuple(X.shape)}")
        return self.standardisation.transform_x(X)

    def predict_f(self, X) -> tuple[torch.Tensor, torch.Tensor]:
        """Every expert's latent mean and variance at X [N, D] in data units: [J, N] ([J, N, L]
        for several latent functions), in model units."""
        mean, var = self.stack.latent(self.inputs(X))
        return latent_layout(mean), latent_layout(var)

    def prior_var(self, X) -> torch.Tensor:
        """k(x*, x*) per point: the mean over experts of k_j(x*, x*); [N] or [N, L] (model units).

        Experts with one shared kernel (e.g. exact experts, eq. 2) give exactly that kernel's
        prior variance; when the experts' kernels differ, the mean is the prior the BCM-type
        rules and the entropy weights compare against.
        """
        X = self.inputs(X)
        total = sum(module.kernel(X, diag=True) for module in self.modules)  # [L, N]
        return latent_layout(total / self.num_experts)

    def prior_mean(self) -> torch.Tensor:
        """The prior mean: the mean over experts of their constant prior means (zero for experts
        fitted in the common units), shaped to broadcast against [N] or [N, L] (model units)."""
        return latent_layout(self._prior_mean.unsqueeze(-1))

    def likelihood(self) -> Likelihood:
        """The experts' observation model; each parameter (e.g. the Gaussian noise variance σ²)
        is the mean of the experts' values."""
        first = self.modules[0]
        params = {key: sum(m.likelihood_params[key] for m in self.modules) / self.num_experts
                  for key in first.likelihood_params}
        likelihood = make_likelihood(first.likelihood_name, (), self.dtype, first.device,
                                     **first.likelihood_options, **params)
        return likelihood.requires_grad_(False)
