"""Closed-form Gaussian cross-entropies and the contrastive expectations of the meta-GP bound.

Cross-entropy (Recyclable GPs, App. B): for u ~ N(m, S) in d dimensions and Σ = L Lᵀ,

    E_{N(m,S)}[log N(u | μ, Σ)] = −½[d log 2π + log|Σ| + tr(Σ⁻¹S) + (m−μ)ᵀΣ⁻¹(m−μ)].

Contrastive expectation (eq. 5–6): the meta-GP's predictive at a module's inducing inputs,
q_C(u_k) = N(m_C, S_C) (eq. 17 with the main-text "+" sign; in whitened form it is
:func:`pyrogp_models.gaussian.conditionals.whitened_conditional_full` with B_k = L_**⁻¹K_*k and the
prior
covariance K_kk^{(*)} of the *global* kernel), scores

    E_{q_C}[log q_k(u_k) − log p_k(u_k)]

against the module's own q_k = N(μ_k, L_k L_kᵀ) and prior p_k = N(μ_pk, L_pk L_pkᵀ) (its own kernel;
μ_pk = 0 unless the module was converted to other units, :mod:`pyrogp_models.modules.units`).

As a function of the whitened q(v) = N(m, S_v), the sum over modules is a quadratic form
(natural-parameter view):

    Σ_k E_{q_C}[log q_k − log p_k] = −½tr(P S_v) − ½mᵀPm + ηᵀm + c,
    P = Σ_k B_k P_k B_kᵀ,  P_k = S_k⁻¹ − K_kk^{(k)−1},  η = Σ_k B_k b_k,
    b_k = S_k⁻¹μ_k − K_kk^{(k)−1}μ_pk,  Q_k = K_kk^{(*)} − B_kᵀB_k,
    c = −½Σ_k[tr(P_k Q_k) + μ_kᵀS_k⁻¹μ_k − μ_pkᵀK_kk^{(k)−1}μ_pk + log|S_k| − log|K_kk^{(k)}|],

which gives the collapsed optimum and the boundedness test of the meta-GP. The site parameters
(P_k, b_k and the q-independent part of c) depend on the module alone, so
:func:`site_parameters` computes them once per module; with them the sum over modules needs only
products with K_*k and no per-module solve. Every inverse is a triangular solve with a Cholesky
factor; everything batches over leading dimensions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

import torch
from torch.autograd.function import once_differentiable

from pyrogp_models.gaussian.exp_product import exp_of_product, exponent_gradients
from pyrogp_models.gaussian.linalg import cholesky_solve, logdet_from_cholesky, triangular_solve

_LOG_2PI = math.log(2.0 * math.pi)


def trace_of_solve(chol: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """tr(Σ⁻¹A) for Σ = LLᵀ, by two triangular solves."""
    return cholesky_solve(chol, matrix).diagonal(dim1=-2, dim2=-1).sum(-1)


def mahalanobis(chol: torch.Tensor, diff: torch.Tensor) -> torch.Tensor:
    """dᵀΣ⁻¹d = ‖L⁻¹d‖² for Σ = LLᵀ."""
    return triangular_solve(chol, diff.unsqueeze(-1)).squeeze(-1).square().sum(-1)


def gaussian_cross_entropy(mean: torch.Tensor, cov: torch.Tensor, target_mean: torch.Tensor,
                           target_chol: torch.Tensor) -> torch.Tensor:
    """E_{N(mean, cov)}[log N(u | target_mean, LLᵀ)] in closed form (App. B). ``cov`` need not be
    factorised (it may be a difference of covariances, as S_C is)."""
    size = mean.shape[-1]
    return -0.5 * (size * _LOG_2PI + logdet_from_cholesky(target_chol)
                   + trace_of_solve(target_chol, cov) + mahalanobis(target_chol,
                                                                    mean - target_mean))


def contrastive_expectation(mean_c: torch.Tensor, cov_c: torch.Tensor, module_mean: torch.Tensor,
                            module_chol: torch.Tensor, module_prior_chol: torch.Tensor,
                            module_prior_mean: torch.Tensor | None = None) -> torch.Tensor:
    """E_{q_C(u_k)}[log q_k(u_k) − log p_k(u_k)], one summand of eq. (6); batched over modules
    (``module_prior_mean``: μ_pk [..., M_k], zero by default)."""
    prior_mean = torch.zeros_like(module_mean) if module_prior_mean is None else module_prior_mean
    return (gaussian_cross_entropy(mean_c, cov_c, module_mean, module_chol)
            - gaussian_cross_entropy(mean_c, cov_c, prior_mean, module_prior_chol))


class ContrastiveQuadratic(NamedTuple):
    """Σ_k E_{q_C}[log q_k − log p_k] = −½tr(P S_v) − ½mᵀPm + ηᵀm + c in the whitened q(v)."""

    precision: torch.Tensor  # P = Σ_k B_k P_k B_kᵀ, [M, M]
    shift: torch.Tensor  # η = Σ_k B_k b_k, [M]
    constant: torch.Tensor  # c, []


def contrastive_quadratic(projection: torch.Tensor, prior_cov: torch.Tensor,
                          module_mean: torch.Tensor, module_chol: torch.Tensor,
                          module_prior_chol: torch.Tensor,
                          module_prior_mean: torch.Tensor | None = None) -> ContrastiveQuadratic:
    """The quadratic form of the contrastive sum over a batch of K modules (summed over them).

    Args:
        projection: B_k = L_**⁻¹K_*k, [K, M, M_k].
        prior_cov: K_kk^{(*)}, the global kernel at the module inputs, [K, M_k, M_k].
        module_mean, module_chol, module_prior_chol: μ_k [K, M_k], chol S_k and chol K_kk^{(k)}
            [K, M_k, M_k]; module_prior_mean: μ_pk [K, M_k] (zero by default).
    """
    prior_mean = torch.zeros_like(module_mean) if module_prior_mean is None else module_prior_mean
    site = triangular_solve(module_chol, projection.mT)  # L_k⁻¹B_kᵀ
    prior_site = triangular_solve(module_prior_chol, projection.mT)  # L_pk⁻¹B_kᵀ
    whitened_mean = triangular_solve(module_chol, module_mean.unsqueeze(-1))  # L_k⁻¹μ_k
    whitened_prior_mean = triangular_solve(module_prior_chol, prior_mean.unsqueeze(-1))
    stacked_site = site.reshape(-1, site.shape[-1])  # Σ_k over modules as one product
    stacked_prior_site = prior_site.reshape(-1, site.shape[-1])
    precision = stacked_site.mT @ stacked_site - stacked_prior_site.mT @ stacked_prior_site
    shift = (stacked_site.mT @ whitened_mean.reshape(-1)
             - stacked_prior_site.mT @ whitened_prior_mean.reshape(-1))
    site_trace_q = (trace_of_solve(module_chol, prior_cov)  # tr(P_k Q_k)
                    - trace_of_solve(module_prior_chol, prior_cov)
                    - site.square().sum((-2, -1)) + prior_site.square().sum((-2, -1)))
    constant = -0.5 * (site_trace_q + whitened_mean.square().sum((-2, -1))
                       - whitened_prior_mean.square().sum((-2, -1))
                       + logdet_from_cholesky(module_chol)
                       - logdet_from_cholesky(module_prior_chol)).sum()
    return ContrastiveQuadratic(precision, shift, constant)


class SiteParameters(NamedTuple):
    """The q-independent parameters of a module's site q_k(u_k)/p_k(u_k), batched over modules."""

    precision: torch.Tensor  # P_k = S_k⁻¹ − K_kk^{(k)−1}, symmetric, [..., M_k, M_k]
    shift: torch.Tensor  # b_k = S_k⁻¹μ_k − K_kk^{(k)−1}μ_pk, [..., M_k]
    # μ_kᵀS_k⁻¹μ_k − μ_pkᵀK_kk^{(k)−1}μ_pk + log|S_k| − log|K_kk^{(k)}|, [...]
    constant: torch.Tensor


