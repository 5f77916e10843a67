"""Window functions of the distributed squared-exponential kernel (the slides' split of k).

Writing the SE kernel as a feature integral k(x, x') = ∫ φ(x, z) φ(x', z) dz and cutting the
z-axis at a_1 = −∞ < a_2 < … < a_{J+1} = ∞ splits it into local kernels (slide "Each k_j(x,x')"):

    k_j(x, x') = k(x, x') · ½[erfc(s_j) − erfc(s_{j+1})],   s_j = (a_j − x̄)/(ℓ/√2),  x̄ = (x+x')/2,

which equals k(x, x') · w_j(x̄) with the window

    w_j(x̄) = Φ((a_{j+1} − x̄)/(ℓ/2)) − Φ((a_j − x̄)/(ℓ/2)) = P[z ∈ [a_j, a_{j+1})],  z ~ N(x̄, ℓ²/4).

For an ARD kernel and an axis-aligned box the window is the product of the per-dimension ones.
Windows are returned in log space. They are computed as differences of normal CDFs mirrored so
that only upper tails are ever subtracted (relative accuracy ~1e−16 where the slide's erfc
difference cancels), from ``erfc`` rather than ``torch.special.ndtr`` (which loses the lower
tail), and in log space from ``log_ndtr`` where the tails underflow. The gradient is analytic.
"""

from __future__ import annotations

import math

import torch

_LOG_HALF = math.log(0.5)
_SQRT_HALF = math.sqrt(0.5)


def normal_cdf(x: torch.Tensor) -> torch.Tensor:
    """Φ(x) = ½ erfc(−x/√2), accurate to a relative 1e−16 in the lower tail.

    (``torch.special.ndtr`` computes ½(1 + erf(x/√2)) there: 6.1e−16 instead of 6.2e−16 at
    x = −8 and 0 from x ≈ −8.3 on, so it cannot give small windows.)
    """
    return 0.5 * torch.special.erfc(-_SQRT_HALF * x)


