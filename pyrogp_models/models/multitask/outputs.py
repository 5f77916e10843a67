"""The top layer of a multitask GP: the outputs f^t given the latent space λ^t (or the inputs x,
for the single-layer baselines).

- :class:`TaskGPs`: one GP per task, f^t ~ GP(m^t(λ), k^t(λ, λ')) with an ARD kernel (Boustati
  et al., eqs. 1 and 10): mMDGP, sMDGP, iDGP and, on x, iGP. The mean is zero (the paper's) or
  a learned linear m^t(λ) = λ b^t (``linear_mean``): then f^t = λ b^t + φ^t(λ) holds a linear
  coregionalisation of the shared latent processes (the paper's eq. 11) next to the non-linear
  mixing φ^t, so a task can use what the other tasks say at the same inputs;
- :class:`CoregionalisedGP`: one coregionalised GP for all tasks, f^t(λ) = Σ_r W_tr φ_r(λ) with
  R independent latent GPs φ_r — the ICM kernel B[t, t'] k(λ, λ') with B = WWᵀ when the φ_r
  share one kernel, the LMC otherwise (Bonilla et al. 2007; Sec. 2.3): cMDGP and, on x, cGP.

Both are :class:`~pyrogp_models.layers.SparseGPLayer` batches with L outputs per
task (L = C for C classes; the L outputs share kernel and inducing inputs). ``marginals`` gives the
variational marginals of f^t at the points of task t only, ``conditional`` their law given
whitened inducing draws; λ arrives in the per-task layout [..., T', P, D^λ], results leave as
[..., T, P] (or [..., T, P, L]).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from pyro.nn import PyroModule, PyroParam

from pyrogp_models.layers import SparseGPLayer
from pyrogp_models.likelihoods import latent_layout
from pyrogp_models.models.multitask.data import DistinctInputs
from pyrogp_models.models.multitask.kernel import process_kernel

#: Means of the marginals [..., T, P] → (∂E/∂μ, ∂E/∂σ²) [..., T, P] of a data term E.
Derivatives = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class TaskGPs(PyroModule):
    """f^t, t = 1..T: a GP per task with L outputs on its own inputs.

    Args:
        inducing: initial Z [T, M, D^λ] (in λ-space).
        num_latent: L.
        lengthscale, variance: initial ARD hyperparameters (lengthscale None:
            :func:`.kernel.initial_lengthscale`).
        jitter, learn_inducing: as for :class:`SparseGPLayer`.
        linear_mean: a learned linear mean m^t(λ) = λ b^t, b^t [D^λ, L] starting at 0 (else 0).
    """

    def __init__(self, inducing: torch.Tensor, num_latent: int, *, lengthscale: float | None,
                 variance: float, jitter: float, learn_inducing: bool,
                 linear_mean: bool = False):
        super().__init__()
        num_tasks, _, width = inducing.shape
        kernel = process_kernel(width, (num_tasks, 1), ard=True, lengthscale=lengthscale,
                                variance=variance, like=inducing)
        self.layer = SparseGPLayer(kernel, inducing.unsqueeze(-3), (num_tasks, num_latent),
                                   learn_inducing=learn_inducing, jitter=jitter)
        if linear_mean:
            self.mean_weights = PyroParam(inducing.new_zeros(num_tasks, width, num_latent))
        else:
            self.mean_weights = None

    def marginals(self, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q(f^t) at λ [..., T', P, D^λ] (eq. 21, given λ): mean and variance [..., T, P(, L)]."""
        mean, var = self.layer.marginals(latent.unsqueeze(-3))
        return latent_layout(mean + self.mean(latent)), latent_layout(var)

    def features(self, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every task's marginals at λ [..., T', P, D^λ] (L = 1) as μ = φᵀm^t + m^t(λ) and
        σ² = φᵀS^tφ + d: the whitened features φ = chol(K_zz)⁻¹k(Z, λ) [..., T, P, M], the mean
        offset m^t(λ) and the unexplained prior variance d = k(λ, λ) − ‖φ‖² [..., T, P]."""
        points = latent.unsqueeze(-3)
        A = self.layer.projection(points)                                  # [..., T, 1, M, P]
        unexplained = (self.layer.kernel.diag(points) - A.square().sum(-2)).clamp_min(0.0)
        offset = latent_layout(self.mean(latent)) if self.mean_weights is not None else 0.0
        return A.squeeze(-3).mT, offset, unexplained.squeeze(-2)

    def data_gradients(self, latent: torch.Tensor, derivatives: Derivatives
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """(∂E/∂m, ∂E/∂S) [T, 1, M(, M)] of a data term E of the marginals at λ [..., T, P, D^λ]
        (L = 1) that is quadratic in their means and linear in their variances: with
        μ_n = φ_nᵀm + m^t(λ_n) and σ_n² = φ_nᵀSφ_n + d_n (:meth:`features`),
        ∂E/∂m = Σ_n φ_n ∂E/∂μ_n and ∂E/∂S = Σ_n φ_n φ_nᵀ ∂E/∂σ_n² (summed over the draws).
        ``derivatives`` maps the means [..., T, P] to (∂E/∂μ, ∂E/∂σ²) [..., T, P]."""
        phi, offset, _ = self.features(latent)
        mean = (phi @ self.layer.q_mean.mT).squeeze(-1) + offset
        by_mean, by_var = (d.reshape(-1, *d.shape[-2:]) for d in derivatives(mean))
        phi = phi.reshape(-1, *phi.shape[-3:])                              # [S, T, P, M]
        return ((by_mean.unsqueeze(-2) @ phi).sum(0),
                ((phi.mT * by_var.unsqueeze(-2)) @ phi).sum(0).unsqueeze(-3))

    def joint_marginals(self, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q(f) of every task at points λ [N, D^λ] (L = 1): means [N, T] and the covariance
        across tasks [N, T, T], diagonal (the tasks' GPs are independent)."""
        mean, var = self.marginals(latent.unsqueeze(0))
        return mean.mT, torch.diag_embed(var.mT)

    def conditional(self, whitened: torch.Tensor, latent: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """p(f^t | v) at λ given whitened inducing draws [..., T, L, M]."""
        mean, var = self.layer.conditional_on(whitened, latent.unsqueeze(-3))
        return (latent_layout(mean + self.mean(latent)),
                latent_layout(var.expand(*var.shape[:-2], *mean.shape[-2:])))

    def mean(self, latent: torch.Tensor) -> torch.Tensor | float:
        """m^t(λ) = λ b^t at λ [..., T', P, D^λ]: [..., T, L, P] (0 without a linear mean)."""
        if self.mean_weights is None:
            return 0.0
        return (latent @ self.mean_weights).mT

    def kl(self) -> torch.Tensor:
        """Σ_t KL[q(F̃^t) ‖ p(F̃^t)] over tasks and outputs (a scalar; eq. 9)."""
        return self.layer.kl().sum()

    def task_kl(self) -> torch.Tensor:
        """KL[q(F̃^t) ‖ p(F̃^t)] per task [T]."""
        return self.layer.kl().sum(-1)

    def ard_weights(self) -> torch.Tensor:
        """ω_td = 1/ℓ_td² of every task's kernel (eq. 10) [T, D^λ]."""
        return self.layer.kernel.lengthscale.squeeze(-2).square().reciprocal()


class CoregionalisedGP(PyroModule):
    """f^t(λ) = Σ_r W_tr φ_r(λ) for all tasks, with L outputs each.

    Args:
        inducing: initial Z [M_c, D^λ], shared by the R latent GPs at the start.
        num_latent: L.
        mixing: initial W [T, R].
        icm: the φ_r share one kernel (else each has its own: LMC).
        lengthscale, variance, jitter, learn_inducing: as for :class:`TaskGPs`.
        joint: one q(v) over the R·M whitened inducing values of all latent GPs (else one per
            latent GP and output; L = 1 only): with a Gaussian likelihood the ELBO is then a
            concave quadratic in q, so a unit natural-gradient step puts q at its optimum.
    """

    def __init__(self, inducing: torch.Tensor, num_latent: int, mixing: torch.Tensor, *,
                 icm: bool, lengthscale: float | None, variance: float, jitter: float,
                 learn_inducing: bool, joint: bool = False):
        super().__init__()
        if joint and num_latent != 1:
            raise ValueError("a joint q over the latent GPs takes one output per task")
        rank = mixing.shape[-1]
        size, width = inducing.shape
        kernel = process_kernel(width, (1 if icm else rank, 1), ard=True,
                                lengthscale=lengthscale, variance=variance, like=inducing)
        self.layer = SparseGPLayer(kernel, inducing.expand(rank, 1, size, width).clone(),
                                   (rank, num_latent), learn_inducing=learn_inducing,
                                   jitter=jitter, covariance="joint" if joint else "meanfield")
        self.mixing = PyroParam(mixing)

    def marginals(self, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q(f^t) at λ [..., T', P, D^λ]: mean Σ_r W_tr μ_r and variance Σ_r W_tr² σ_r² (a q per
        latent GP: the φ_r independent) or Σ_r W_tr² (k − ‖a_r‖²) + ‖L_qᵀ b‖² with
        b = (W_tr a_r)_r (a joint q = N(m, L_q L_qᵀ)), a_r = chol(K_zz,r)⁻¹ k_r(Z_r, λ)
        [..., T, P(, L)]."""
        if self.layer.covariance == "meanfield":
            return self._mix(*self.layer.marginals(self._points(latent)), latent)
        b, _, unexplained = self.features(latent)
        return (b @ self.layer.q_mean.reshape(-1),
                unexplained + (b @ self.layer.q_sqrt).square().sum(-1))

    def features(self, latent: torch.Tensor, per_latent: bool = False,
                 distinct: DistinctInputs | None = None
                 ) -> tuple[torch.Tensor, float, torch.Tensor]:
        """The marginals at λ [..., T', P, D^λ] as μ = bᵀm and σ² = bᵀSb + d for a joint q:
        b_n = (W_tr a_r(λ_n))_r [..., T, P, R·L·M], a_r = chol(K_zz,r)⁻¹k_r(Z_r, λ_n), no mean
        offset, and the unexplained prior variance d = Σ_r W_tr² d_r, d_r = k_r(λ, λ) − ‖a_r‖²
        [..., T, P(, L)] (``per_latent``: the d_r themselves [..., T, P, R], L = 1).
        ``distinct``: the distinct inputs of λ = x [1, T', P, D], at which the a_r and d_r are
        evaluated once each."""
        A, prior = self.projections(latent.flatten(-3, -2) if distinct is None
                                    else distinct.X.unsqueeze(0))
        if distinct is not None:
            A, prior = distinct.to_slots(A), distinct.to_slots(prior)
        tasks, slots = self.mixing.shape[0], latent.shape[-2]
        a = A.unflatten(-1, latent.shape[-3:-1]).movedim(-1, -5).movedim(-1, -5)
        a = a.expand(*a.shape[:-5], tasks, slots, *a.shape[-3:])           # [..., T, P, R, L, M]
        b = (a * self.mixing[:, None, :, None, None]).flatten(-3)
        if per_latent:
            prior = prior.unflatten(-1, latent.shape[-3:-1]).movedim(-4, -1).squeeze(-4)
            return b, 0.0, prior.expand(*prior.shape[:-3], tasks, *prior.shape[-2:])
        return b, 0.0, self._combine(prior, self.mixing.square(), latent)

    def projections(self, points: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """a_r = chol(K_zz,r)⁻¹k_r(Z_r, λ) [..., R, L, M, n] and d_r = k_r(λ, λ) − ‖a_r‖²
        [..., R, L, n] of every latent GP at the points λ [..., n, D^λ]."""
        points = points[..., None, None, :, :]
        A = self.layer.projection(points)
        A = A.expand(*A.shape[:-4], *self.layer.batch_shape, *A.shape[-2:])
        return A, (self.layer.kernel.diag(points) - A.square().sum(-2)).clamp_min(0.0)

    def joint_marginals(self, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q(f) of every task at points λ [N, D^λ] (a joint q): means [N, T] and the covariance
        across tasks [N, T, T], B S Bᵀ + Σ_r W_r W_rᵀ d_r with the rows b_t of B
        (:meth:`features`) and S = L_q L_qᵀ."""
        features, _, unexplained = self.features(latent.unsqueeze(0), per_latent=True)
        spread = features @ self.layer.q_sqrt                                  # [T, N, K]
        return ((features @ self.layer.q_mean.reshape(-1)).mT,
                torch.einsum("tnk,snk->nts", spread, spread)
                + torch.einsum("tr,sr,nr->nts", self.mixing, self.mixing, unexplained[0]))

    def data_gradients(self, latent: torch.Tensor, derivatives: Derivatives
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """(∂E/∂m [R·M], ∂E/∂S [R·M, R·M]) of the joint q for a data term E of the marginals at
        λ [..., T', P, D^λ] that is quadratic in their means and linear in their variances:
        ∂E/∂m = Σ_n b_n ∂E/∂μ_n and ∂E/∂S = Σ_n b_n b_nᵀ ∂E/∂σ_n² (:meth:`features`; summed
        over the draws). ``derivatives`` maps the means [..., T, P] to (∂E/∂μ, ∂E/∂σ²)."""
        b, _, _ = self.features(latent)
        by_mean, by_var = derivatives(b @ self.layer.q_mean.reshape(-1))
        b = b.reshape(-1, b.shape[-1])
        return (by_mean.reshape(-1) @ b, (b * by_var.reshape(-1, 1)).mT @ b)

    def conditional(self, whitened: torch.Tensor, latent: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """p(f^t | v) at λ given whitened inducing draws [..., R, L, M]."""
        mean, var = self.layer.conditional_on(whitened, self._points(latent))
        return self._mix(mean, var.expand(*var.shape[:-2], *mean.shape[-2:]), latent)

    def kl(self) -> torch.Tensor:
        """Σ_r KL[q(v_r) ‖ N(0, I)] over the R latent GPs and outputs (a scalar; eq. 9's top-layer
        term)."""
        return self.layer.kl().sum()

    def ard_weights(self) -> torch.Tensor:
        """ω = 1/ℓ² of the latent GPs' kernels [1 (ICM) or R, D^λ] (no per-task ARD)."""
        return self.layer.kernel.lengthscale.squeeze(-2).square().reciprocal()

    @staticmethod
    def _points(latent: torch.Tensor) -> torch.Tensor:
        """λ [..., T', P, D] as every latent GP's inputs [..., 1, 1, T'·P, D]."""
        return latent.flatten(-3, -2)[..., None, None, :, :]

    def _mix(self, mean: torch.Tensor, var: torch.Tensor, latent: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """[..., R, L, T'·P] moments of the φ_r → [..., T, P(, L)] of the f^t."""
        return (self._combine(mean, self.mixing, latent),
                self._combine(var, self.mixing.square(), latent))

    @staticmethod
    def _combine(values: torch.Tensor, weights: torch.Tensor, latent: torch.Tensor
                 ) -> torch.Tensor:
        """Σ_r weights_tr values_r: [..., R, L, T'·P] → [..., T, P(, L)]."""
        values = values.unflatten(-1, latent.shape[-3:-1]).movedim(-4, -1)  # [.., L, T', P, R]
        mixed = (values * weights.unsqueeze(-2)).sum(-1)                      # [.., L, T, P]
        return latent_layout(mixed.movedim(-3, -2))
