"""Natural-gradient steps for the whitened q(v) = N(m, S) of every sparse-GP layer of a model.

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
half its diagonal (Murray 2016, "Differentiation of the Cholesky decomposition"); chol(P'⁻¹) comes
from :func:`~pyrogp_models.gaussian.linalg.inverse_cholesky`.

Since the whitened KL contributes ½(S⁻¹ − I) to G, P' = (1 − γ)S⁻¹ + γ(I − 2∂E/∂S) with E the
rest of the objective. Where E is a concave quadratic in q — a Gaussian likelihood, a meta-GP's
contrastive terms — a unit step puts q(v) at its optimum for the current hyperparameters (the
collapsed bound is then attained) and every γ ≤ 1 raises the ELBO. Where it is not (Bernoulli,
Poisson, … likelihoods) a unit step can overshoot and cycle, so the layer's owner names a
per-member objective and the step is *safeguarded*: every member keeps its own step size, a step
that would lower its objective is not taken and halves the size, a step taken doubles it again
(up to γ). Members whose new precision is not positive definite keep their q as well. All of it
is batched over members with ``torch.where``: no value is read back to the host.

A model declares its layers' objectives by ``natural_gradient_objectives()``: a list of
(layer, objective) pairs, objective ``None`` for a conjugate layer, a
:class:`~pyrogp_models.layers.ClosedFormGradients` for a conjugate layer whose data term E the
model differentiates itself (g = ∂E/∂m, G_E = ∂E/∂S; the whitened KL adds −m and ½(S⁻¹ − I):
no evaluation of the loss and no backward pass), a callable returning the per-member objective
(broadcastable to the layer's batch shape), or :data:`OPTIMISER` for a layer whose q(v) the
optimiser takes with the other parameters (e.g. the inner layers of a deep GP).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from pyrogp_models.inference.protocols import NaturalGradientLayers

from pyrogp_models.gaussian.linalg import inverse_cholesky, triangular_solve
from pyrogp_models.layers import ClosedFormGradients, SparseGPLayer, variational_layers

#: Relative decrease of a member's objective that the safeguard treats as rounding.
OBJECTIVE_TOLERANCE = 1e-12

#: The declared objective of a layer left to the optimiser (no natural-gradient step).
OPTIMISER = "optimiser"

Objective = Callable[[], torch.Tensor] | ClosedFormGradients | None


class NaturalGradient:
    """A pre-step hook of :func:`pyrogp_models.inference.trainer.train`: one natural-gradient step
    of size ``gamma`` on q(v) of every variational layer of ``module``; ``parameters`` are the ones
    it moves (the optimiser takes the others)."""

    def __init__(self, module: torch.nn.Module, gamma: float):
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"the natural-gradient step size must be in (0, 1], got {gamma}")
        self.gamma = gamma
        self.targets = _objectives(module)
        self.parameters = [p for layer, _ in self.targets for p in layer.variational_parameters()]
        self.steps: dict[int, torch.Tensor] = {}  # per safeguarded layer: step size per member

    def __call__(self, loss_fn: Callable[[], torch.Tensor]) -> None:
        """One step on every target layer; ``loss_fn`` (−L) is evaluated and differentiated only
        if a layer's gradients are not declared in closed form."""
        by_autograd = [(layer, objective) for layer, objective in self.targets
                       if not isinstance(objective, ClosedFormGradients)]
        grads = iter(torch.autograd.grad(
            loss_fn(), [p for layer, _ in by_autograd for p in layer.variational_parameters()])
            if by_autograd else ())
        for layer, objective in self.targets:
            if isinstance(objective, ClosedFormGradients):
                with torch.no_grad():
                    self._step(layer, None, closed_form_direction(layer, objective))
                continue
            mean_grad, sqrt_grad = next(grads), next(grads)
            with torch.no_grad():
                # the loss is −L; q_mean is unconstrained
                direction = (-mean_grad, -covariance_gradient(layer.q_sqrt, sqrt_grad))
                self._step(layer, objective, direction)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The safeguarded layers' step sizes, by layer position (for checkpoints)."""
        return {str(index): self.steps[id(layer)] for index, (layer, _) in enumerate(self.targets)
                if id(layer) in self.steps}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore every layer's per-member step sizes from a checkpoint."""
        for index, (layer, _) in enumerate(self.targets):
            if str(index) in state:
                self.steps[id(layer)] = state[str(index)]

    def _step(self, layer: SparseGPLayer, objective: Objective,
              direction: tuple[torch.Tensor, torch.Tensor]) -> None:
        # a joint q is one Gaussian over all T = |B|·M whitened values: step on its flat mean
        mean, chol = _flat_mean(layer, layer.q_mean).clone(), layer.q_sqrt.clone()
        direction = (_flat_mean(layer, direction[0]), direction[1])
        if objective is None:
            new_mean, new_chol, ok = natural_update(mean, chol, *direction, self.gamma)
            _assign(layer, ok, (new_mean, new_chol), (mean, chol))
            return
        before = objective()
        gamma = self.steps.get(id(layer))
        if gamma is None:
            gamma = torch.full(before.shape, self.gamma, dtype=mean.dtype, device=mean.device)
        size = _member_values(gamma, mean.shape[:-1])
        new_mean, new_chol, ok = natural_update(mean, chol, *direction, size)
        _assign(layer, ok, (new_mean, new_chol), (mean, chol))
        after = objective()
        rises = (after >= before - OBJECTIVE_TOLERANCE * before.abs()) & torch.isfinite(after)
        keep = _member_values(rises, mean.shape[:-1]) & ok
        _assign(layer, keep, (new_mean, new_chol), (mean, chol))
        self.steps[id(layer)] = torch.where(rises, (2.0 * gamma).clamp_max(self.gamma),
                                            0.5 * gamma)


