"""Correlation profiles ρ(r²) of the stationary kernels with their slopes dρ/dr², each formed as
one autograd step: a stationary covariance σ²ρ(r²) costs a few elementwise passes forward and one
backward, instead of an autograd node per operation (a dozen saved [N, M] intermediates).

With scaled inputs x̃ = x/ℓ, z̃ = z/ℓ and r²_nm = ‖x̃_n − z̃_m‖², the backward needs only the
slope: G = ρ̄ ∘ ρ'(r²), x̃̄_n = 2(Σ_m G_nm x̃_n − Σ_m G_nm z̃_m), z̃̄_m = 2(Σ_n G_nm z̃_m − Σ_n G_nm x̃_n).

The Matérn slopes have no 1/r except for ν = 1/2: with s = √(2ν) r,
ρ'_{3/2} = −(3/2) e^{−s} and ρ'_{5/2} = −(5/6)(1 + s) e^{−s}; ρ'_{1/2} = −e^{−r}/(2r) is taken
as 0 where r² is below :data:`MIN_SQUARED_DISTANCE` (r² is raised to it there, as a clamp
would).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.autograd.function import once_differentiable

from pyrogp_models.gaussian.exp_product import LOG2_E

#: Smallest squared distance fed to a square root with a 1/r slope (Matérn 1/2).
MIN_SQUARED_DISTANCE = 1e-36

#: (r², shape parameter or None) ↦ (ρ, dρ/dr², dρ/dα or None).
ValueAndSlope = Callable[[torch.Tensor, torch.Tensor | None],
                         tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]


def _decay(s: torch.Tensor) -> torch.Tensor:
    """e^{−s} as 2^{−s log₂e} (torch's base-2 exponential is the faster), a new tensor."""
    return torch.mul(s, -LOG2_E).exp2_()


def _rbf(r2: torch.Tensor, shape: None = None
         ) -> tuple[torch.Tensor, torch.Tensor, None]:
    """ρ = exp(−r²/2), ρ' = −ρ/2."""
    value = _decay(r2.mul_(0.5))
    return value, value.mul(-0.5), None


def _matern12(r2: torch.Tensor, shape: None = None
              ) -> tuple[torch.Tensor, torch.Tensor, None]:
    """ρ = exp(−r), ρ' = −ρ/(2r) (0 below the smallest squared distance)."""
    r = r2.clamp_min(MIN_SQUARED_DISTANCE).sqrt_()
    value = _decay(r)
    slope = value.div(r.mul_(-2.0)).masked_fill_(r2 < MIN_SQUARED_DISTANCE, 0.0)
    return value, slope, None


def _matern32(r2: torch.Tensor, shape: None = None
              ) -> tuple[torch.Tensor, torch.Tensor, None]:
    """ρ = (1 + s) e^{−s}, ρ' = −(3/2) e^{−s}, s = √3 r."""
    s = r2.mul_(3.0).sqrt_()
    decay = _decay(s)
    return s.add_(1.0).mul_(decay), decay.mul_(-1.5), None


def _matern52(r2: torch.Tensor, shape: None = None
              ) -> tuple[torch.Tensor, torch.Tensor, None]:
    """ρ = (1 + s + s²/3) e^{−s}, ρ' = −(5/6)(1 + s) e^{−s}, s = √5 r."""
    s = r2.mul_(5.0).sqrt_()
    decay = _decay(s)
    value = s.div(3.0).add_(1.0).mul_(s).add_(1.0).mul_(decay)
    return value, s.add_(1.0).mul_(decay).mul_(-5.0 / 6.0), None


def _rational_quadratic(r2: torch.Tensor, alpha: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ρ = exp(−α log1p(u)), u = r²/(2α): ρ' = −½ρ/(1 + u), dρ/dα = ρ(u/(1 + u) − log1p(u))
    (:mod:`pyrogp_models.kernels.rational_quadratic`)."""
    u = r2.div_(2.0 * alpha)
    log_term = torch.log1p(u)
    value = torch.mul(log_term, alpha * -LOG2_E).exp2_()
    inverse = u.add_(1.0).reciprocal_()                                     # 1/(1 + u)
    by_alpha = torch.sub(1.0, inverse).sub_(log_term).mul_(value)
    return value, inverse.mul_(value).mul_(-0.5), by_alpha


#: ρ and its slopes for each stationary family, from r² [...] (run without autograd; they
#: overwrite r²). The rational quadratic takes its shape α [*batch, 1, 1].
VALUES_AND_SLOPES: dict[str, ValueAndSlope] = {
    "rbf": _rbf,
    "matern12": _matern12,
    "matern32": _matern32,
    "matern52": _matern52,
    "rq": _rational_quadratic,
}


def scaled_inputs(X: torch.Tensor, Z: torch.Tensor, lengthscale: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(X − c)/ℓ and (Z − c)/ℓ [*batch, N|M, D] with c the mean of Z (held constant):
    differences do not change, and their expanded squares (or angles) stay small far from the
    origin."""
    scale = lengthscale.unsqueeze(-2)
    centre = Z.detach().mean(-2, keepdim=True)
    return (X - centre) / scale, (Z - centre) / scale


#: Up to this many input dimensions r² is summed from differences (exact, two passes per
#: dimension); beyond, expanded as ‖x‖² + ‖z‖² − 2xᵀz (one product, four passes).
DIRECT_DIMENSIONS = 2


def squared_distances(X: torch.Tensor, Z: torch.Tensor) -> torch.Tensor:
    """r²_nm = ‖x_n − z_m‖² [*batch, N, M] for X [*batch, N, D], Z [*batch, M, D], without
    autograd."""
    if X.shape[-1] <= DIRECT_DIMENSIONS:
        r2 = (X[..., :, None, 0] - Z[..., None, :, 0]).square_()
        for d in range(1, X.shape[-1]):
            r2.add_((X[..., :, None, d] - Z[..., None, :, d]).square_())
        return r2
    r2 = torch.matmul(X, Z.mT).mul_(-2.0)
    r2.add_(X.square().sum(-1).unsqueeze(-1)).add_(Z.square().sum(-1).unsqueeze(-2))
    return r2.clamp_min_(0.0)


class _ProfileOfSquaredDistance(torch.autograd.Function):
    """ρ(r²) elementwise; r̄² = ρ̄ ∘ ρ'(r²)."""

    @staticmethod
    def forward(ctx, r2: torch.Tensor, family: str) -> torch.Tensor:
        value, slope, _ = VALUES_AND_SLOPES[family](r2.clone(), None)
        ctx.save_for_backward(slope)
        return value

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        (slope,) = ctx.saved_tensors
        return grad * slope, None


class _ScaledProfileOfInputs(torch.autograd.Function):
    """a_n ρ(‖x̃_n − z̃_m‖²) [*batch, N, M] from x̃ [*batch, N, D], z̃ [*batch, M, D], row scales
    a [*batch, N or 1, 1] and the profile's shape α (or None); ā_n = Σ_m ρ̄_nm ρ_nm,
    ᾱ = Σ ρ̄ ∘ a ∘ ∂ρ/∂α and G = ρ̄ ∘ a ∘ ρ' for the inputs (module docstring)."""

    @staticmethod
    def forward(ctx, X: torch.Tensor, Z: torch.Tensor, scale: torch.Tensor,
                shape: torch.Tensor | None, family: str) -> torch.Tensor:
        value, slope, by_shape = VALUES_AND_SLOPES[family](squared_distances(X, Z), shape)
        ctx.save_for_backward(X, Z, scale, shape, value, slope, by_shape)
        return value * scale

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        X, Z, scale, shape, value, slope, by_shape = ctx.saved_tensors
        needs_X, needs_Z, needs_scale, needs_shape, _ = ctx.needs_input_grad
        grad_X = grad_Z = grad_scale = grad_shape = None
        if needs_scale:
            grad_scale = (grad * value).sum(-1, keepdim=True).sum_to_size(scale.shape)
        G = grad * scale
        if needs_shape:
            grad_shape = (G * by_shape).sum((-2, -1), keepdim=True).sum_to_size(shape.shape)
        G.mul_(slope)
        if needs_X:
            grad_X = (X * G.sum(-1, keepdim=True) - G @ Z).mul_(2.0).sum_to_size(X.shape)
        if needs_Z:
            grad_Z = (Z * G.sum(-2).unsqueeze(-1) - G.mT @ X).mul_(2.0).sum_to_size(Z.shape)
        return grad_X, grad_Z, grad_scale, grad_shape, None


def profile(family: str, r2: torch.Tensor) -> torch.Tensor:
    """ρ(r²) of ``family`` elementwise, differentiable in r²."""
    return _ProfileOfSquaredDistance.apply(r2, family)


def scaled_profile_of_distances(family: str, X: torch.Tensor, Z: torch.Tensor,
                                scale: torch.Tensor, shape: torch.Tensor | None = None
                                ) -> torch.Tensor:
    """a_n ρ(‖x_n − z_m‖²) [*batch, N, M] of ``family`` for inputs already divided by their
    lengthscales, X [*batch, N, D] and Z [*batch, M, D], row scales a [*batch, N or 1, 1]
    (e.g. σ²√w_n) and the profile's shape [*batch, 1, 1] (the rational quadratic's α): one
    autograd step."""
    return _ScaledProfileOfInputs.apply(X, Z, scale, shape, family)


def profile_function(family: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """r² ↦ ρ(r²) for ``family``."""
    return lambda r2: profile(family, r2)
