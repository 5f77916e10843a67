"""All local sparse GPs of a partitioned data set as one Pyro model.

Partitions that share a number of inducing inputs M form a group, fitted as one
:class:`BatchedSVGP` (padded and masked); groups with different M live side by side in one model
and one trace, so a single optimiser step updates every partition. Nothing loops over partitions.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from pyro.nn import PyroModule, PyroModuleList

from pyrogp_models.data import Standardisation
from pyrogp_models.data.inducing import init_inducing
from pyrogp_models.data.partitioners import Partition, pad_partitions
from pyrogp_models.errors import DataError
from pyrogp_models.kernels import Stationary
from pyrogp_models.likelihoods import make_likelihood
from pyrogp_models.models.local.collapsed import CollapsedSVGP, set_optimal_posterior
from pyrogp_models.models.local.svgp import DEFAULT_JITTER, BatchedSVGP
from pyrogp_models.modules.record import Module

#: Floor on input spreads and initial lengthscales (standardised units).
_MIN_SPREAD = 1e-3


class LocalGPs(PyroModule):
    """One SVGP per partition, grouped by M.

    Args:
        X, y: standardised inputs [N, D] and targets [N] (tensors of the wanted dtype/device).
        partition: which partition each point belongs to.
        num_inducing: M for every partition, or one M_k per partition.
        likelihood, likelihood_options: likelihood name and options (link, num_classes, ...).
        kernel, ard: kernel family and whether it has one lengthscale per input dimension.
        inducing_init: ``"kmeans"`` or ``"grid"``.
        learn_inducing: optimise Z.
        collapsed: train Gaussian partitions on the collapsed (Titsias) bound.
        jitter: relative jitter on K_zz.
        noise: initial Gaussian noise variance (standardised units).
        generator: random source for the k-means initialisation.
        inducing: initial Z per partition ([M_k, D] each, model units) instead of
            ``inducing_init`` (e.g. drawn once by :func:`initial_inducing` for a fit split over
            workers).
    """

    def __init__(self, X: torch.Tensor, y: torch.Tensor, partition: Partition,
                 num_inducing: int | Sequence[int], likelihood: str = "gaussian",
                 likelihood_options: dict | None = None, kernel: str = "rbf", ard: bool = False,
                 inducing_init: str = "kmeans", learn_inducing: bool = True,
                 collapsed: bool = False, jitter: float = DEFAULT_JITTER, noise: float = 0.1,
                 generator: torch.Generator | None = None,
                 inducing: Sequence[torch.Tensor] | None = None):
        super().__init__("local")
        self.likelihood_name = likelihood
        self.likelihood_options = dict(likelihood_options or {})
        self.collapsed = collapsed
        sizes = partition.sizes
        per_partition = np.broadcast_to(np.asarray(num_inducing), sizes.shape)
        if bool((per_partition > sizes).any()):
            k = int(np.argmax(per_partition > sizes))
            raise DataError(f"partition {k} has {sizes[k]} points, fewer than its "
                            f"{per_partition[k]} inducing inputs")
        make_likelihood(likelihood, (), **self.likelihood_options).validate_targets(y)
        Xp, yp, mask, _ = pad_partitions(X, y, partition)
        if inducing is None:
            inducing = _initial_inducing_padded(Xp, mask, per_partition, inducing_init, generator)
        self.groups = PyroModuleList([])
        self.group_members: list[torch.Tensor] = []
        for index, M in enumerate(np.unique(per_partition)):
            members = torch.as_tensor(np.flatnonzero(per_partition == M), device=X.device)
            rows = int(mask[members].sum(-1).max())
            Z = torch.stack([inducing[k] for k in members.tolist()]).to(X)
            self.groups.append(self._build_group(
                Xp[members, :rows], yp[members, :rows], mask[members, :rows], Z, kernel, ard,
                learn_inducing, jitter, noise, name=f"group{index}"))
            self.group_members.append(members)

    def _build_group(self, X, y, mask, Z, kernel, ard, learn_inducing, jitter, noise, name):
        count = len(X)
        likelihood = make_likelihood(self.likelihood_name, (count,), X.dtype, X.device,
                                     **self.likelihood_options,
                                     **({"variance": noise}
                                        if self.likelihood_name == "gaussian" else {}))
        spread = _input_spread(X, mask)
        lengthscale = _initial_lengthscale(spread, ard, Z.shape[-2])
        kernel_module = Stationary(kernel, X.shape[-1], (count, likelihood.num_latent), ard,
                                   lengthscale.unsqueeze(1), 1.0, X.dtype, X.device)
        svgp = BatchedSVGP(Z, kernel_module, likelihood, learn_inducing, jitter, name=name,
                           inducing_scale=spread.clamp_min(_MIN_SPREAD))
        svgp.register_buffer("data_X", X)
        svgp.register_buffer("data_y", y)
        svgp.register_buffer("data_mask", mask)
        if self.collapsed:
            if self.likelihood_name != "gaussian":
                raise ValueError("the collapsed bound is only available for a Gaussian "
                                 "likelihood")
            return CollapsedSVGP(svgp)
        return svgp

    @property
    def svgps(self) -> list[BatchedSVGP]:
        return [g.svgp if isinstance(g, CollapsedSVGP) else g for g in self.groups]

    @property
    def num_partitions(self) -> int:
        return sum(len(m) for m in self.group_members)

    def model(self, batch_size: int | None = None):
        for group, svgp in zip(self.groups, self.svgps, strict=True):
            group.model(svgp.data_X, svgp.data_y, svgp.data_mask, batch_size)

    def guide(self, batch_size: int | None = None):
        for group, svgp in zip(self.groups, self.svgps, strict=True):
            group.guide(svgp.data_X, svgp.data_y, svgp.data_mask, batch_size)

    @torch.no_grad()
    def finalise(self) -> None:
        """After collapsed training, write the optimal q(u) into every group."""
        if self.collapsed:
            for svgp in self.svgps:
                set_optimal_posterior(svgp, svgp.data_X, svgp.data_y, svgp.data_mask)

    @torch.no_grad()
    def elbo(self) -> torch.Tensor:
        """The exact ELBO of every partition, in partition order; [K]."""
        out = None
        for svgp, members in zip(self.svgps, self.group_members, strict=True):
            values = svgp.elbo(svgp.data_X, svgp.data_y, svgp.data_mask)
            out = values.new_empty(self.num_partitions) if out is None else out
            out[members] = values
        return out

    @torch.no_grad()
    def to_modules(self, standardisation: Standardisation, names: Sequence[str] | None = None,
                   info: dict | None = None) -> dict[str, Module]:
        """Export every partition as a :class:`Module` (call :meth:`finalise` first if
        collapsed). Names default to ``part000``, ``part001``, ..."""
        self.finalise()
        elbos = self.elbo()
        width = max(3, len(str(self.num_partitions - 1)))
        names = list(names or [f"part{k:0{width}d}" for k in range(self.num_partitions)])
        modules: dict[int, tuple[str, Module]] = {}
        for svgp, members in zip(self.svgps, self.group_members, strict=True):
            q_mean, q_chol = svgp.unwhitened_posterior()
            params = svgp.likelihood.parameter_values()
            counts = svgp.data_mask.sum(-1)
            for j, k in enumerate(members.tolist()):
                modules[k] = (names[k], Module(
                    kernel_family=svgp.kernel.family,
                    lengthscale=svgp.kernel.lengthscale[j].detach().clone(),
                    variance=svgp.kernel.variance[j].detach().clone(),
                    likelihood_name=self.likelihood_name,
                    likelihood_options=svgp.likelihood.options(),
                    likelihood_params={key: v[j].detach().clone() for key, v in params.items()},
                    inducing=svgp.inducing[j].detach().clone(),
                    q_mean=q_mean[j].clone(), q_chol=q_chol[j].clone(),
                    num_data=int(counts[j]), elbo=float(elbos[k]),
                    standardisation=standardisation, jitter=svgp.jitter,
                    info={"name": names[k], "partition": k, **(info or {})}))
        return dict(modules[k] for k in sorted(modules))


@torch.no_grad()
def initial_inducing(X: torch.Tensor, y: torch.Tensor, partition: Partition,
                     num_inducing: int | Sequence[int], method: str = "kmeans",
                     generator: torch.Generator | None = None) -> list[torch.Tensor]:
    """Initial Z [M_k, D] of every partition, drawn exactly as :class:`LocalGPs` draws them."""
    Xp, _, mask, _ = pad_partitions(X, y, partition)
    per_partition = np.broadcast_to(np.asarray(num_inducing), partition.sizes.shape)
    return _initial_inducing_padded(Xp, mask, per_partition, method, generator)


def _initial_inducing_padded(Xp, mask, per_partition, method, generator) -> list[torch.Tensor]:
    """One batched initialisation per distinct M_k (k-means or grid over each partition)."""
    inducing: dict[int, torch.Tensor] = {}
    for M in np.unique(per_partition):
        members = np.flatnonzero(per_partition == M)
        rows = int(mask[members].sum(-1).max())
        Z = init_inducing(Xp[members, :rows], int(M), mask[members, :rows], method, generator)
        inducing.update(zip(members.tolist(), Z, strict=True))
    return [inducing[k] for k in range(len(per_partition))]


def _input_spread(X: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Standard deviation of each partition's inputs per dimension; [K, D]."""
    weights = mask.to(X.dtype).unsqueeze(-1)
    count = weights.sum(-2).clamp_min(1.0)
    mean = (X * weights).sum(-2) / count
    return (((X - mean.unsqueeze(-2)) * weights).square().sum(-2) / count).sqrt()


def _initial_lengthscale(spread: torch.Tensor, ard: bool, num_inducing: int) -> torch.Tensor:
    """Twice the typical spacing of M inducing inputs over each partition's inputs:
    2·spread/M^(1/D) per dimension ([K, D], or [K, 1] isotropic), floored at 1e-3. Short enough
    that a fit does not start in the "everything is noise" optimum."""
    spacing = (2.0 * spread / num_inducing ** (1.0 / spread.shape[-1])).clamp_min(_MIN_SPREAD)
    return spacing if ard else spacing.mean(-1, keepdim=True)
