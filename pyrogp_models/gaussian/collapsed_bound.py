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

from pyrogp_models.gaussian.linalg import cholesky, gram, triangular_solve


def collapsed_bound(features: torch.Tensor, residuals: torch.Tensor, weights: torch.Tensor,
                    noise: torch.Tensor, unexplained: torch.Tensor) -> torch.Tensor:
    """F [...] from features Φ [..., N, K], residuals r = y − c [..., N], weights w [..., N],
    noise variances σ² [..., N] and unexplained prior variances d [..., N]."""
    precision = weights / noise
    weighted = features * (weights.sqrt() * noise.rsqrt()).unsqueeze(-1)  # √0 of a padded row
    # is a constant: its infinite derivative never meets the noise's gradient
    projected = features.mT @ (precision * residuals).unsqueeze(-1)
    B_chol, mean = _optimum(gram(weighted), projected)
    fitted = (features @ mean).squeeze(-1)
    return _bound(B_chol, mean, residuals - fitted, precision, weights, noise, unexplained)


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
        rank, size, num_inputs = self.projections.shape
        pairs = ((precision.unsqueeze(-1) * self.coefficients).unsqueeze(-1)
                 * self.coefficients.unsqueeze(-2))
        pairs = pairs.new_zeros(num_inputs, rank, rank).index_add(0, self.inputs, pairs)
        scaled = self.projections.unsqueeze(1) * pairs.permute(1, 2, 0).unsqueeze(-2)
        blocks = scaled @ self.projections.mT.unsqueeze(0)                    # [R, R, M, M]
        return blocks.transpose(1, 2).reshape(rank * size, rank * size)

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


def structured_collapsed_bound(features: StructuredFeatures, residuals: torch.Tensor,
                               weights: torch.Tensor, noise: torch.Tensor,
                               unexplained: torch.Tensor) -> torch.Tensor:
    """F (a scalar) for N rows with :class:`StructuredFeatures`; residuals, weights, noise and
    unexplained as for :func:`collapsed_bound` [N]."""
    precision = weights / noise
    B_chol, mean = _optimum(features.gram(precision),
                            features.transpose_times(precision * residuals).unsqueeze(-1))
    fitted = features.times(mean)
    return _bound(B_chol, mean, residuals - fitted, precision, weights, noise, unexplained)


def _optimum(gram_matrix: torch.Tensor, projected: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """L_B = chol(I + ΦᵀβΦ) and m* = B⁻¹Φᵀβr [..., K, 1] from ΦᵀβΦ and Φᵀβr."""
    eye = torch.eye(gram_matrix.shape[-1], dtype=gram_matrix.dtype, device=gram_matrix.device)
    B_chol = cholesky(eye + gram_matrix, 0.0, what="collapsed-bound matrix I + ΦᵀβΦ")
    mean = triangular_solve(B_chol, triangular_solve(B_chol, projected), transpose=True)
    return B_chol, mean


def _bound(B_chol: torch.Tensor, mean: torch.Tensor, errors: torch.Tensor,
           precision: torch.Tensor, weights: torch.Tensor, noise: torch.Tensor,
           unexplained: torch.Tensor) -> torch.Tensor:
    """F from L_B, m*, the errors e = r − Φm* and the rows' β, w, σ² and d."""
    return (-0.5 * (weights * torch.log(2 * math.pi * noise)).sum(-1)
            - 0.5 * (precision * errors.square()).sum(-1) - 0.5 * mean.square().sum((-2, -1))
            - B_chol.diagonal(dim1=-2, dim2=-1).log().sum(-1)
            - 0.5 * (precision * unexplained).sum(-1))
