"""Halo bookkeeping: which (point, region) pairs the distributed-kernel objective touches.

Point i and region j form a pair when x_i lies in region j's box grown by the halo radius
h_d = (ℓ_d/2)Φ⁻¹(1 − ε) along every active dimension. Every dropped pair has window
w_j(x_i) ≤ ε, hence |k_j(x_i, z)| ≤ σ_f²√ε for all z, and in whitened form its contributions obey
|μ_ij| ≤ σ_f√ε‖m_j‖ and v_ij ≤ σ_f²ε(1 + ‖L_j‖²_F) (the Nyström term is ≤ k_j(x_i, x_i)).

Pairs are stored region-major and padded: ``index[j, p]`` is a point index and ``mask[j, p]``
tells which entries are real. The data term then costs O(Σ_j |D_j| m²) = O(n m²(1 + halo
fraction)) instead of O(n J m²). When all cuts lie along one dimension and the points are sorted
along it, each region's pairs are one contiguous run found by binary search (O(J log n)); otherwise
a box test over all (point, region) pairs costs O(n J A) cheap comparisons.

**No host reads in a training step.** The pairs depend on ℓ and the cuts, which move at every step,
and the padded width P = max_j |D_j| is a shape, which the host must know. A :class:`HaloPlans`
therefore fixes the width of the halos of the training data: the pairs are selected afresh on the
device at every build, within that width, and every :data:`CHECK_EVERY` builds the width is set
again on the host (one read) to what a radius :data:`RADIUS_MARGIN` times larger needs, or to the
most any build since the last check needed. A halo records on the device whether its pairs
overflowed the width (``overflow``: only if ℓ grew by more than the margin between two checks), so
an objective can refuse that evaluation instead of silently dropping pairs (the L-BFGS objective of
the distributed-kernel GP does; an SVI step misses those pairs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from pyrogp_models.models.distributed_kernel.windows import halo_radius

#: Default halo threshold ε on the window: a dropped pair has |k_j(x_i, z)| ≤ σ_f²√ε = 1e−6 σ_f².
DEFAULT_EPS = 1e-12
#: Builds of a planned halo between two checks of its width on the host.
CHECK_EVERY = 10
#: A planned width holds the pairs of a halo radius this many times the current one.
RADIUS_MARGIN = 1.25


@dataclass(frozen=True)
class Halo:
    """Region-major padded pair lists: ``index`` [J, P] point indices, ``mask`` [J, P];
    ``required`` (a device scalar) is the largest number of pairs a region has, which exceeds P
    only if the halo was built within a width too small for it."""

    index: torch.Tensor
    mask: torch.Tensor
    num_points: int
    required: torch.Tensor | None = None

    @property
    def num_regions(self) -> int:
        return self.index.shape[0]

    @property
    def num_pairs(self) -> int:
        """The number of pairs (reads it back to the host)."""
        return int(self.mask.sum())

    @property
    def counts(self) -> torch.Tensor:
        """|D_j|, the number of points each region touches (its data plus its halo)."""
        return self.mask.sum(-1)

    @property
    def overflow(self) -> torch.Tensor:
        """Whether pairs were dropped for want of width (a device bool scalar)."""
        if self.required is None:
            return torch.zeros((), dtype=torch.bool, device=self.index.device)
        return self.required > self.index.shape[1]

    def scatter(self, values: torch.Tensor) -> torch.Tensor:
        """Σ_j values[..., j, p] into the points: [..., J, P] → [..., N], for any leading
        (e.g. sample) dimensions; padding contributes nothing."""
        flat = torch.where(self.mask, values, torch.zeros_like(values)).flatten(-2)
        out = values.new_zeros(*values.shape[:-2], self.num_points)
        return out.index_add(-1, self.index.reshape(-1), flat)

    def gather(self, point_values: torch.Tensor) -> torch.Tensor:
        """point_values[index]: [N, ...] → [J, P, ...]."""
        return point_values[self.index]


def full_halo(num_points: int, num_regions: int, device=None) -> Halo:
    """Every region touches every point (no truncation: the O(n J m²) reference)."""
    index = torch.arange(num_points, device=device).expand(num_regions, -1)
    return Halo(index, torch.ones_like(index, dtype=torch.bool), num_points)


def is_sorted(x: torch.Tensor) -> bool:
    """Whether x [N] is non-decreasing (reads one value back to the host)."""
    return x.numel() < 2 or bool((x[1:] >= x[:-1]).all())


def _grown_boxes(lower, upper, lengthscale, eps, margin=1.0):
    radius = margin * halo_radius(lengthscale.detach(), eps)
    return lower.detach() - radius, upper.detach() + radius


def _run_counts(column: torch.Tensor, grown_lower: torch.Tensor, grown_upper: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """First index and count of each grown box's contiguous run in the sorted ``column``."""
    start = torch.searchsorted(column, grown_lower[:, 0].contiguous(), right=False)
    stop = torch.searchsorted(column, grown_upper[:, 0].contiguous(), right=True)
    return start, stop - start


