"""Titsias' (2009) collapsed bound from whitened features, for rows with their own noise.

With the marginals of q(v) = N(m, S) linear in m, μ_n = φ_nᵀm + c_n, σ_n² = φ_nᵀSφ_n + d_n
(φ_n = the row's whitened features, d_n = the prior variance q cannot explain), a Gaussian
likelihood with noise σ_n² per row and weights w_n ∈ {0, 1} (0 drops a padded row), β_n = w_n/σ_n²,
the optimum is q(v) = N(m*, B⁻¹) with B = I + Φᵀ diag(β) Φ = L_B L_Bᵀ and m* = B⁻¹Φᵀ(β ∘ r),
r_n = y_n − c_n (the point a unit natural-gradient step reaches), and the ELBO there is

    F = −½Σ w_n log 2πσ_n² − ½Σ β_n e_n² − ½‖m*‖² − Σ log diag L_B − ½Σ β_n d_n,

e = r − Φm* (the variance terms and the KL's trace cancel: tr B⁻¹(I + ΦᵀβΦ) = K). This equals
the textbook −½(Σβr² − ‖L_B⁻¹Φᵀβr‖²) + …, but sums two non-negative terms instead of
subtracting two large ones, which keeps float32 fits at the float64 optimum.

:func:`structured_collapsed_bound` is the same F for the features of a coregionalised GP
(:class:`StructuredFeatures`), φ_n = (c_nr a_r(x_n))_r — R latent GPs' whitened projections
a_r [M] at the row's input, mixed by the row's coefficients c_n [R] — computed at the U distinct
inputs: the blocks of ΦᵀβΦ are Σ_u a_r(x_u) a_s(x_u)ᵀ Σ_{n at u} β_n c_nr c_ns, R²M²U operations
instead of N(RM)², and no N × RM matrix is formed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.autograd.function import once_differentiable

from pyrogp_models.gaussian.linalg import gram, half_logdet_and_solve


def collapsed_bound(features: torch.Tensor, residuals: torch.Tensor, weights: torch.Tensor,
                    noise: torch.Tensor, unexplained: torch.Tensor) -> torch.Tensor:
    """F [...] from features Φ [..., N, K], residuals r = y − c [..., N], weights w [..., N],
    noise variances σ² [..., N] and unexplained prior variances d [..., N]."""
    precision = weights / noise
    weighted = features * (weights.sqrt() * noise.rsqrt()).unsqueeze(-1)  # √0 of a padded row
    # is a constant: its infinite derivative never meets the noise's gradient
    projected = features.mT @ (precision * residuals).unsqueeze(-1)
    half_logdet, mean = _optimum(gram(weighted), projected)
    fitted = (features @ mean).squeeze(-1)
    return _bound(half_logdet, mean, residuals - fitted, precision, weights, noise, unexplained)


@dataclass(frozen=True)
class StructuredFeatures:
    """The features φ_n = (c_nr a_r(x_{u_n}))_r [R·M] of N rows of a coregionalised GP: the R
    latent GPs' projections a_r at the U distinct inputs [R, M, U], every row's input u_n [N]
    (an index into them) and coefficients c_n [N, R]."""

    projections: torch.Tensor
    inputs: torch.Tensor
    coefficients: torch.Tensor

    def dense(self) -> torch.Tensor:
        """Φ [N, R·M]."""
        return (self.coefficients.unsqueeze(-1)
                * self.projections.permute(2, 0, 1)[self.inputs]).flatten(-2)

    def gram(self, precision: torch.Tensor) -> torch.Tensor:
        """Φᵀ diag(β) Φ [R·M, R·M] for β [N], block by block at the distinct inputs."""
        rank, _, num_inputs = self.projections.shape
        pairs = ((precision.unsqueeze(-1) * self.coefficients).unsqueeze(-1)
                 * self.coefficients.unsqueeze(-2))
        pairs = pairs.new_zeros(num_inputs, rank, rank).index_add(0, self.inputs, pairs)
        return _BlockGram.apply(self.projections, pairs.permute(1, 2, 0))

    def transpose_times(self, values: torch.Tensor) -> torch.Tensor:
        """Φᵀv [R·M] for v [N]."""
        rank, _, num_inputs = self.projections.shape
        sums = self.coefficients.new_zeros(num_inputs, rank).index_add(
            0, self.inputs, values.unsqueeze(-1) * self.coefficients)         # [U, R]
        return (self.projections @ sums.mT.unsqueeze(-1)).flatten()

    def times(self, vector: torch.Tensor) -> torch.Tensor:
        """Φv [N] for v [R·M]."""
        rank, size, _ = self.projections.shape
        latent = (vector.reshape(rank, 1, size) @ self.projections).squeeze(-2)  # [R, U]
        return (self.coefficients * latent.mT[self.inputs]).sum(-1)

    def mixed_variances(self, variances: torch.Tensor) -> torch.Tensor:
        """Σ_r c_nr² v_r(x_{u_n}) [N] for the latent GPs' variances v [R, U] at the inputs."""
        return (self.coefficients.square() * variances.mT[self.inputs]).sum(-1)