def site_parameters(module_mean: torch.Tensor, module_chol: torch.Tensor,
                    module_prior_chol: torch.Tensor,
                    module_prior_mean: torch.Tensor | None = None) -> SiteParameters:
    """P_k, b_k and the constant of the site of each module from μ_k [..., M_k], chol S_k,
    chol K_kk^{(k)} [..., M_k, M_k] and μ_pk [..., M_k] (zero by default); inverse factors by
    triangular solves with the identity."""
    eye = torch.eye(module_chol.shape[-1], dtype=module_chol.dtype, device=module_chol.device)
    inverse_chol = triangular_solve(module_chol, eye)  # L_k⁻¹
    inverse_prior_chol = triangular_solve(module_prior_chol, eye)  # L_pk⁻¹
    precision = inverse_chol.mT @ inverse_chol - inverse_prior_chol.mT @ inverse_prior_chol
    precision = 0.5 * (precision + precision.mT)
    prior_mean = torch.zeros_like(module_mean) if module_prior_mean is None else module_prior_mean
    whitened_mean = (inverse_chol @ module_mean.unsqueeze(-1)).squeeze(-1)  # L_k⁻¹μ_k
    whitened_prior_mean = (inverse_prior_chol @ prior_mean.unsqueeze(-1)).squeeze(-1)
    shift = ((inverse_chol.mT @ whitened_mean.unsqueeze(-1))
             - (inverse_prior_chol.mT @ whitened_prior_mean.unsqueeze(-1))).squeeze(-1)
    constant = (whitened_mean.square().sum(-1) - whitened_prior_mean.square().sum(-1)
                + logdet_from_cholesky(module_chol) - logdet_from_cholesky(module_prior_chol))
    return SiteParameters(precision, shift, constant)


