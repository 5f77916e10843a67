"""Local kernels k_j(x, x') = k(x, x') · w_j((x + x')/2) of the squared-exponential kernel.

As on the slides, each k_j is the feature integral of the SE kernel restricted to region j, hence
positive semi-definite, and Σ_j k_j = k exactly because the windows of a partition sum to one. All
regions share σ_f² and ℓ (per-region hyperparameters would break Σ_j k_j = k). Only the SE
(``rbf``) family has closed-form partial feature integrals; other families raise
``NotImplementedError``.

Shapes: regions are a leading batch dimension. ``lower``/``upper`` [J, A] are the box faces over
the A active dimensions (see :class:`~pyrogp_models.models.distributed_kernel.regions.Regions`).
"""

from __future__ import annotations

import torch
from pyro.nn import PyroModule

from pyrogp_models.kernels import RBF, Stationary
from pyrogp_models.layers.naming import unique_name
from pyrogp_models.models.distributed_kernel.regions import Regions
from pyrogp_models.models.distributed_kernel.windows import box_mass


def shared_se_kernel(input_dim: int, ard: bool = False, lengthscale=1.0, variance=1.0, *,
                     dtype: torch.dtype, device=None) -> Stationary:
    """The SE kernel (ℓ, σ_f²) that all local kernels share: the one place the distributed
    kernel builds it (from defaults, the tree search and files alike)."""
    return RBF(input_dim, ard=ard, lengthscale=lengthscale, variance=variance, dtype=dtype,
               device=device)


def check_family(kernel: Stationary) -> None:
    """Only the squared-exponential kernel has closed-form partial feature integrals."""
    if kernel.family != "rbf":
        raise NotImplementedError(
            "the distributed kernel needs the squared-exponential ('rbf') kernel; "
            f"'{kernel.family}' has no closed-form partial feature integral")


def local_cross_covariance(X: torch.Tensor, Z: torch.Tensor, lower: torch.Tensor,
                           upper: torch.Tensor, lengthscale: torch.Tensor, variance: torch.Tensor,
                           active_dims: list[int]) -> torch.Tensor:
    """k_j(X_j, Z_j) for every region j: X [J, N, D], Z [J, M, D], faces [J, A] → [J, N, M].

    Computed as σ² exp(−r²/2) · w_j(x̄) with r² from exact differences (no x² + z² − 2xz
    cancellation) and the window of :func:`~.windows.box_mass`.
    """
    ell = lengthscale.expand(X.shape[-1])
    diff = (X.unsqueeze(-2) - Z.unsqueeze(-3)) / ell
    k = variance * torch.exp(-0.5 * diff.square().sum(-1))
    if not active_dims:
        return k
    mid = 0.5 * (X[..., active_dims].unsqueeze(-2) + Z[..., active_dims].unsqueeze(-3))
    faces = (lower.unsqueeze(-2).unsqueeze(-2), upper.unsqueeze(-2).unsqueeze(-2))
    return k * box_mass(*faces, mid, 0.5 * ell[active_dims])


def local_diagonal(X: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor,
                   lengthscale: torch.Tensor, variance: torch.Tensor,
                   active_dims: list[int]) -> torch.Tensor:
    """k_j(x, x) = σ² w_j(x) for X [J, N, D] → [J, N] (the local GP's marginal variance)."""
    if not active_dims:
        return variance * torch.ones_like(X[..., 0])
    ell = lengthscale.expand(X.shape[-1])[active_dims]
    return variance * box_mass(lower.unsqueeze(-2), upper.unsqueeze(-2), X[..., active_dims],
                               0.5 * ell)


class LocalKernels(PyroModule):
    """The J local kernels of one SE kernel and one set of regions: a batched kernel, batch (J,).

    ``forward(X, Z)`` with X [N, D] and Z [M, D] gives every k_j(X, Z) as [J, N, M]; batched inputs
    [J, N, D] pair region j with its own points (the kernel interface of
    :class:`~pyrogp_models.layers.SparseGPLayer`). The SE kernel (ℓ, σ_f²) and the regions (cuts)
    are its Pyro submodules, so a model holding the local kernels trains their parameters. Used
    on its own it takes a fresh Pyro ``name`` (default ``"local_kernels"``, then
    ``"local_kernels_2"``, …), so that local kernels never share parameters in Pyro's global
    parameter store; inside a model it is renamed after its place there.
    """

    def __init__(self, kernel: Stationary, regions: Regions, name: str | None = None):
        super().__init__(name or unique_name("local_kernels"))
        check_family(kernel)
        if kernel.batch_shape != torch.Size([]):
            raise ValueError("the local kernels share one set of hyperparameters: use a kernel "
                             "with batch_shape ()")
        self.kernel = kernel
        self.regions = regions

    def _batch(self, X: torch.Tensor) -> torch.Tensor:
        if X.dim() == 2:
            return X.unsqueeze(0).expand(self.regions.num_regions, *X.shape)
        return X

    def forward(self, X: torch.Tensor, Z: torch.Tensor | None = None) -> torch.Tensor:
        """k_j(X, Z) = k(X, Z) · w_j((x + z)/2) [J, N, M] for every region j; X [N, D] (or
        [J, N, D]), Z likewise (default: X)."""
        lower, upper = self.regions.bounds()
        X = self._batch(X)
        Z = X if Z is None else self._batch(Z)
        return local_cross_covariance(X, Z, lower, upper, self.kernel.lengthscale,
                                      self.kernel.variance, self.regions.active_dims)

    def diag(self, X: torch.Tensor) -> torch.Tensor:
        """k_j(x, x) [J, N]."""
        lower, upper = self.regions.bounds()
        return local_diagonal(self._batch(X), lower, upper, self.kernel.lengthscale,
                              self.kernel.variance, self.regions.active_dims)
