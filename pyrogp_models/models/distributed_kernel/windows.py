"""Window functions of the distributed squared-exponential kernel (the slides' split of k).

Writing the SE kernel as a feature integral k(x, x') = ∫ φ(x, z) φ(x', z) dz and cutting the
z-axis at a_1 = −∞ < a_2 < … < a_{J+1} = ∞ splits it into local kernels (slide "Each k_j(x,x')"):

    k_j(x, x') = k(x, x') · ½[erfc(s_j) − erfc(s_{j+1})],   s_j = (a_j − x̄)/(ℓ/√2),  x̄ = (x+x')/2,

which equals k(x, x') · w_j(x̄) with the window

    w_j(x̄) = Φ((a_{j+1} − x̄)/(ℓ/2)) − Φ((a_j − x̄)/(ℓ/2)) = P[z ∈ [a_j, a_{j+1})],  z ~ N(x̄, ℓ²/4).

For an ARD kernel and an axis-aligned box the window is the product of the per-dimension ones.
Windows are differences of normal CDFs mirrored so that only upper tails are ever subtracted
(relative accuracy ~1e−16 where the slide's erfc difference cancels), computed from ``erfc``
rather than ``torch.special.ndtr`` (which loses the lower tail). They are computed in linear
space: a window underflows to 0 only where Φ(−a) does (a ≈ 37 in float64, 13 in float32), and
there k_j is below the smallest normal number anyway, so no branch (and no host read) is needed
for the far tails in any dtype. The gradient is analytic and finite everywhere, infinite faces
included.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import torch

_SQRT_HALF = math.sqrt(0.5)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def normal_cdf(x: torch.Tensor) -> torch.Tensor:
    """Φ(x) = ½ erfc(−x/√2), accurate to a relative 1e−16 in the lower tail.

    (``torch.special.ndtr`` computes ½(1 + erf(x/√2)) there: 6.1e−16 instead of 6.2e−16 at
    x = −8 and 0 from x ≈ −8.3 on, so it cannot give small windows.)
    """
    return 0.5 * torch.special.erfc(-_SQRT_HALF * x)


def _interval_mass_value(lo: torch.Tensor, hi: torch.Tensor, centre: torch.Tensor,
                         scale: torch.Tensor) -> torch.Tensor:
    """P[z ∈ [lo, hi)] for z ~ N(centre, scale²) (forward only, no graph).

    With a = (lo − centre)/scale, b = (hi − centre)/scale, mirrored (a, b) → (−b, −a) where the
    interval lies left of the centre (b < 0), so that only two regimes remain:

    - interval right of the centre (a > 0):  w = Φ(−a) − Φ(−b), a difference of two upper tails,
      each accurate to a relative 1e−16, so no catastrophic cancellation (the slide's erfc form
      subtracts two numbers close to 2 there);
    - centre inside (a ≤ 0 ≤ b):              w = 1 − Φ(a) − Φ(−b), two masses ≤ ½ each.

    Infinite faces need no special case: Φ(−∞) = 0.
    """
    a = (lo - centre) / scale
    b = (hi - centre) / scale
    flip = b < 0
    a, b = torch.where(flip, -b, a), torch.where(flip, -a, b)
    tail_a = normal_cdf(-a.abs())
    tail_b = normal_cdf(-b)
    return torch.where(a > 0, tail_a - tail_b, 1.0 - tail_a - tail_b)


class _IntervalMass(torch.autograd.Function):
    """P[z ∈ [lo, hi)] with an analytic backward pass.

    With a = (lo − c)/s, b = (hi − c)/s and w = Φ(b) − Φ(a): ∂w/∂lo = −φ(a)/s, ∂w/∂hi = φ(b)/s,
    ∂w/∂c = (φ(a) − φ(b))/s, ∂w/∂s = (aφ(a) − bφ(b))/s; infinite faces contribute φ = aφ(a) = 0.
    The forward pass keeps no graph, which makes the window a few times cheaper than
    differentiating through the branch selection.
    """

    @staticmethod
    def forward(ctx, lo, hi, centre, scale):
        ctx.save_for_backward(lo, hi, centre, scale)
        return _interval_mass_value(lo, hi, centre, scale)

    @staticmethod
    def backward(ctx, grad):
        lo, hi, centre, scale = ctx.saved_tensors
        lo_inf = torch.isneginf(lo)
        hi_inf = torch.isposinf(hi)
        a = (torch.where(lo_inf, 0.0, lo) - centre) / scale
        b = (torch.where(hi_inf, 0.0, hi) - centre) / scale
        density_a = torch.where(lo_inf, 0.0, _INV_SQRT_2PI * torch.exp(-0.5 * a.square()))
        density_b = torch.where(hi_inf, 0.0, _INV_SQRT_2PI * torch.exp(-0.5 * b.square()))
        g = grad / scale
        grads = [None, None, None, None]
        if ctx.needs_input_grad[0]:
            grads[0] = (-g * density_a).sum_to_size(lo.shape)
        if ctx.needs_input_grad[1]:
            grads[1] = (g * density_b).sum_to_size(hi.shape)
        if ctx.needs_input_grad[2]:
            grads[2] = (g * (density_a - density_b)).sum_to_size(centre.shape)
        if ctx.needs_input_grad[3]:
            grads[3] = (g * (a * density_a - b * density_b)).sum_to_size(scale.shape)
        return tuple(grads)


def interval_mass(lo: torch.Tensor, hi: torch.Tensor, centre: torch.Tensor,
                  scale: torch.Tensor) -> torch.Tensor:
    """P[z ∈ [lo, hi)] for z ~ N(centre, scale²), elementwise with broadcasting; ``lo`` may be
    −∞ and ``hi`` +∞ (see ``_interval_mass_value``), with an analytic gradient
    (``_IntervalMass``). Tensors of the centre's dtype and device."""
    return _IntervalMass.apply(lo, hi, centre, scale)


