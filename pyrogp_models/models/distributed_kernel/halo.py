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
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pyrogp_models.models.distributed_kernel.windows import halo_radius

#: Default halo threshold ε on the window: a dropped pair has |k_j(x_i, z)| ≤ σ_f²√ε = 1e−6 σ_f².
DEFAULT_EPS = 1e-12


@dataclass(frozen=True)
class Halo:
    """Region-major padded pair lists: ``index`` [J, P] point indices, ``mask`` [J, P]."""

    index: torch.Tensor
    mask: torch.Tensor
    num_points: int

    @property
    def num_regions(self) -> int:
        return self.index.shape[0]

    @property
    def num_pairs(self) -> int:
        return int(self.mask.sum())

    @property
    def counts(self) -> torch.Tensor:
        """|D_j|, the number of points each region touches (its data plus its halo)."""
        return self.mask.sum(-1)

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


def _is_sorted(x: torch.Tensor) -> bool:
    return x.numel() < 2 or bool((x[1:] >= x[:-1]).all())


@torch.no_grad()
def build_halo(X: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor,
               lengthscale: torch.Tensor, active_dims: list[int],
               eps: float = DEFAULT_EPS) -> Halo:
    """The pairs (i, j) with x_i in box j grown by the halo radius (see module docstring).

    Args:
        X: points [N, D].
        lower, upper: box faces [J, A] over the active dimensions (±∞ allowed).
        lengthscale: ℓ over the active dimensions [A].
        eps: window threshold ε; ``eps=0`` keeps every pair.
    """
    num_points = X.shape[0]
    num_regions = lower.shape[0]
    if not active_dims or eps == 0.0:
        return full_halo(num_points, num_regions, X.device)
    radius = halo_radius(lengthscale.detach(), eps)
    grown_lower = lower.detach() - radius
    grown_upper = upper.detach() + radius
    x = X[:, active_dims]
    if len(active_dims) == 1 and _is_sorted(x[:, 0]):
        column = x[:, 0].contiguous()
        start = torch.searchsorted(column, grown_lower[:, 0].contiguous(), right=False)
        stop = torch.searchsorted(column, grown_upper[:, 0].contiguous(), right=True)
        counts = stop - start
        width = max(int(counts.max()), 1)
        offsets = torch.arange(width, device=X.device)
        mask = offsets < counts.unsqueeze(-1)
        index = torch.where(mask, start.unsqueeze(-1) + offsets, 0)
        return Halo(index, mask, num_points)
    inside = ((x.unsqueeze(0) >= grown_lower.unsqueeze(1))
              & (x.unsqueeze(0) <= grown_upper.unsqueeze(1))).all(-1)        # [J, N]
    counts = inside.sum(-1)
    width = max(int(counts.max()), 1)
    rows, cols = inside.nonzero(as_tuple=True)
    slot = inside.cumsum(-1)[rows, cols] - 1
    index = torch.zeros(num_regions, width, dtype=torch.long, device=X.device)
    index[rows, slot] = cols
    mask = torch.arange(width, device=X.device) < counts.unsqueeze(-1)
    return Halo(index, mask, num_points)


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
    num_regions = adjacency.shape[0]
    adjacency = adjacency.cpu()
    colours = [-1] * num_regions
    for j in range(num_regions):
        taken = {colours[k] for k in torch.nonzero(adjacency[j]).flatten().tolist() if k != j}
        colour = 0
        while colour in taken:
            colour += 1
        colours[j] = colour
    return torch.tensor(colours, dtype=torch.long)
