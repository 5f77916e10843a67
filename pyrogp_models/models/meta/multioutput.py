"""The multi-output meta-GP (Modular GP slides, "Transfer learning with multi-output modules").

Each module k is one output f_k of a linear model of coregionalisation (LMC) with Q latent
functions and one weight per output and latent (R_q = 1, as in the authors' code):

    f_k(x) = Σ_q W_kq v_q(x),   v_q ~ GP(0, k_q)   (k_q stationary with unit variance; W carries
                                                     the amplitudes).

Each latent has its own inducing inputs Z_q [M, D] and a whitened q(w_q) = N(m_q, L_q L_qᵀ),
v_q(Z_q) = chol(k_q(Z_q, Z_q)) w_q, mean-field over q. The bound is

    L^MO = Σ_k E_{q_C(u_k)}[log q_k(u_k) − log p_k(u_k)] − Σ_q KL[q(w_q) ‖ N(0, I)],

with p_k the module's prior under its own kernel and q_C(u_k) = N(m_C, S_C),
m_C = Σ_q W_kq B_kqᵀ m_q and S_C = Σ_q W_kq² (k_q(Z_k, Z_k) − B_kqᵀB_kq + B_kqᵀ S_q B_kq),
B_kq = L_qq⁻¹ k_q(Z_q, Z_k): a sum over q of whitened conditionals with projection W_kq B_kq.
Stacking the latents, B_k = [W_k1 B_k1; …; W_kQ B_kQ] gives the same quadratic form as the
single-output meta-GP, hence the same boundedness check on Λ_w = I + Σ_k B_k P_k B_kᵀ (QM × QM).

The latents' inducing inputs and q(w_q) are one :class:`~pyrogp_models.layers.SparseGPLayer` with
batch (Q,) and a unit-variance kernel. ``model``, ``guide`` and ``predictive_model`` run in Pyro's
module context, so ``pyro.infer.SVI`` trains every parameter and ``pyro.infer.Predictive`` draws
the latents and every output.

Modules must share the input standardisation; their outputs keep their own units, likelihoods and
output standardisations, which predictions for output k use.
"""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroModule, PyroParam, pyro_method

from pyrogp_models.data import Standardisation
from pyrogp_models.gaussian import conditionals
from pyrogp_models.gaussian.expectations import (
    ContrastiveQuadratic,
    contrastive_quadratic,
)
from pyrogp_models.gaussian.linalg import DEFAULT_JITTER, cholesky_solve, inverse_cholesky
from pyrogp_models.kernels import PROFILES, Stationary, stationary_covariance
from pyrogp_models.layers import OneLayer, SparseGPLayer, unique_name
from pyrogp_models.models.meta.boundedness import ON_UNBOUNDED, BoundednessGuard
from pyrogp_models.models.meta.meta_gp import score_modules
from pyrogp_models.modules.predictor import Predictor
from pyrogp_models.modules.stack import ModuleStack