#: Largest block size M_k applied entry by entry (M_k scaled additions of [M, M_k, G] slices);
#: larger blocks use batched matrix products.
ELEMENTWISE_BLOCK_LIMIT = 16


def _apply_blocks(blocks: torch.Tensor, matrix_t: torch.Tensor, transpose: bool
                  ) -> torch.Tensor:
    """Yᵀ [M, G M_k] for Y = blockdiag(A_1, …, A_G) X (or the A_gᵀ with ``transpose``) from Xᵀ,
    position-major, outside autograd; ``blocks`` [M_k, M_k, G] holds A_g[a, b] at [a, b, g].
    Entry by entry, Yᵀ[:, i, g] = Σ_j Xᵀ[:, j, g] (A_g)_ij as M_k passes, pass j adding
    Xᵀ[:, j, g] (A_g)_ij to every position i at once."""
    size, count = blocks.shape[0], blocks.shape[-1]
    source = matrix_t.view(-1, size, count)
    if size > ELEMENTWISE_BLOCK_LIMIT:
        return torch.einsum("jig,mjg->mig" if transpose else "ijg,mjg->mig", blocks,
                            source).reshape(matrix_t.shape)
    coefficients = blocks.transpose(0, 1) if transpose else blocks  # [i, j] ↦ (A_g)_ij
    target = torch.mul(source[:, :1], coefficients[:, 0], out=torch.empty_like(source))
    for j in range(1, size):
        target.addcmul_(source[:, j:j + 1], coefficients[:, j])
    return target.view(matrix_t.shape)


