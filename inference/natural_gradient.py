"""Natural-gradient steps for the whitened q(v) = N(m, S) of batched sparse variational GPs.

The natural gradient of the ELBO L with respect to the natural parameters θ = (S⁻¹m, −½S⁻¹) of a
Gaussian is its ordinary gradient with respect to the expectation parameters η = (m, S + mmᵀ)
(Hensman, Fusi & Lawrence 2013, "Gaussian processes for big data"; Salimbeni, Eleftheriadis &
Hensman 2018, "Natural gradients in practice: non-conjugate variational inference in Gaussian
process models"), so a step of size γ is

    θ ← θ + γ ∂L/∂η.

With g = ∂L/∂m and the symmetric G = ∂L/∂S, the chain rule through m = η₁, S = η₂ − η₁η₁ᵀ gives
∂L/∂η₁ = g − 2Gm and ∂L/∂η₂ = G, so the step is

    P' = S⁻¹ − 2γG,        m' = m + γ P'⁻¹g        (P' = S'⁻¹, the new precision).

Written this way η₂ = S + mmᵀ is never formed (it would lose the digits of a small S under a large
mmᵀ). The ELBO sees q_sqrt = L only through S = LLᵀ, so G follows from ∂L/∂L by the reverse-mode
rule of the Cholesky factorisation, G = sym(L⁻ᵀ Φ(LᵀḠ_L) L⁻¹) with Φ the lower triangle with
half its diagonal (Murray 2016, "Differentiation of the Cholesky decomposition"). chol(P'⁻¹) is
obtained from the Cholesky factor of the reversed P' without forming an inverse.

Since the whitened KL contributes ½(S⁻¹ − I) to G, P' = (1 − γ)S⁻¹ + γ(I − 2∂E/∂S) with E the
expected log-likelihood: for a Gaussian likelihood and γ = 1 one step puts q(v) at its optimum
for the current hyperparameters (the collapsed bound of Titsias 2009 is then attained), and for
a likelihood that is log-concave in each latent function P' is positive definite for every
γ ≤ 1. Where P' of some q(v_kl) is nevertheless not positive definite (rounding, or a likelihood
without that property), γ is halved for that q(v_kl) only, up to ``max_halvings`` times; after
that the step fails with a :class:`FloatingPointError`. Partitions are independent terms of the
loss, so a step is batched over partitions and latent functions with no loop over them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pyrogp_models.collapsed import CollapsedSVGP
from pyrogp_models.linalg import triangular_solve
from pyrogp_models.svgp import BatchedSVGP


def variational_groups(module: torch.nn.Module) -> list[BatchedSVGP]:
    """Every :class:`BatchedSVGP` of ``module`` whose q(v) is part of the training objective.

    Raises ValueError if there is none, or if some group is trained on the collapsed bound
    (its q(u) is implicit and optimal already)."""
    if any(isinstance(m, CollapsedSVGP) for m in module.modules()):
        raise ValueError("natural gradients apply to q(u) of the uncollapsed ELBO; this module "
                         "is trained on the collapsed bound, whose q(u) is already optimal")
    groups = [m for m in module.modules() if isinstance(m, BatchedSVGP)]
    if not groups:
        raise ValueError(f"natural gradients need a module with BatchedSVGP groups; "
                         f"{type(module).__name__} has none")
    return groups


def variational_parameters(groups: list[BatchedSVGP]) -> list[torch.nn.Parameter]:
    """The unconstrained parameters of every q(v): what the natural-gradient step updates."""
    return [p for g in groups for p in (g.q_mean_unconstrained, g.q_sqrt_unconstrained)]


def natural_gradient_step(loss_fn: Callable[[], torch.Tensor], groups: list[BatchedSVGP],
                          gamma: float, max_halvings: int = 20) -> torch.Tensor:
    """One natural-gradient step of size ``gamma`` on q(v) of every group (module docstring).

    ``loss_fn()`` returns the negative ELBO summed over partitions; only q's parameters are
    changed. Returns the loss before the step (detached).
    """
    loss = loss_fn()
    grads = torch.autograd.grad(loss, variational_parameters(groups))
    with torch.no_grad():
        for group, mean_grad, sqrt_grad in zip(groups, grads[0::2], grads[1::2], strict=True):
            mean, chol = group.q_mean, group.q_sqrt
            # q_mean is unconstrained; the loss is −L.
            new_mean, new_chol = natural_update(
                mean, chol, -mean_grad, -covariance_gradient(chol, sqrt_grad),
                gamma, max_halvings)
            group.q_mean = new_mean
            group.q_sqrt = new_chol
    return loss.detach()


def covariance_gradient(chol: torch.Tensor, raw_gradient: torch.Tensor) -> torch.Tensor:
    """Symmetric ∂f/∂S for f depending on S = LLᵀ only, from the gradient with respect to the
    unconstrained parameter of L (lower_cholesky constraint: L = tril(L̃, −1) + diag(exp diag L̃))."""
    chol_gradient = (raw_gradient.tril(-1) + (raw_gradient.diagonal(dim1=-2, dim2=-1)
                                              / chol.diagonal(dim1=-2, dim2=-1)).diag_embed())
    inner = chol.mT @ chol_gradient
    phi = inner.tril(-1) + 0.5 * inner.diagonal(dim1=-2, dim2=-1).diag_embed()
    half = triangular_solve(chol, triangular_solve(chol, phi, transpose=True).mT, transpose=True)
    return 0.5 * (half + half.mT)  # half = (L⁻ᵀΦL⁻¹)ᵀ


def natural_update(mean: torch.Tensor, chol: torch.Tensor, mean_grad: torch.Tensor,
                   cov_grad: torch.Tensor, gamma: float, max_halvings: int = 20
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(m', chol S') after θ ← θ + γ∂L/∂η, given m [..., M], L = chol S [..., M, M],
    g = ∂L/∂m and symmetric G = ∂L/∂S; γ is halved for each batch member whose new precision
    is not positive definite."""
    precision = torch.cholesky_inverse(chol)
    step = torch.full(mean.shape[:-1], float(gamma), dtype=mean.dtype, device=mean.device)
    for _ in range(max_halvings + 1):
        new_precision = precision - 2.0 * step[..., None, None] * cov_grad
        new_precision = 0.5 * (new_precision + new_precision.mT)
        # chol(JPJ) = R with J the reversal: P⁻¹ = (J R⁻ᵀ J)(J R⁻ᵀ J)ᵀ, and J R⁻ᵀ J is lower.
        reversed_factor, info = torch.linalg.cholesky_ex(new_precision.flip((-2, -1)))
        failed = (info > 0) | ~torch.isfinite(reversed_factor).all(-1).all(-1)
        if not bool(failed.any()):
            break
        step = torch.where(failed, 0.5 * step, step)
    else:
        raise FloatingPointError(
            f"natural-gradient step: the new precision of q(u) is not positive definite even "
            f"with the step size {gamma:g} halved {max_halvings} times")
    eye = torch.eye(mean.shape[-1], dtype=mean.dtype, device=mean.device)
    new_chol = triangular_solve(reversed_factor, eye).mT.flip((-2, -1))
    direction = (new_chol @ (new_chol.mT @ mean_grad.unsqueeze(-1))).squeeze(-1)
    return mean + step.unsqueeze(-1) * direction, new_chol
