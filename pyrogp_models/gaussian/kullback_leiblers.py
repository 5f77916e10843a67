"""The KL divergence of a whitened q(v) from its N(0, I) prior (every sparse-GP layer's KL).

KL[N(m, LLᵀ) ‖ N(0, I)] = ½[‖L‖²_F + ‖m‖² − M − log|LLᵀ|], batched over leading dimensions;
it equals KL[q(u) ‖ p(u)] for u = chol(K_zz) v.
"""

from __future__ import annotations

import torch


def _logdet_triangular(chol: torch.Tensor) -> torch.Tensor:
    return 2.0 * chol.diagonal(dim1=-2, dim2=-1).abs().log().sum(-1)


def kl_to_standard_normal(mean: torch.Tensor, chol: torch.Tensor) -> torch.Tensor:
    """KL[N(m, LLᵀ) ‖ N(0, I)] = ½[‖L‖²_F + ‖m‖² − M − log|LLᵀ|]."""
    size = mean.shape[-1]
    return 0.5 * (chol.square().sum((-2, -1)) + mean.square().sum(-1) - size
                  - _logdet_triangular(chol))