class _BlockDiagonalProduct(torch.autograd.Function):
    """Yᵀ = (blockdiag(A_g) X)ᵀ with constant blocks; X̄ᵀ = (blockdiag(A_gᵀ) Ȳ)ᵀ."""

    @staticmethod
    def forward(ctx, matrix_t: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
        ctx.blocks = blocks
        return _apply_blocks(blocks, matrix_t, transpose=False)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        return _apply_blocks(ctx.blocks, grad.contiguous(), transpose=True), None


def block_diagonal_product(blocks: torch.Tensor, matrix_t: torch.Tensor) -> torch.Tensor:
    """(blockdiag(A_1, …, A_G) X)ᵀ [M, G M_k] from Xᵀ [M, G M_k] with the rows of X
    position-major (row j·G + g is row j of block g) and the blocks as [M_k, M_k, G]
    (A_g[a, b] at [a, b, g]); differentiable in X (the blocks are constants). Blocks up to
    :data:`ELEMENTWISE_BLOCK_LIMIT` are applied entry by entry: M_k scaled additions of
    [M, M_k, G] slices, much faster than G tiny matrix products."""
    return _BlockDiagonalProduct.apply(matrix_t.contiguous(), blocks.detach())


#: The block products pad the rows of L_**⁻¹ with zeros to a multiple of this (the padded rows
#: of Aᵀ and P_b are zero): MKL's products with [M, N_b] operands can be much faster for such row
#: counts (AMD EPYC, M = 35: the Gram product 1.6× and L_**⁻¹Wᵀ 1.4× faster with 36 rows; bound +
#: gradient at 5000 modules 10 % faster at M = 35, 7 % at 70, 3 % at 21, the same at 30 and 50,
#: 1–2 % slower at 37 and 41).
PADDED_ROWS_MULTIPLE = 4


def _padded_rows(matrix: torch.Tensor) -> torch.Tensor:
    """``matrix`` [M, C] with zero rows appended up to a multiple of
    :data:`PADDED_ROWS_MULTIPLE`."""
    return torch.nn.functional.pad(matrix, (0, 0, 0, -matrix.shape[0] % PADDED_ROWS_MULTIPLE))


def _site_gram(cross_t: torch.Tensor, inverse_chol: torch.Tensor, roots: torch.Tensor,
               sign: torch.Tensor | None, shift: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """P_b = Aᵀ diag(s) A, u_b = K_*b b and Aᵀ diag(s) for one block, with
    Aᵀ = L_**⁻¹ (blockdiag(R_kᵀ) K_b*)ᵀ, outside autograd (L_**⁻¹ and so Aᵀ, P_b with padded
    rows, :func:`_padded_rows`)."""
    factor_t = inverse_chol @ _apply_blocks(roots, cross_t, transpose=True)  # Aᵀ
    signed_t = factor_t if sign is None else factor_t * sign
    precision = signed_t @ factor_t.mT
    return 0.5 * (precision + precision.mT), cross_t @ shift, signed_t


def _site_gram_backward(grad_precision: torch.Tensor, grad_projected: torch.Tensor,
                        signed_t: torch.Tensor, inverse_chol: torch.Tensor,
                        prior_chol: torch.Tensor, precision: torch.Tensor, roots: torch.Tensor,
                        shift: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """K̄_*b = (blockdiag(R_k) W̄)ᵀ + ū bᵀ with W̄ᵀ = (H L_**⁻¹)ᵀ (Aᵀ diag(s)) and
    (L_**⁻¹)‾ = H P_b L_**ᵀ, H = P̄ + P̄ᵀ (:class:`_SiteGram`); the padded rows of Aᵀ are zero,
    so W̄ᵀ takes the first M of each side."""
    size = prior_chol.shape[0]
    symmetric = grad_precision + grad_precision.mT
    weighted = _padded_rows((symmetric @ inverse_chol)[:size].mT)  # (H L_**⁻¹)ᵀ
    grad_cross_t = _apply_blocks(roots, (weighted @ signed_t[:size])[:size], transpose=False)
    grad_cross_t.addr_(grad_projected, shift)
    return grad_cross_t, symmetric @ precision[:, :size] @ prior_chol.mT


class _SiteGram(torch.autograd.Function):
    """(P_b, u_b) = (Aᵀ diag(s) A, K_*b b) for one block of modules, with Aᵀ = L_**⁻¹ Wᵀ,
    Wᵀ = (blockdiag(R_kᵀ) K_b*)ᵀ, from K_*b [M, N_b] (position-major) and L_**⁻¹ (rows padded,
    :func:`_padded_rows`); R_k, s, b and L_** are constants (L_**⁻¹ carries the gradient of L_**).

    Backward, with H = P̄ + P̄ᵀ: Āᵀ = H Aᵀ diag(s), so K̄_*b = (blockdiag(R_k) W̄)ᵀ + ū bᵀ with
    W̄ᵀ = (H L_**⁻¹)ᵀ (Aᵀ diag(s)) — one product with the saved Aᵀ diag(s) (not
    (L_**⁻ᵀ H L_**⁻¹) Wᵀ diag(s), whose M × M factor grows with the square of L_**⁻¹) — and
    (L_**⁻¹)‾ = Āᵀ W = H Aᵀ diag(s) A L_**ᵀ = H P_b L_**ᵀ, M × M algebra."""

    @staticmethod
    def forward(ctx, cross_t: torch.Tensor, inverse_chol: torch.Tensor, prior_chol: torch.Tensor,
                roots: torch.Tensor, sign: torch.Tensor | None, shift: torch.Tensor):
        precision, projected, signed_t = _site_gram(cross_t, inverse_chol, roots, sign, shift)
        ctx.save_for_backward(signed_t, inverse_chol, prior_chol, precision, roots, shift)
        return precision, projected

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_precision: torch.Tensor, grad_projected: torch.Tensor):
        grad_cross_t, grad_inverse = _site_gram_backward(grad_precision, grad_projected,
                                                         *ctx.saved_tensors)
        return grad_cross_t, grad_inverse, None, None, None, None


class ExpFactors(NamedTuple):
    """K_*b = exp(P Qᵀ) in factored form (:func:`pyrogp_models.gaussian.exp_product.
    exp_of_product`; the RBF kernel's, :meth:`pyrogp_models.kernels.base.Kernel.
    exponent_factors`)."""

    left: torch.Tensor  # P [M, R], the global inducing inputs' side
    right: torch.Tensor  # Q [N_b, R], the block's module inducing inputs' side


class _ExpSiteGram(torch.autograd.Function):
    """:class:`_SiteGram` with K_*b = exp(P Qᵀ) formed inside from its factors: one autograd
    step per block, and the backward K̄_*b ∘ K_*b = Ē in place, P̄ = Ē Q, Q̄ = Ēᵀ P (products
    whose outputs have R rows). Q is used as a contiguous Qᵀ [R, N_b]: both thin products then
    read contiguous operands, twice as fast for P̄ as through the transposed view of Q."""

    @staticmethod
    def forward(ctx, left: torch.Tensor, right: torch.Tensor, inverse_chol: torch.Tensor,
                prior_chol: torch.Tensor, roots: torch.Tensor, sign: torch.Tensor | None,
                shift: torch.Tensor):
        right = right.mT.contiguous().mT
        cross_t = exp_of_product(left.unsqueeze(0), right.unsqueeze(0)).squeeze(0)
        precision, projected, signed_t = _site_gram(cross_t, inverse_chol, roots, sign, shift)
        ctx.save_for_backward(left, right, cross_t, signed_t, inverse_chol, prior_chol,
                              precision, roots, shift)
        return precision, projected

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_precision: torch.Tensor, grad_projected: torch.Tensor):
        left, right, cross_t, *algebra = ctx.saved_tensors
        grad_cross_t, grad_inverse = _site_gram_backward(grad_precision, grad_projected,
                                                         *algebra)
        grad_exponent = grad_cross_t.mul_(cross_t)
        return (*exponent_gradients(grad_exponent, left, right), grad_inverse, None, None, None,
                None)


#: The terms of one block of the stacked site layout: K_*b [M, N_b] (position-major; or its
#: :class:`ExpFactors`), R_k [M_k, M_k, G_b] (R_g[a, b] at [a, b, g]), s [N_b] (None: no −1;
#: an s = 0 has a zero column of R_k, which +1 leaves zero) and b [N_b].
BlockTerms = tuple[torch.Tensor | ExpFactors, torch.Tensor, torch.Tensor | None, torch.Tensor]


def site_quadratic(blocks: Iterable[BlockTerms], prior_chol: torch.Tensor,
                   site_trace: torch.Tensor, site_constant: torch.Tensor) -> ContrastiveQuadratic:
    """The quadratic form of the contrastive sum from the site parameters of all modules at once.

    With the N = Σ_k M_k module inducing inputs stacked, K_·* = [K_1*; …; K_K*] [N, M] and the
    site precisions in factored form P_k = R_k diag(s_k) R_kᵀ (s = ±1, 0):
    P_w = Σ_k B_kP_kB_kᵀ = Aᵀ diag(s) A with A = blockdiag(R_kᵀ) K_·* L_**⁻ᵀ [N, M], a Gram of A —
    positive semi-definite in floating point for PSD sites, however ill-conditioned K_** and
    K_kk^{(k)} are (L_**⁻¹(K_*·PK_·*)L_**⁻ᵀ, the same matrix formed the other way round, loses
    that to rounding and can make a bounded bound look unbounded). η_w = L_**⁻¹K_*· b and, as
    Σ_k tr(P_k B_kᵀB_k) = tr(P_w), c = −½[Σ_k tr(P_k K_kk^{(*)}) − tr(P_w) + Σ_k constant_k].

    The modules come in blocks of one M_k each (:class:`pyrogp_models.modules.stack.SiteBlock`),
    summed; ``blocks`` may be a generator that forms each block's K_*b just before it is used,
    so that a block's products run in cache, or give K_*b = exp(PQᵀ) as :class:`ExpFactors`
    (the RBF), formed inside the block's one autograd step. Per block the forward is M_k passes
    for the block product, one product with L_**⁻¹ and the Gram product; the backward one
    product and M_k passes — linear in N.

    Args:
        blocks: (K_*b or its ExpFactors, R, s, b) per block (:data:`BlockTerms`; R, s, b
            constants; s = None when no sign is −1, which saves a pass).
        prior_chol: L_** [M, M].
        site_trace: Σ_k tr(P_k K_kk^{(*)}) [].
        site_constant: Σ_k (the constants of :class:`SiteParameters`) [].
    """
    size = prior_chol.shape[-1]
    eye = torch.eye(size, dtype=prior_chol.dtype, device=prior_chol.device)
    inverse_chol = _padded_rows(triangular_solve(prior_chol, eye))  # L_**⁻¹, rows padded
    precision, projected = 0.0, 0.0
    for cross, roots, sign, shift in blocks:
        constants = (prior_chol.detach(), roots.detach(),
                     None if sign is None else sign.detach(), shift.detach())
        if isinstance(cross, ExpFactors):
            part, part_projected = _ExpSiteGram.apply(cross.left, cross.right, inverse_chol,
                                                      *constants)
        else:
            part, part_projected = _SiteGram.apply(cross.contiguous(), inverse_chol, *constants)
        precision, projected = precision + part, projected + part_projected
    precision = precision[:size, :size]
    whitened_shift = triangular_solve(prior_chol, projected.unsqueeze(-1)).squeeze(-1)
    constant = -0.5 * (site_trace - precision.diagonal().sum() + site_constant)
    return ContrastiveQuadratic(precision, whitened_shift, constant)


def evaluate_quadratic(quadratic: ContrastiveQuadratic, mean: torch.Tensor, chol: torch.Tensor
                       ) -> torch.Tensor:
    """−½tr(P S) − ½mᵀPm + ηᵀm + c at q = N(m, S = LLᵀ)."""
    precision, shift, constant = quadratic
    spread = (precision @ chol * chol).sum()
    return (-0.5 * (spread + mean @ precision @ mean) + shift @ mean + constant)