def _objectives(module: torch.nn.Module) -> list[tuple[SparseGPLayer, Objective]]:
    """(layer, objective) for every variational layer, from the owners' declarations."""
    layers = variational_layers(module)
    if not layers:
        raise ValueError(f"natural gradients need a sparse-GP layer with a variational q(u); "
                         f"{type(module).__name__} has none (a collapsed bound's q is optimal "
                         "already)")
    declared: dict[int, Objective] = {}
    for owner in module.modules():
        if isinstance(owner, NaturalGradientLayers):
            declared.update({id(layer): objective
                             for layer, objective in owner.natural_gradient_objectives()})
    missing = [layer for layer in layers if id(layer) not in declared]
    if missing:
        raise ValueError(f"{type(module).__name__} does not declare the objective of its "
                         "sparse-GP layers (natural_gradient_objectives)")
    return [(layer, declared[id(layer)]) for layer in layers
            if not isinstance(declared[id(layer)], str) or declared[id(layer)] != OPTIMISER]


def _member_values(values: torch.Tensor, batch_shape: torch.Size) -> torch.Tensor:
    """Per-member values [*B'] broadcast against a layer's batch [*B] (trailing ones added)."""
    return values.reshape(values.shape + (1,) * (len(batch_shape) - values.dim())
                          ).expand(batch_shape)


def _assign(layer: SparseGPLayer, take: torch.Tensor, new: tuple, old: tuple) -> None:
    """q ← new where ``take`` [*B], else old."""
    layer.set_whitened_posterior(torch.where(take.unsqueeze(-1), new[0], old[0]),
                                 torch.where(take.unsqueeze(-1).unsqueeze(-1), new[1], old[1]))


def _flat_mean(layer: SparseGPLayer, mean: torch.Tensor) -> torch.Tensor:
    """q_mean [*B, M] (or its gradient) as the [T] mean of a joint q; as it is for mean-field."""
    return mean.reshape(-1) if layer.covariance == "joint" else mean


def closed_form_direction(layer: SparseGPLayer, objective: ClosedFormGradients
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """(∂L/∂m, ∂L/∂S) from the data term's declared gradients and the whitened KL's:
    ∂(−KL)/∂m = −m, ∂(−KL)/∂S = ½(S⁻¹ − I)."""
    data_mean, data_cov = objective.gradients()
    chol = layer.q_sqrt
    identity = torch.eye(chol.shape[-1], dtype=chol.dtype, device=chol.device)
    return (data_mean - layer.q_mean.reshape(data_mean.shape),
            data_cov + 0.5 * (torch.cholesky_inverse(chol) - identity))


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
                   cov_grad: torch.Tensor, gamma: float | torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(m', chol S', ok) after θ ← θ + γ∂L/∂η, given m [..., M], L = chol S [..., M, M],
    g = ∂L/∂m, symmetric G = ∂L/∂S and γ (a number, or one per member [...]). ``ok`` [...] is
    False where the new precision is not positive definite (m', S' are then not finite)."""
    precision = torch.cholesky_inverse(chol)
    step = torch.as_tensor(gamma, dtype=mean.dtype, device=mean.device).expand(mean.shape[:-1])
    new_precision = precision - 2.0 * step[..., None, None] * cov_grad
    new_chol = inverse_cholesky(0.5 * (new_precision + new_precision.mT), check=False)
    direction = (new_chol @ (new_chol.mT @ mean_grad.unsqueeze(-1))).squeeze(-1)
    new_mean = mean + step.unsqueeze(-1) * direction
    ok = torch.isfinite(new_chol).all(-1).all(-1) & torch.isfinite(new_mean).all(-1)
    return new_mean, new_chol, ok