def _inside(x: torch.Tensor, grown_lower: torch.Tensor, grown_upper: torch.Tensor
            ) -> torch.Tensor:
    """[J, N] bool: x_i in grown box j."""
    return ((x.unsqueeze(0) >= grown_lower.unsqueeze(1))
            & (x.unsqueeze(0) <= grown_upper.unsqueeze(1))).all(-1)


@torch.no_grad()
def build_halo(X: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor,
               lengthscale: torch.Tensor, active_dims: list[int],
               eps: float = DEFAULT_EPS, width: int | None = None,
               sorted_points: bool | None = None) -> Halo:
    """The pairs (i, j) with x_i in box j grown by the halo radius (see module docstring).

    Args:
        X: points [N, D].
        lower, upper: box faces [J, A] over the active dimensions (±∞ allowed).
        lengthscale: ℓ over the active dimensions [A].
        eps: window threshold ε; ``eps=0`` keeps every pair.
        width: the padded width P; None: exactly the largest count (read back to the host).
            With a width nothing is read back; a region with more pairs keeps its first P
            (``Halo.overflow`` tells).
        sorted_points: whether X is sorted along its one active dimension (None: look, which
            reads one value back).
    """
    num_points = X.shape[0]
    num_regions = lower.shape[0]
    if not active_dims or eps == 0.0:
        return full_halo(num_points, num_regions, X.device)
    grown_lower, grown_upper = _grown_boxes(lower, upper, lengthscale, eps)
    x = X[:, active_dims]
    one_dim = len(active_dims) == 1
    if one_dim and (is_sorted(x[:, 0]) if sorted_points is None else sorted_points):
        start, counts = _run_counts(x[:, 0].contiguous(), grown_lower, grown_upper)
        width = max(int(counts.max()), 1) if width is None else width
        offsets = torch.arange(width, device=X.device)
        mask = offsets < counts.unsqueeze(-1)
        index = torch.where(mask, start.unsqueeze(-1) + offsets, 0)
        return Halo(index, mask, num_points, counts.max())
    inside = _inside(x, grown_lower, grown_upper)                              # [J, N]
    counts = inside.sum(-1)
    width = max(int(counts.max()), 1) if width is None else width
    slot = inside.cumsum(-1) - 1
    column = torch.where(inside & (slot < width), slot, width)                # width: discarded
    points = torch.arange(num_points, device=X.device).expand(num_regions, -1)
    index = torch.zeros(num_regions, width + 1, dtype=torch.long, device=X.device)
    index = index.scatter(1, column, points)[:, :width]
    mask = torch.arange(width, device=X.device) < counts.unsqueeze(-1)
    return Halo(torch.where(mask, index, 0), mask, num_points, counts.max())


