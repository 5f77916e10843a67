"""Regions of the distributed kernel: axis-aligned boxes that partition the input space.

A 1-D split (slides: cuts a_2 < … < a_J along one dimension) and a decision-tree partition
(leaves are boxes) share one representation:

- for every *active* dimension d (one that is cut somewhere) an ordered list of cut values
  c_{d,0} < c_{d,1} < …, parametrised as c_{d,0} + cumsum(softplus(raw)) so that learned cuts can
  never cross (crossing cuts would give negative windows, i.e. kernels that are not PSD);
- for every region j and active dimension d, the index of its lower and upper face in that list
  (−1 for an infinite face).

Because every tree split on dimension d sits between its node's faces *in index order*, any ordered
values keep the leaves a partition of space. (Cuts of unrelated branches on the same dimension are
kept in one order too: a mild restriction of the variational family.)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pyro.nn import PyroModule, PyroParam

from pyrogp_models.errors import DataError

#: Smallest gap between neighbouring cuts: softplus(raw) is clamped here so cuts stay strictly
#: ordered even when an increment underflows.
_MIN_GAP = 1e-9


def _inverse_softplus(x: torch.Tensor) -> torch.Tensor:
    return x + torch.log(-torch.expm1(-x))


class Regions(PyroModule):
    """J axis-aligned boxes partitioning R^D, with ordered (optionally learnable) cut values.

    Args:
        input_dim: D.
        active_dims: the dimensions that carry cuts, in increasing order (length A ≥ 0).
        cut_values: one sorted 1-D tensor of cut values per active dimension.
        lower_index, upper_index: [J, A] long; face indices into each dimension's cut list,
            −1 for −∞ (lower) or +∞ (upper).
        learn_cuts: make the cut values variational parameters (Σ_j k_j = k for any cuts, so
            p(y) does not depend on them).
    """

    def __init__(self, input_dim: int, active_dims: list[int], cut_values: list[torch.Tensor],
                 lower_index: torch.Tensor, upper_index: torch.Tensor, learn_cuts: bool = False):
        super().__init__()
        if len(active_dims) != len(cut_values):
            raise ValueError("one list of cut values per active dimension")
        if list(active_dims) != sorted(set(active_dims)) or any(
                not 0 <= d < input_dim for d in active_dims):
            raise ValueError(f"active dimensions {active_dims} must be increasing in [0, D)")
        self.input_dim = input_dim
        self.active_dims = list(active_dims)
        self.learn_cuts = learn_cuts
        counts = [int(c.numel()) for c in cut_values]
        for values in cut_values:
            if values.numel() > 1 and bool((values[1:] <= values[:-1]).any()):
                raise ValueError("cut values must be strictly increasing within a dimension")
        width = max(counts, default=0)
        reference = cut_values[0] if cut_values else torch.zeros(())
        dtype, device = reference.dtype, reference.device
        start = torch.zeros(len(cut_values), dtype=dtype, device=device)
        raw = torch.zeros(len(cut_values), max(width - 1, 0), dtype=dtype, device=device)
        for a, values in enumerate(cut_values):
            start[a] = values[0]
            if values.numel() > 1:
                raw[a, :values.numel() - 1] = _inverse_softplus(values.diff().clamp_min(_MIN_GAP))
        self.register_buffer("num_cuts", torch.tensor(counts, dtype=torch.long, device=device))
        if learn_cuts:
            self.cut_start = PyroParam(start)
            self.cut_increments = PyroParam(raw)
        else:
            self.register_buffer("cut_start", start)
            self.register_buffer("cut_increments", raw)
        self.register_buffer("lower_index", lower_index.to(torch.long))
        self.register_buffer("upper_index", upper_index.to(torch.long))

    # construction ------------------------------------------------------------------------------
    @classmethod
    def from_cuts(cls, cuts, input_dim: int = 1, dim: int = 0, learn_cuts: bool = False,
                  dtype=None, device=None) -> Regions:
        """The slides' 1-D split: regions (−∞, a_2), [a_2, a_3), …, [a_J, ∞) along ``dim``."""
        cuts = torch.as_tensor(cuts, dtype=dtype or torch.get_default_dtype(), device=device)
        cuts = cuts.reshape(-1)
        num_regions = cuts.numel() + 1
        if num_regions == 1:
            return cls.whole_space(input_dim, dtype=cuts.dtype, device=device)
        index = torch.arange(num_regions, device=device)
        lower = (index - 1).unsqueeze(-1)
        upper = torch.where(index < num_regions - 1, index, -1).unsqueeze(-1)
        return cls(input_dim, [dim], [cuts], lower, upper, learn_cuts)

    @classmethod
    def whole_space(cls, input_dim: int = 1, dtype=None, device=None) -> Regions:
        """One region, R^D itself: the distributed kernel is then the ordinary SE kernel."""
        empty = torch.zeros(1, 0, dtype=torch.long, device=device)
        return cls(input_dim, [], [], empty, empty.clone())

    @classmethod
    def from_boxes(cls, lower: torch.Tensor, upper: torch.Tensor,
                   learn_cuts: bool = False) -> Regions:
        """Regions from box faces lower/upper [J, D] (±∞ allowed), e.g. the leaves of a tree.

        The boxes must partition space (as tree leaves do); every finite face value becomes a cut
        of its dimension (equal values are merged into one cut).
        """
        num_regions, input_dim = lower.shape
        finite = torch.isfinite(lower) | torch.isfinite(upper)
        active = [d for d in range(input_dim) if bool(finite[:, d].any())]
        cut_values, lower_index, upper_index = [], [], []
        for d in active:
            low, high = lower[:, d].contiguous(), upper[:, d].contiguous()
            faces = torch.cat([low, high])
            values = torch.unique(faces[torch.isfinite(faces)])
            cut_values.append(values)
            lower_index.append(torch.where(torch.isfinite(low), torch.searchsorted(values, low),
                                           -1))
            upper_index.append(torch.where(torch.isfinite(high), torch.searchsorted(values, high),
                                           -1))
        shape = (num_regions, len(active))
        empty = torch.zeros(shape, dtype=torch.long, device=lower.device)
        lower_index = torch.stack(lower_index, -1) if active else empty
        upper_index = torch.stack(upper_index, -1) if active else empty.clone()
        return cls(input_dim, active, cut_values, lower_index, upper_index, learn_cuts)

    # values --------------------------------------------------------------------------------------
    @property
    def num_regions(self) -> int:
        return self.lower_index.shape[0]

    def cut_values(self) -> torch.Tensor:
        """Ordered cut values [A, C_max] (entries past a dimension's count are padding)."""
        gaps = F.softplus(self.cut_increments).clamp_min(_MIN_GAP)
        zero = gaps.new_zeros(gaps.shape[0], 1)
        return self.cut_start.unsqueeze(-1) + torch.cat([zero, gaps.cumsum(-1)], -1)

    def bounds(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Box faces (lower, upper) of shape [J, A] over the active dimensions, ±∞ at the ends."""
        values = self.cut_values()
        num_active = len(self.active_dims)
        if num_active == 0:
            empty = values.new_zeros(self.num_regions, 0)
            return empty, empty.clone()
        dims = torch.arange(num_active, device=values.device).expand(self.num_regions, -1)
        lower = torch.where(self.lower_index >= 0, values[dims, self.lower_index.clamp_min(0)],
                            -math.inf)
        upper = torch.where(self.upper_index >= 0, values[dims, self.upper_index.clamp_min(0)],
                            math.inf)
        return lower, upper

    def full_bounds(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Box faces over all D dimensions [J, D] (inactive dimensions are (−∞, ∞))."""
        lower, upper = self.bounds()
        inf = math.inf
        full_lower = lower.new_full((self.num_regions, self.input_dim), -inf)
        full_upper = lower.new_full((self.num_regions, self.input_dim), inf)
        full_lower[:, self.active_dims] = lower
        full_upper[:, self.active_dims] = upper
        return full_lower, full_upper

    def active(self, X: torch.Tensor) -> torch.Tensor:
        """The active coordinates of points X [..., D] → [..., A]."""
        return X[..., self.active_dims]

    def active_lengthscale(self, lengthscale: torch.Tensor) -> torch.Tensor:
        """ℓ over the active dimensions (an isotropic ℓ is broadcast)."""
        return lengthscale.expand(self.input_dim)[self.active_dims]

    @torch.no_grad()
    def owner(self, X: torch.Tensor) -> torch.Tensor:
        """The region containing each point of X [N, D]: boxes are half-open [lower, upper)."""
        lower, upper = self.bounds()
        if len(self.active_dims) == 0:
            return torch.zeros(X.shape[0], dtype=torch.long, device=X.device)
        if len(self.active_dims) == 1 and self.num_regions == self.num_cuts.sum() + 1:
            order = torch.argsort(lower[:, 0])
            return order[torch.searchsorted(lower[order, 0].contiguous(),
                                            self.active(X)[:, 0].contiguous(), right=True) - 1]
        x = self.active(X).unsqueeze(-2)
        inside = ((x >= lower) & (x < upper)).all(-1)
        return inside.to(torch.int8).argmax(-1)

    def describe(self) -> str:
        """One line per region with its faces along the active dimensions."""
        lower, upper = self.full_bounds()
        rows = []
        for j in range(self.num_regions):
            faces = ", ".join(f"x{d}∈[{float(lower[j, d]):.3g}, {float(upper[j, d]):.3g})"
                              for d in self.active_dims)
            rows.append(f"region {j}: {faces or 'R^D'}")
        return "\n".join(rows)


# default cuts ----------------------------------------------------------------------------------
@torch.no_grad()
def quantile_cuts(x: torch.Tensor, num_regions: int, min_width: float) -> torch.Tensor:
    """J − 1 cuts at the data quantiles k/J (equal counts, for load balance), then moved as
    little as needed so that every region, the end ones measured from the data extremes, is at
    least ``min_width`` wide (2ℓ by default: at the centre of a region of width W the window is
    2Φ(W/ℓ) − 1, 0.95 for W = 2ℓ, so narrower regions are not local).

    Raises :class:`DataError` if the data range is shorter than J · min_width.
    """
    x = x.reshape(-1)
    low, high = x.min(), x.max()
    if float(high - low) < num_regions * min_width:
        raise DataError(
            f"{num_regions} regions at least {min_width:.3g} wide do not fit in the data range "
            f"[{float(low):.4g}, {float(high):.4g}]; use fewer regions or a shorter lengthscale")
    if num_regions == 1:
        return x.new_zeros(0)
    probs = torch.arange(1, num_regions, dtype=x.dtype, device=x.device) / num_regions
    cuts = torch.quantile(x, probs)
    steps = torch.arange(1, num_regions, dtype=x.dtype, device=x.device) * min_width
    # forward pass: c_k ≥ low + k·w and c_k ≥ c_{k−1} + w  ⇔  c_k − k·w ≥ running max
    cuts = steps + torch.cummax(torch.maximum(cuts - steps, low), 0).values
    # backward pass: c_k ≤ high − (J−k)·w and c_k ≤ c_{k+1} − w
    back = min_width * torch.arange(num_regions - 1, 0, -1, dtype=x.dtype, device=x.device)
    shifted = (cuts + back).flip(0)
    shifted = torch.cummin(torch.minimum(shifted, high), 0).values.flip(0)
    return shifted - back


def spread(X: torch.Tensor) -> torch.Tensor:
    """The range of each input of X [N, D], or of its central 98 % (the 1 % to 99 % quantiles)
    where outliers make up more than half of the range: so that a few outliers neither choose
    the input to cut nor widen its regions into empty space (nearest-rank quantiles of one sort:
    no size limit, unlike ``torch.quantile``). [D]."""
    ordered = X.sort(0).values
    last = X.shape[0] - 1
    full = ordered[-1] - ordered[0]
    central = ordered[round(0.99 * last)] - ordered[round(0.01 * last)]
    return torch.where((central > 0) & (central < 0.5 * full), central, full)


def split_dimension(X: torch.Tensor, lengthscale: torch.Tensor) -> int:
    """Default split dimension: the largest :func:`spread`/ℓ_d (the slides leave the choice
    open)."""
    return int(torch.argmax(spread(X) / lengthscale.expand(X.shape[-1])))


def default_regions(X: torch.Tensor, num_regions: int, lengthscale: torch.Tensor,
                    min_width: float = 2.0, learn_cuts: bool = False,
                    dim: int | None = None) -> Regions:
    """A 1-D split along ``dim`` (default: :func:`split_dimension`) at data quantiles, regions
    ≥ min_width·ℓ_d."""
    dim = split_dimension(X, lengthscale) if dim is None else dim
    ell = float(lengthscale.expand(X.shape[-1])[dim])
    cuts = quantile_cuts(X[:, dim], num_regions, min_width * ell)
    return Regions.from_cuts(cuts, input_dim=X.shape[-1], dim=dim, learn_cuts=learn_cuts,
                             dtype=X.dtype, device=X.device)
