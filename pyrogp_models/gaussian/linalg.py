"""Dense linear algebra for batches of small covariance matrices.

Every factorisation in the library goes through :func:`cholesky`, which adds a jitter relative to
the mean diagonal and climbs a ladder of larger jitters only for the batch members that fail.
Solves are triangular; the one inverse factor the library needs, chol(A⁻¹), comes from the
Cholesky factor of A with reversed rows and columns (:func:`inverse_cholesky`).

Host synchronisation: climbing the ladder needs to know, on the host, whether a factorisation
failed. Inside :func:`deferred_checks` (the trainer's loop) nothing is read back: a failed factor
is NaN, the loss turns NaN and the caller finds it when it next reads the loss (the trainer: once
per convergence window). In float32, whose rounding breaks factorisations that float64 takes at
the first rung, the deferred path climbs the ladder on the device instead: every rung is tried
without gradient, and each member is factorised once more at its first rung that succeeds — the
same factor the checked path finds. A fit whose start needs a higher rung in float64 asks for
that too (``deferred_checks(climb_ladder=True)``).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch
from torch.autograd.function import once_differentiable

from pyrogp_models.errors import CholeskyError

#: Relative jitter ladder: jitter = factor × mean(diag(A)). The first rung is always applied.
JITTER_LADDER = (1e-6, 1e-5, 1e-4, 1e-3)
#: Default relative jitter on the inducing covariance K_zz of every sparse GP.
DEFAULT_JITTER = JITTER_LADDER[0]
#: Dtypes whose deferred factorisations climb the jitter ladder on the device.
LADDER_ON_DEVICE = (torch.float32,)

#: None outside :func:`deferred_checks`; inside, whether every dtype climbs the ladder on the
#: device.
_DEFERRED = contextvars.ContextVar("pyrogp_deferred_checks", default=None)


@contextlib.contextmanager
def deferred_checks(climb_ladder: bool = False) -> Iterator[None]:
    """Within this context factorisations never synchronise with the device: a failed Cholesky
    factor is NaN instead of a :class:`CholeskyError` (the jitter ladder is climbed on the device
    in the dtypes of :data:`LADDER_ON_DEVICE`, or in every dtype with ``climb_ladder``, not at all
    otherwise)."""
    token = _DEFERRED.set(climb_ladder)
    try:
        yield
    finally:
        _DEFERRED.reset(token)


def checks_deferred() -> bool:
    """Whether the caller runs inside :func:`deferred_checks`."""
    return _DEFERRED.get() is not None


def _ladder_on_device(dtype: torch.dtype) -> bool:
    return dtype in LADDER_ON_DEVICE or bool(_DEFERRED.get())


def add_jitter(matrix: torch.Tensor, relative_jitter: float | torch.Tensor) -> torch.Tensor:
    """A + ε·mean(diag A)·I, batched over the leading dimensions (ε a number or one per member)."""
    diagonal = matrix.diagonal(dim1=-2, dim2=-1)
    scale = diagonal.mean(-1).clamp_min(torch.finfo(matrix.dtype).tiny)
    eye = torch.eye(matrix.shape[-1], dtype=matrix.dtype, device=matrix.device)
    return matrix + (relative_jitter * scale)[..., None, None] * eye


def cholesky(matrix: torch.Tensor, relative_jitter: float = DEFAULT_JITTER,
             what: str = "covariance matrix", check: bool | None = None) -> torch.Tensor:
    """Lower Cholesky factor of A + jitter, retrying failed batch members with larger jitter.

    Raises :class:`CholeskyError` naming ``what`` if some member is still not positive definite
    after the last rung of :data:`JITTER_LADDER`. ``check=False`` (the default inside
    :func:`deferred_checks`) skips the host-synchronising failure test: failed members are NaN
    (where the ladder is climbed on the device, only those that fail at every rung).
    """
    if check is None:
        check = not checks_deferred()
    if not check and _ladder_on_device(matrix.dtype):
        return _cholesky_at_first_good_rung(matrix, relative_jitter)
    factor, info = torch.linalg.cholesky_ex(add_jitter(matrix, relative_jitter))
    if not check:
        return torch.where((info > 0)[..., None, None], torch.nan, factor)
    batch_shape = matrix.shape[:-2]
    size = matrix.shape[-1]
    flat_matrix = matrix.reshape(-1, size, size)
    flat_factor = factor.reshape(-1, size, size)
    flat_info = info.reshape(-1)
    ladder = _rungs(relative_jitter)[1:]
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


def _rungs(relative_jitter: float) -> list[float]:
    """The jitters a factorisation tries in turn: ``relative_jitter``, then the larger rungs of
    :data:`JITTER_LADDER`."""
    return [relative_jitter] + [j for j in JITTER_LADDER if j > relative_jitter]


def _cholesky_at_first_good_rung(matrix: torch.Tensor, relative_jitter: float) -> torch.Tensor:
    """chol(A + ε_b·mean(diag A)·I) with ε_b the first of :func:`_rungs` at which member b
    factorises, found on the device; NaN where none does."""
    rungs = _rungs(relative_jitter)
    with torch.no_grad():
        jittered = torch.stack([add_jitter(matrix, rung) for rung in rungs])
        failed = torch.linalg.cholesky_ex(jittered)[1] > 0
        first_good = failed.to(torch.int8).argmin(0)  # the first rung that did not fail
    ladder = torch.tensor(rungs, dtype=matrix.dtype, device=matrix.device)
    # take, not ladder[first_good]: a 0-d index (one matrix) would be read on the host
    factor, info = torch.linalg.cholesky_ex(add_jitter(matrix, torch.take(ladder, first_good)))
    return torch.where((info > 0)[..., None, None], torch.nan, factor)


def inverse_cholesky(matrix: torch.Tensor, what: str = "precision matrix",
                     check: bool | None = None) -> torch.Tensor:
    """The lower Cholesky factor of A⁻¹ for a positive definite A, without forming A⁻¹.

    With J the reversal permutation and R = chol(JAJ): A⁻¹ = (J R⁻ᵀ J)(J R⁻ᵀ J)ᵀ, and J R⁻ᵀ J is
    lower triangular. No jitter is added (A is typically a precision I + …). Batched; ``check`` as
    for :func:`cholesky` (failed members are NaN when unchecked).
    """
    reversed_chol = cholesky(matrix.flip(-2, -1), 0.0, what=what, check=check)
    eye = torch.eye(matrix.shape[-1], dtype=matrix.dtype, device=matrix.device)
    return triangular_solve(reversed_chol, eye, transpose=True).flip(-2, -1)


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


class _HalfLogdetAndSolve(torch.autograd.Function):
    """(½ log|A|, X = A⁻¹B) by the Cholesky factor L of a symmetric positive definite A, with the
    backward B̄ = V = A⁻¹X̄ and Ā = ½ h̄ A⁻¹ − ½(VXᵀ + XVᵀ) (from dX = A⁻¹(dB − dA X) and
    d½log|A| = ½ tr A⁻¹dA): one Cholesky inverse, where autograd differentiates L itself, which
    costs about four times as much (K = 720: 15 against 60 ms). First derivatives only."""

    @staticmethod
    def forward(ctx, matrix: torch.Tensor, rhs: torch.Tensor, what: str):
        lower = cholesky(matrix, 0.0, what=what)
        solution = triangular_solve(lower, triangular_solve(lower, rhs), transpose=True)
        ctx.save_for_backward(lower, solution)
        return lower.diagonal(dim1=-2, dim2=-1).log().sum(-1), solution

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_half_logdet: torch.Tensor, grad_solution: torch.Tensor):
        lower, solution = ctx.saved_tensors
        grad_rhs = cholesky_solve(lower, grad_solution)
        outer = grad_rhs @ solution.mT
        grad_matrix = (0.5 * grad_half_logdet[..., None, None] * torch.cholesky_inverse(lower)
                       - 0.5 * (outer + outer.mT))
        return grad_matrix, grad_rhs, None


def half_logdet_and_solve(matrix: torch.Tensor, rhs: torch.Tensor,
                          what: str = "covariance matrix"
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """(½ log|A| [...], A⁻¹B [..., K, J]) for A [..., K, K] symmetric positive definite (no
    jitter; :func:`cholesky` names ``what`` if it fails), differentiable at the cost of one
    Cholesky inverse."""
    return _HalfLogdetAndSolve.apply(matrix, rhs, what)


class _Gram(torch.autograd.Function):
    """WᵀW with the backward W̄ = W(Ḡ + Ḡᵀ): one product, where autograd's two for the two
    operands of W.mT @ W."""

    @staticmethod
    def forward(ctx, matrix: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(matrix)
        return matrix.mT @ matrix

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (matrix,) = ctx.saved_tensors
        return matrix @ (grad + grad.mT)


def gram(matrix: torch.Tensor) -> torch.Tensor:
    """WᵀW [..., K, K] of W [..., N, K], differentiable in W at the cost of one product."""
    return _Gram.apply(matrix)