def _log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 − eᕽ) for x < 0, accurate at both ends (Mächler 2012); both branches kept finite."""
    near = x > _LOG_HALF
    x_near = torch.where(near, x, torch.full_like(x, -1.0))
    x_far = torch.where(near, torch.full_like(x, -1.0), x)
    return torch.where(near, torch.log(-torch.expm1(x_near)), torch.log1p(-torch.exp(x_far)))


def _log_interval_mass_value(lo: torch.Tensor, hi: torch.Tensor, centre: torch.Tensor,
                             scale: torch.Tensor) -> torch.Tensor:
    """log P[z ∈ [lo, hi)] for z ~ N(centre, scale²) (forward only, no graph).

    With a = (lo − centre)/scale, b = (hi − centre)/scale, mirrored (a, b) → (−b, −a) where the
    interval lies left of the centre (b < 0), so that only two regimes remain:

    - interval right of the centre (a > 0):  w = Φ(−a) − Φ(−b), a difference of two upper tails,
      each accurate to a relative 1e−16, so no catastrophic cancellation (the slide's erfc form
      subtracts two numbers close to 2 there);
    - centre inside (a ≤ 0 ≤ b):              w = 1 − Φ(a) − Φ(−b), two masses ≤ ½ each.

    Where Φ(−a) would underflow (a > 25) the first regime is recomputed in log space,
    log w = log Φ(−a) + log(1 − exp(log Φ(−b) − log Φ(−a))), from ``log_ndtr``. Infinite faces
    need no special case here: Φ(−∞) = 0.
    """
    a = (lo - centre) / scale
    b = (hi - centre) / scale
    flip = b < 0
    a, b = torch.where(flip, -b, a), torch.where(flip, -a, b)
    right = a > 0
    tail_a = normal_cdf(-a.abs())
    tail_b = normal_cdf(-b)
    log_w = torch.log(torch.where(right, tail_a - tail_b, 1.0 - tail_a - tail_b))
    far = right & (a > 25.0)
    if bool(far.any()):
        log_a = torch.special.log_ndtr(-a[far])
        log_b = torch.special.log_ndtr(-b[far])
        log_w[far] = log_a + _log1mexp((log_b - log_a).clamp_max(-1e-300))
    return log_w


_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


class _LogIntervalMass(torch.autograd.Function):
    """log P[z ∈ [lo, hi)] with an analytic backward pass.

    With a = (lo − c)/s, b = (hi − c)/s and w = Φ(b) − Φ(a): ∂log w/∂lo = −φ(a)/(s w),
    ∂log w/∂hi = φ(b)/(s w), ∂log w/∂c = (φ(a) − φ(b))/(s w), ∂log w/∂s = (aφ(a) − bφ(b))/(s w);
    the ratios φ/w are exp(log φ − log w), finite in the far tails because log w is. Infinite faces
    contribute φ = 0. The forward pass keeps no graph, which makes the window a few times cheaper
    than differentiating through the branch selection.
    """

    @staticmethod
    def forward(ctx, lo, hi, centre, scale):
        value = _log_interval_mass_value(lo, hi, centre, scale)
        ctx.save_for_backward(lo, hi, centre, scale, value)
        return value

    @staticmethod
    def backward(ctx, grad):
        lo, hi, centre, scale, value = ctx.saved_tensors
        lo_inf = torch.isneginf(lo)
        hi_inf = torch.isposinf(hi)
        a = (torch.where(lo_inf, 0.0, lo) - centre) / scale
        b = (torch.where(hi_inf, 0.0, hi) - centre) / scale
        ratio_a = torch.where(lo_inf, 0.0, torch.exp(-0.5 * a.square() - _LOG_SQRT_2PI - value))
        ratio_b = torch.where(hi_inf, 0.0, torch.exp(-0.5 * b.square() - _LOG_SQRT_2PI - value))
        g = grad / scale
        grads = [None, None, None, None]
        if ctx.needs_input_grad[0]:
            grads[0] = (-g * ratio_a).sum_to_size(lo.shape)
        if ctx.needs_input_grad[1]:
            grads[1] = (g * ratio_b).sum_to_size(hi.shape)
        if ctx.needs_input_grad[2]:
            grads[2] = (g * (ratio_a - ratio_b)).sum_to_size(centre.shape)
        if ctx.needs_input_grad[3]:
            grads[3] = (g * (a * ratio_a - b * ratio_b)).sum_to_size(scale.shape)
        return tuple(grads)


def log_interval_mass(lo: torch.Tensor, hi: torch.Tensor, centre: torch.Tensor,
                      scale: torch.Tensor) -> torch.Tensor:
    """log P[z ∈ [lo, hi)] for z ~ N(centre, scale²), elementwise with broadcasting; ``lo`` may be
    −∞ and ``hi`` +∞. Stable in the far tails (see ``_log_interval_mass_value``), with an
    analytic gradient (``_LogIntervalMass``)."""
    scale = torch.as_tensor(scale, dtype=centre.dtype, device=centre.device)
    lo = torch.as_tensor(lo, dtype=centre.dtype, device=centre.device)
    hi = torch.as_tensor(hi, dtype=centre.dtype, device=centre.device)
    return _LogIntervalMass.apply(lo, hi, centre, scale)


def log_box_mass(lo: torch.Tensor, hi: torch.Tensor, centre: torch.Tensor,
                 scale: torch.Tensor) -> torch.Tensor:
    """log P[z ∈ box] = Σ_d log P[z_d ∈ [lo_d, hi_d)] for z ~ N(centre, diag(scale²)); the last
    dimension of the arguments is the input dimension and is summed out."""
    return log_interval_mass(lo, hi, centre, scale).sum(-1)


def log_window(points: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor,
               lengthscale: torch.Tensor) -> torch.Tensor:
    """log w_j(x̄) of every box at every point: points [..., D], boxes lo/hi [J, D] → [..., J].

    The window of the SE kernel uses scale ℓ_d/2: ½ erfc((a − x̄)/(ℓ/√2)) = 1 − Φ((a − x̄)/(ℓ/2)).
    """
    return log_box_mass(lo, hi, points.unsqueeze(-2), 0.5 * lengthscale)


def window(points: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor,
           lengthscale: torch.Tensor) -> torch.Tensor:
    """w_j(x̄) = exp(log w_j(x̄)); rows sum to one over a partition of space."""
    return log_window(points, lo, hi, lengthscale).exp()


def erfc_window(points: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor,
                lengthscale: torch.Tensor) -> torch.Tensor:
    """The slide's form ½[erfc(s_j) − erfc(s_{j+1})], s = (a − x̄)/(ℓ/√2), per dimension and
    multiplied over dimensions. Reference only: it cancels catastrophically in the far tails."""
    x = points.unsqueeze(-2)
    scale = lengthscale / math.sqrt(2.0)
    s_lo = (lo - x) / scale
    s_hi = (hi - x) / scale
    return (0.5 * (torch.special.erfc(s_lo) - torch.special.erfc(s_hi))).prod(-1)


def halo_radius(lengthscale: torch.Tensor, eps: float) -> torch.Tensor:
    """h_d = (ℓ_d/2) Φ⁻¹(1 − ε): a point farther than h_d from a box along any dimension has
    window w_j ≤ ε there."""
    if not 0.0 < eps < 0.5:
        raise ValueError(f"halo threshold eps must lie in (0, 0.5), got {eps}")
    quantile = -torch.special.ndtri(torch.tensor(eps, dtype=torch.float64))
    return 0.5 * lengthscale * quantile.to(lengthscale)
