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

With a non-conjugate likelihood a unit step can overshoot and cycle, so there the step is
safeguarded: γ is halved for every partition whose full-data ELBO the step would lower (one more
forward evaluation per step, two or more when some partition backtracks).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pyrogp_models.gaussian.linalg import triangular_solve
from pyrogp_models.models.local.collapsed import CollapsedSVGP
from pyrogp_models.models.local.svgp import BatchedSVGP


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


def split_parameters(module: torch.nn.Module
                     ) -> tuple[list[BatchedSVGP], list[torch.nn.Parameter]]:
    """(the :func:`variational_groups`, every other parameter of ``module``): natural-gradient
    steps move the groups' q(v), the optimiser the rest."""
    groups = variational_groups(module)
    natural = {id(p) for p in variational_parameters(groups)}
    return groups, [p for p in module.parameters() if id(p) not in natural]


def natural_gradient_step(loss_fn: Callable[[], torch.Tensor], groups: list[BatchedSVGP],
                          gamma: float, max_halvings: int = 20) -> torch.Tensor:
    """One natural-gradient step of size ``gamma`` on q(v) of every group (module docstring).

    ``loss_fn()`` returns the negative ELBO summed over partitions; only q's parameters are
    changed. For a non-conjugate likelihood the step is safeguarded (:func:`_ascending_update`).
    Returns the loss before the step (detached).
    """
    loss = loss_fn()
    grads = torch.autograd.grad(loss, variational_parameters(groups))
    with torch.no_grad():
        for group, mean_grad, sqrt_grad in zip(groups, grads[0::2], grads[1::2], strict=True):
            mean, chol = group.q_mean, group.q_sqrt
            # q_mean is unconstrained; the loss is −L.
            direction = (-mean_grad, -covariance_gradient(chol, sqrt_grad))
            if group.likelihood.name == "gaussian" or not hasattr(group, "data_X"):
                group.q_mean, group.q_sqrt = natural_update(mean, chol, *direction, gamma,
                                                            max_halvings)
            else:
                _ascending_update(group, direction, gamma, max_halvings)
    return loss.detach()


def _ascending_update(group: BatchedSVGP, direction: tuple[torch.Tensor, torch.Tensor],
                      gamma: float, max_halvings: int) -> None:
    """The step with γ halved for every partition whose full-data ELBO it would lower.

    With a Gaussian likelihood a step of γ ≤ 1 moves θ towards the optimum θ* along a line on
    which KL[q_θ ‖ q_θ*] decreases, so the ELBO rises; with a non-conjugate likelihood a unit step
    can overshoot and cycle (a Bernoulli fit on the sunspot labels alternates between two values
    of q). Partitions that do not rise after ``max_halvings`` halvings keep their q. ELBOs that
    need Monte Carlo draws are compared on the same draws."""
    # copies: assigning group.q_mean writes into the parameter that group.q_mean returns
    mean, chol = group.q_mean.clone(), group.q_sqrt.clone()
    before = _partition_elbo(group)
    precision = torch.cholesky_inverse(chol)
    step = torch.full(mean.shape[:-1], float(gamma), dtype=mean.dtype, device=mean.device)
    for _ in range(max_halvings + 1):
        new_mean, new_chol = natural_update(mean, chol, *direction, step, max_halvings,
                                            precision)
        group.q_mean, group.q_sqrt = new_mean, new_chol
        lower = _partition_elbo(group) < before - ELBO_TOLERANCE * before.abs()  # [K]
        if not bool(lower.any()):
            return
        step = torch.where(lower.unsqueeze(-1), 0.5 * step, step)
    keep = lower.reshape(-1, *[1] * (mean.dim() - 1))
    group.q_mean = torch.where(keep, mean, new_mean)
    group.q_sqrt = torch.where(keep.unsqueeze(-1), chol, new_chol)


#: Relative decrease of a partition's ELBO that the safeguarded step treats as rounding.
ELBO_TOLERANCE = 1e-12


def _partition_elbo(group: BatchedSVGP) -> torch.Tensor:
    """Every partition's ELBO on its full data [K], with the random state fixed so that Monte
    Carlo expectations of two calls use the same draws."""
    devices = [group.q_mean.device] if group.q_mean.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(0)
        return group.elbo(group.data_X, group.data_y, group.data_mask)


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
                   cov_grad: torch.Tensor, gamma: float | torch.Tensor, max_halvings: int = 20,
                   precision: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(m', chol S') after θ ← θ + γ∂L/∂η, given m [..., M], L = chol S [..., M, M],
    g = ∂L/∂m, symmetric G = ∂L/∂S and γ (a number, or one per batch member [...]); γ is halved
    for each batch member whose new precision is not positive definite. ``precision``: S⁻¹ if
    already computed."""
    precision = torch.cholesky_inverse(chol) if precision is None else precision
    step = torch.as_tensor(gamma, dtype=mean.dtype, device=mean.device).expand(
        mean.shape[:-1]).clone()
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
            f"with the step size halved {max_halvings} times")
    eye = torch.eye(mean.shape[-1], dtype=mean.dtype, device=mean.device)
    new_chol = triangular_solve(reversed_factor, eye).mT.flip((-2, -1))
    direction = (new_chol @ (new_chol.mT @ mean_grad.unsqueeze(-1))).squeeze(-1)
    return mean + step.unsqueeze(-1) * direction, new_chol