class MultiOutputMetaGP(OneLayer, BoundednessGuard, PyroModule):
    """An LMC meta-GP over modules, one output per module.

    Args:
        stack: the modules, built for ``purpose="recycle-outputs"``.
        inducing: initial Z_q [Q, M, D] (model units).
        family: kernel family of every latent function.
        lengthscale: initial lengthscales [Q, D] (ARD) or [Q, 1].
        mixing: initial W [K, Q] (K = number of modules, in stack order).
        learn_inducing: optimise the Z_q.
        jitter, on_unbounded, check_every, name: as for
            :class:`pyrogp_models.models.meta.meta_gp.MetaGP`.
    """

    def __init__(self, stack: ModuleStack, inducing: torch.Tensor, family: str,
                 lengthscale: torch.Tensor, mixing: torch.Tensor, *, learn_inducing: bool = True,
                 jitter: float = DEFAULT_JITTER, on_unbounded: str = "raise",
                 check_every: int = 50, name: str | None = None):
        super().__init__(name or unique_name("mo_meta"))
        if family not in PROFILES:
            raise ValueError(f"unknown kernel family '{family}'; choose from {sorted(PROFILES)}")
        if on_unbounded not in ON_UNBOUNDED:
            raise ValueError(f"on_unbounded must be one of {ON_UNBOUNDED}, got '{on_unbounded}'")
        num_latent, size, _ = inducing.shape
        if tuple(mixing.shape) != (stack.num_modules, num_latent):
            raise ValueError(f"mixing weights of shape {tuple(mixing.shape)}, expected "
                             f"(modules, latents) = {(stack.num_modules, num_latent)}")
        self.stack = stack
        self.family = family
        self.collapsed = False
        self.on_unbounded = on_unbounded
        self.check_every = check_every
        self.evaluations = 0
        kernel = Stationary(family, inducing.shape[-1], (num_latent,), lengthscale.shape[-1] > 1,
                            lengthscale.clone(), 1.0, inducing.dtype, inducing.device,
                            learn_variance=False)
        self.layer = SparseGPLayer(kernel, inducing.clone(), (num_latent,),
                                   learn_inducing=learn_inducing, jitter=jitter)
        self.mixing = PyroParam(mixing.clone())

    @property
    def inducing(self) -> torch.Tensor:
        """Z_q [Q, M, D]."""
        return self.layer.inducing

    @property
    def lengthscale(self) -> torch.Tensor:
        """ℓ_q [Q, D or 1]."""
        return self.layer.kernel.lengthscale

    @property
    def num_latent(self) -> int:
        return self.inducing.shape[0]

    # Gaussian algebra -------------------------------------------------------------------------
    def latent_kernel(self, X: torch.Tensor, Z: torch.Tensor) -> torch.Tensor:
        """k_q(X, Z) for every latent q: [Q, *batch, N, M] for X [Q or 1, *batch, N, D] and
        Z [*batch, M, D] (unit variance)."""
        extra = X.dim() - 3
        lengthscale = self.lengthscale.reshape(self.num_latent, *([1] * extra), -1)
        ones = lengthscale.new_ones(lengthscale.shape[:-1])
        return stationary_covariance(self.family, X, Z, lengthscale, ones)

    def prior_cholesky(self) -> torch.Tensor:
        """chol(k_q(Z_q, Z_q) + jitter) per latent, [Q, M, M]."""
        return self.layer.prior_cholesky()

    def _module_terms(self, prior_chol: torch.Tensor):
        """Per M_k-group: the group, W_kq B_kq [Q, G, M, M_k] and W_kq² k_q(Z_k, Z_k)
        [Q, G, M_k, M_k]."""
        for group in self.stack.groups:
            weights = self.mixing[group.indices].mT.unsqueeze(-1).unsqueeze(-1)  # [Q, G, 1, 1]
            cross = self.latent_kernel(self.inducing.unsqueeze(1), group.inducing)
            projection = conditionals.projection(prior_chol.unsqueeze(1), cross)
            prior_cov = self.latent_kernel(group.inducing.unsqueeze(0), group.inducing)
            yield group, weights * projection, weights.square() * prior_cov

    def contrastive_predictives(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """q_C(u_k) = N(m_C, S_C) per M_k-group: means [G, M_k], covariances [G, M_k, M_k]."""
        out = []
        for _, projection, prior_cov in self._module_terms(self.prior_cholesky()):
            mean, cov = conditionals.whitened_conditional_full(
                projection, prior_cov, self.q_mean.unsqueeze(1), self.q_sqrt.unsqueeze(1))
            out.append((mean.sum(0), cov.sum(0)))
        return out

    def contrastive_terms(self) -> torch.Tensor:
        """E_{q_C(u_k)}[log q_k − log p_k] per module (output), in stack order; [K]."""
        return score_modules(self.stack, self.contrastive_predictives())

    def kl(self) -> torch.Tensor:
        """Σ_q KL[q(w_q) ‖ N(0, I)]."""
        return self.layer.kl().sum()

    def bound(self) -> torch.Tensor:
        """L^MO at the current q."""
        return self.contrastive_terms().sum() - self.kl()

    def bound_quadratic(self) -> ContrastiveQuadratic:
        """(Λ_w, η_w, c) over the stacked latents (QM × QM, latent-major), including the KL's I."""
        prior_chol = self.prior_cholesky()
        total = self.num_latent * self.num_inducing
        precision = torch.eye(total, dtype=prior_chol.dtype, device=prior_chol.device)
        shift, constant = prior_chol.new_zeros(total), prior_chol.new_zeros(())
        for group, projection, prior_cov in self._module_terms(prior_chol):
            stacked = projection.transpose(0, 1).reshape(len(group.names), total, -1)
            part = contrastive_quadratic(stacked, prior_cov.sum(0), *group.first_latent())
            precision, shift, constant = (precision + part.precision, shift + part.shift,
                                          constant + part.constant)
        return ContrastiveQuadratic(precision, shift, constant)

    @torch.no_grad()
    def set_optimal_posterior(self) -> None:
        """The mean-field optimum for the current W, kernels and Z_q: m = Λ_w⁻¹η_w (joint) and
        S_q = (Λ_w)_qq⁻¹ (diagonal blocks)."""
        precision, shift, _ = self.bound_quadratic()
        chol = self.precision_cholesky(precision)
        Q, M = self.num_latent, self.num_inducing
        blocks = precision.reshape(Q, M, Q, M).diagonal(dim1=0, dim2=2).permute(2, 0, 1)
        self.layer.set_whitened_posterior(cholesky_solve(chol, shift.unsqueeze(-1)).reshape(Q, M),
                                          inverse_cholesky(blocks, what="block of Λ_w"))

    # Boundedness guard ------------------------------------------------------------------------
    def _unbounded_message(self, smallest: float, suspects: list[str]) -> str:
        return (f"the multi-output bound is unbounded above: λ_min(Λ_w) = {smallest:.4g} ≤ 0 "
                "(under-fitted modules or mixing weights larger than the modules' amplitudes); "
                "repair the modules with clip_site_precisions")

    # Pyro model / guide -----------------------------------------------------------------------
    @pyro_method
    def model(self):
        """Whitened priors w_q ~ N(0, I); the contrastive sum as a factor."""
        self.guard_evaluation()
        self.layer.sample(self._pyro_get_fullname("u"), posterior=False)
        pyro.factor(self._pyro_get_fullname("contrastive"), self.contrastive_terms().sum())

    @pyro_method
    def guide(self, *args, **kwargs):
        """q(w_q) = N(m_q, L_q L_qᵀ), independent over q; arguments are ignored."""
        self.layer.sample(self._pyro_get_fullname("u"), posterior=True)

    @pyro_method
    def predictive_model(self, X: torch.Tensor):
        """w ~ N(0, I), the latents v_q | w at X [N, D] (model units), every output
        f_k = Σ_q W_kq v_q and y_k | f_k under module k's likelihood: sites ``u``, ``v`` [Q, N],
        ``f`` [K, N] and ``y.<module>`` [N]."""
        w = self.layer.sample(self._pyro_get_fullname("u"), posterior=False)
        mean, var = self.layer.conditional_on(w, X)
        latents = pyro.sample(self._pyro_get_fullname("v"),
                              dist.Normal(mean, var.sqrt().expand_as(mean)).to_event(2))
        outputs = pyro.deterministic(self._pyro_get_fullname("f"), self.mixing @ latents)
        for index, (name, module) in enumerate(self.stack.modules.items()):
            pyro.sample(self._pyro_get_fullname(f"y.{name}"),
                        module.likelihood().distribution(outputs[..., index, :]).to_event(1))
        return outputs

    @pyro_method
    def predictive_guide(self, *args, **kwargs):
        """q(w) for :meth:`predictive_model`; arguments are ignored."""
        self.layer.sample(self._pyro_get_fullname("u"), posterior=True)

    def natural_gradient_objectives(self) -> list:
        """The latents' layer; the contrastive terms are a concave quadratic in q (conjugate)."""
        return [(self.layer, None)]

    # Predictions ------------------------------------------------------------------------------
    def predictor(self, output: str) -> OutputPredictor:
        """The data-units predictor of output ``output`` (a module name)."""
        if output not in self.stack.modules:
            raise KeyError(f"no output '{output}'; outputs are the modules {self.stack.names}")
        return OutputPredictor(self, output)

    def output_latent(self, X: torch.Tensor, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """q(f_k) = Σ_q W_kq q(v_q) at X [N, D] (model units): mean and variance [N]."""
        weights = self.mixing[index].unsqueeze(-1).unsqueeze(-1)  # [Q, 1, 1]
        A = weights * conditionals.projection(self.prior_cholesky(),
                                              self.latent_kernel(self.inducing, X))
        prior_diag = weights.squeeze(-1).square().expand(-1, X.shape[0])
        mean, var = conditionals.whitened_conditional(A, prior_diag, self.q_mean, self.q_sqrt)
        return mean.sum(0), var.sum(0)


class OutputPredictor(Predictor):
    """One output of a :class:`MultiOutputMetaGP` in data units: the stack's input
    standardisation, and the likelihood and output standardisation of the output's module."""

    def __init__(self, meta: MultiOutputMetaGP, output: str):
        self.meta = meta
        self.index = meta.stack.names.index(output)
        self.module = meta.stack.modules[output]
        x = meta.stack.standardisation
        y = self.module.standardisation
        self.standardisation = Standardisation(x.x_mean, x.x_scale, y.y_mean, y.y_scale)
        self.columns = self.module.columns
        self.info = {}
        self.likelihood_name = self.module.likelihood_name

    @property
    def input_dim(self) -> int:
        return self.module.input_dim

    @property
    def dtype(self) -> torch.dtype:
        return self.meta.q_mean.dtype

    @property
    def device(self) -> torch.device:
        return self.meta.q_mean.device

    def likelihood(self):
        return self.module.likelihood()

    def latent(self, X: torch.Tensor, labels=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Latent mean and variance [N] of the output at X (data units), in its model units."""
        return self.meta.output_latent(self.standardisation.transform_x(X), self.index)