def box_mass(lo: torch.Tensor, hi: torch.Tensor, centre: torch.Tensor,
             scale: torch.Tensor) -> torch.Tensor:
    """P[z ∈ box] = Π_d P[z_d ∈ [lo_d, hi_d)] for z ~ N(centre, diag(scale²)); the last
    dimension of the arguments is the input dimension and is multiplied out (by products, whose
    gradient needs no test for zeros)."""
    masses = interval_mass(lo, hi, centre, scale)
    total = masses[..., 0]
    for d in range(1, masses.shape[-1]):
        total = total * masses[..., d]
    return total


def window(points: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor,
           lengthscale: torch.Tensor) -> torch.Tensor:
    """w_j(x̄) of every box at every point: points [..., D], boxes lo/hi [J, D] → [..., J]; rows
    sum to one over a partition of space.

    The window of the SE kernel uses scale ℓ_d/2: ½ erfc((a − x̄)/(ℓ/√2)) = 1 − Φ((a − x̄)/(ℓ/2)).
    """
    return box_mass(lo, hi, points.unsqueeze(-2), 0.5 * lengthscale)


def erfc_window(points: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor,
                lengthscale: torch.Tensor) -> torch.Tensor:
    """The slide's form ½[erfc(s_j) − erfc(s_{j+1})], s = (a − x̄)/(ℓ/√2), per dimension and
    multiplied over dimensions. Reference only: it cancels catastrophically in the far tails."""
    x = points.unsqueeze(-2)
    scale = lengthscale / math.sqrt(2.0)
    s_lo = (lo - x) / scale
    s_hi = (hi - x) / scale
    return (0.5 * (torch.special.erfc(s_lo) - torch.special.erfc(s_hi))).prod(-1)


def tail_quantile(eps: float) -> float:
    """Φ⁻¹(1 − ε), a host number (no tensor is made)."""
    if not 0.0 < eps < 0.5:
        raise ValueError(f"halo threshold eps must lie in (0, 0.5), got {eps}")
    return -NormalDist().inv_cdf(eps)


def halo_radius(lengthscale: torch.Tensor, eps: float) -> torch.Tensor:
    """h_d = (ℓ_d/2) Φ⁻¹(1 − ε): a point farther than h_d from a box along any dimension has
    window w_j ≤ ε there."""
    return 0.5 * tail_quantile(eps) * lengthscale