class _BlockGram(torch.autograd.Function):
    """G [R·M, R·M] with blocks G_rs = A_r diag(p_rs) A_sᵀ from projections A [R, M, U] and
    weights p [R, R, U] symmetric in (r, s): the blocks with r ≤ s are computed and the others
    are their transposes, and the backward, with S = Ḡ + Ḡᵀ and H_rs = S_rs A_s, is
    Ā_r = Σ_s H_rs diag(p_rs) and p̄_rs = ½ Σ_i A_r ∘ H_rs: one product per block, where
    autograd takes two."""

    @staticmethod
    def forward(ctx, projections: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
        rank, size, _ = projections.shape
        first, second = torch.triu_indices(rank, rank, device=projections.device)
        upper = ((projections[first] * pairs[first, second].unsqueeze(-2))
                 @ projections[second].mT)                                      # [P, M, M]
        blocks = projections.new_empty(rank, rank, size, size)
        blocks[second, first] = upper.mT
        blocks[first, second] = upper
        ctx.save_for_backward(projections, pairs)
        return blocks.transpose(1, 2).reshape(rank * size, rank * size)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        projections, pairs = ctx.saved_tensors
        rank, size, _ = projections.shape
        both = (grad + grad.mT).reshape(rank, size, rank, size).transpose(1, 2)  # S [R, R, M, M]
        products = both @ projections.unsqueeze(0)                               # H [R, R, M, U]
        grad_projections = (products * pairs.unsqueeze(-2)).sum(1)
        grad_pairs = 0.5 * (projections.unsqueeze(1) * products).sum(-2)
        return grad_projections, grad_pairs


def structured_collapsed_bound(features: StructuredFeatures, residuals: torch.Tensor,
                               weights: torch.Tensor, noise: torch.Tensor,
                               unexplained: torch.Tensor) -> torch.Tensor:
    """F (a scalar) for N rows with :class:`StructuredFeatures`; residuals, weights, noise and
    unexplained as for :func:`collapsed_bound` [N]."""
    precision = weights / noise
    half_logdet, mean = _optimum(features.gram(precision),
                                 features.transpose_times(precision * residuals).unsqueeze(-1))
    fitted = features.times(mean)
    return _bound(half_logdet, mean, residuals - fitted, precision, weights, noise, unexplained)


def _optimum(gram_matrix: torch.Tensor, projected: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Σ log diag L_B = ½ log|B| and m* = B⁻¹Φᵀβr [..., K, 1] from ΦᵀβΦ and Φᵀβr (B = I + ΦᵀβΦ)."""
    eye = torch.eye(gram_matrix.shape[-1], dtype=gram_matrix.dtype, device=gram_matrix.device)
    return half_logdet_and_solve(eye + gram_matrix, projected,
                                 what="collapsed-bound matrix I + ΦᵀβΦ")


def _bound(half_logdet: torch.Tensor, mean: torch.Tensor, errors: torch.Tensor,
           precision: torch.Tensor, weights: torch.Tensor, noise: torch.Tensor,
           unexplained: torch.Tensor) -> torch.Tensor:
    """F from Σ log diag L_B, m*, the errors e = r − Φm* and the rows' β, w, σ² and d."""
    return (-0.5 * (weights * torch.log(2 * math.pi * noise)).sum(-1)
            - 0.5 * (precision * errors.square()).sum(-1) - 0.5 * mean.square().sum((-2, -1))
            - half_logdet
            - 0.5 * (precision * unexplained).sum(-1))