@torch.no_grad()
def planned_width(X: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor,
                  lengthscale: torch.Tensor, active_dims: list[int], eps: float,
                  sorted_points: bool, spread: bool, seen: torch.Tensor | None = None) -> int:
    """The width for the halos of X: the largest count of a radius :data:`RADIUS_MARGIN` times
    the current one, or the largest count ``seen`` since the last check if more (the points
    evaluated in between, e.g. an optimiser's trials, may have needed more); one value read
    back. With ``spread`` (X is a random subsample, drawn anew at every step) three Poisson
    standard deviations more."""
    grown_lower, grown_upper = _grown_boxes(lower, upper, lengthscale, eps, RADIUS_MARGIN)
    x = X[:, active_dims]
    if len(active_dims) == 1 and sorted_points:
        counts = _run_counts(x[:, 0].contiguous(), grown_lower, grown_upper)[1]
    else:
        counts = _inside(x, grown_lower, grown_upper).sum(-1)
    largest = counts.max() if seen is None else torch.maximum(counts.max(), seen)
    largest = int(largest)
    if spread:
        largest += math.ceil(3.0 * math.sqrt(largest))
    return max(largest, 1)


class HaloPlans:
    """Widths of the halos of one set of training inputs and of its sorted random subsamples,
    one width per number of points, set on the host every :data:`CHECK_EVERY` builds (module
    docstring). ``sorted_points``: whether the training inputs are sorted along the one active
    dimension (then so is every sorted subsample)."""

    def __init__(self, sorted_points: bool):
        self.sorted_points = sorted_points
        self.widths: dict[int, int] = {}           # per number of points: the planned width
        self.builds: dict[int, int] = {}           # builds so far
        self.seen: dict[int, torch.Tensor] = {}    # largest count since the last check

    def build(self, X: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor,
              lengthscale: torch.Tensor, active_dims: list[int], eps: float,
              subsample: bool = False) -> Halo:
        """The halo of the training inputs X (or of a sorted random subsample of them)."""
        if not active_dims or eps == 0.0:
            return full_halo(X.shape[0], lower.shape[0], X.device)
        size = X.shape[0]
        builds = self.builds.get(size, 0)
        if builds % CHECK_EVERY == 0:
            self.widths[size] = planned_width(X, lower, upper, lengthscale, active_dims, eps,
                                              self.sorted_points, subsample,
                                              self.seen.pop(size, None))
        self.builds[size] = builds + 1
        halo = build_halo(X, lower, upper, lengthscale, active_dims, eps, self.widths[size],
                          self.sorted_points)
        seen = self.seen.get(size)
        self.seen[size] = halo.required if seen is None else torch.maximum(seen, halo.required)
        return halo


@torch.no_grad()
def region_graph(lower: torch.Tensor, upper: torch.Tensor, lengthscale: torch.Tensor,
                 eps: float = DEFAULT_EPS) -> torch.Tensor:
    """[J, J] bool: regions whose grown boxes overlap, i.e. that may share a point of their
    halos (a superset of the true coupling; used for colouring and for shard ghosts)."""
    radius = halo_radius(lengthscale.detach(), eps)
    lo, hi = lower.detach() - radius, upper.detach() + radius
    return ((lo.unsqueeze(1) <= hi.unsqueeze(0)) & (lo.unsqueeze(0) <= hi.unsqueeze(1))).all(-1)


def greedy_colouring(adjacency: torch.Tensor) -> torch.Tensor:
    """Colours [J] such that adjacent regions differ (greedy, in region order). Regions of one
    colour share no point, so their q(u_j) can be updated together exactly (block Gauss–Seidel by
    colour). Run once per halo, outside any training step."""
    num_regions, device = adjacency.shape[0], adjacency.device
    adjacency = adjacency.cpu()
    colours = [-1] * num_regions
    for j in range(num_regions):
        taken = {colours[k] for k in torch.nonzero(adjacency[j]).flatten().tolist() if k != j}
        colour = 0
        while colour in taken:
            colour += 1
        colours[j] = colour
    return torch.tensor(colours, dtype=torch.long, device=device)
