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
"""

from __future__ import annotations

import math

import torch

from pyrogp_models.gaussian.linalg import cholesky, gram, triangular_solve


def collapsed_bound(features: torch.Tensor, residuals: torch.Tensor, weights: torch.Tensor,
                    noise: torch.Tensor, unexplained: torch.Tensor) -> torch.Tensor:
    """F [...] from features Φ [..., N, K], residuals r = y − c [..., N], weights w [..., N],
    noise variances σ² [..., N] and unexplained prior variances d [..., N]."""
    precision = weights / noise
    weighted = features * (weights.sqrt() * noise.rsqrt()).unsqueeze(-1)  # √0 of a padded row
    # is a constant: its infinite derivative never meets the noise's gradient
    eye = torch.eye(features.shape[-1], dtype=features.dtype, device=features.device)
    B_chol = cholesky(eye + gram(weighted), 0.0, what="collapsed-bound matrix I + ΦᵀβΦ")
    projected = features.mT @ (precision * residuals).unsqueeze(-1)
    mean = triangular_solve(B_chol, triangular_solve(B_chol, projected), transpose=True)
    errors = residuals - (features @ mean).squeeze(-1)
    return (-0.5 * (weights * torch.log(2 * math.pi * noise)).sum(-1)
            - 0.5 * (precision * errors.square()).sum(-1) - 0.5 * mean.square().sum((-2, -1))
            - B_chol.diagonal(dim1=-2, dim2=-1).log().sum(-1)
            - 0.5 * (precision * unexplained).sum(-1))
