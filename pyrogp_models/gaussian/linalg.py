"""Dense linear algebra for batches of small covariance matrices.

Every factorisation in the library goes through :func:`cholesky`, which adds a jitter relative to
the mean diagonal and climbs a ladder of larger jitters only for the batch members that fail.
Solves are triangular; no explicit inverses.
"""

from __future__ import annotations

import torch

from pyrogp_models.errors import CholeskyError

#: Relative jitter ladder: jitter = factor × mean(diag(A)). The first rung is always applied.
JITTER_LADDER = (1e-6, 1e-5, 1e-4, 1e-3)


def add_jitter(matrix: torch.Tensor, relative_jitter: float) -> torch.Tensor:
    """A + ε·mean(diag A)·I, batched over the leading dimensions."""
    diagonal = matrix.diagonal(dim1=-2, dim2=-1)
    scale = diagonal.mean(-1, keepdim=True).clamp_min(torch.finfo(matrix.dtype).tiny)
    eye = torch.eye(matrix.shape[-1], dtype=matrix.dtype, device=matrix.device)
    return matrix + (relative_jitter * scale).unsqueeze(-1) * eye


def cholesky(matrix: torch.Tensor, relative_jitter: float = JITTER_LADDER[0],
             what: str = "covariance matrix", check: bool = True) -> torch.Tensor:
    """Lower Cholesky factor of A + jitter, retrying failed batch members with larger jitter.

    Raises :class:`CholeskyError` naming ``what`` if some member is still not positive definite
    after the last rung of :data:`JITTER_LADDER`. ``check=False`` skips the (host-synchronising)
    failure test, for hot loops on accelerators: a failed factor then shows up as NaN downstream.
    """
    factor, info = torch.linalg.cholesky_ex(add_jitter(matrix, relative_jitter))
    if not check:
        return factor
    batch_shape = matrix.shape[:-2]
    size = matrix.shape[-1]
    flat_matrix = matrix.reshape(-1, size, size)
    flat_factor = factor.reshape(-1, size, size)
    flat_info = info.reshape(-1)
    ladder = [j for j in JITTER_LADDER if j > relative_jitter]
    while bool((flat_info > 0).any()):
        if not ladder:
            raise CholeskyError(
                f"Cholesky of the {what} failed even with relative jitter {relative_jitter:g}; "
                "the matrix is not positive definite (duplicate inputs or extreme hyperparameters?)"
            )
        relative_jitter = ladder.pop(0)
        failed = flat_info > 0
        retry, retry_info = torch.linalg.cholesky_ex(add_jitter(flat_matrix[failed],
                                                                relative_jitter))
        flat_factor = flat_factor.index_put((failed,), retry)
        flat_info = flat_info.index_put((failed,), retry_info)
    return flat_factor.reshape(*batch_shape, size, size)


def triangular_solve(lower: torch.Tensor, rhs: torch.Tensor, transpose: bool = False
                     ) -> torch.Tensor:
    """L⁻¹ B (or L⁻ᵀ B with ``transpose``) for lower-triangular L."""
    if transpose:
        return torch.linalg.solve_triangular(lower.mT, rhs, upper=True)
    return torch.linalg.solve_triangular(lower, rhs, upper=False)


def cholesky_solve(lower: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """A⁻¹ B given L = chol(A)."""
    return torch.cholesky_solve(rhs, lower)


def logdet_from_cholesky(lower: torch.Tensor) -> torch.Tensor:
    """log|A| = 2 Σ log diag(L)."""
    return 2.0 * lower.diagonal(dim1=-2, dim2=-1).log().sum(-1)
