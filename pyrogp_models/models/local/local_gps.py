"""All local sparse GPs of a partitioned data set as one Pyro model.

Partitions that share a number of inducing inputs M form a group, fitted as one
:class:`BatchedSVGP` (padded and masked); groups with different M live side by side in one model
and one trace, so a single optimiser step updates every partition. Nothing loops over partitions.
A partition with as many inducing inputs as points (M_k = N_k) keeps Z = X_k fixed, in a group
of its own: its bound is then the exact log marginal likelihood (Titsias 2009, eq. 9 with
Q_ff = K_ff), the largest any Z gives, and its q(f_k) ranges over every Gaussian at the data.

The data are bound to the model, so ``model()``, ``guide()`` and ``predictive_model()`` need no
arguments: ``pyro.infer.SVI(gps.model, gps.guide, ...)`` continues a fit and
``pyro.infer.Predictive(gps.predictive_model, guide=gps.predictive_guide, ...)`` draws f and y at
the data (or at new points routed to their partitions). An ``offset`` [N] in data order is added
to every point's latent mean, so the local GPs can sit inside a user's own Pyro model (e.g. as
the residual of a hierarchical regression).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pyro
import torch
from pyro.nn import PyroModule, PyroModuleList, pyro_method

from pyrogp_models.data import Standardisation
from pyrogp_models.data.inducing import default_num_inducing, init_inducing
from pyrogp_models.data.partitioners import Partition, pad_partitions, route
from pyrogp_models.errors import DataError
from pyrogp_models.gaussian.linalg import DEFAULT_JITTER
from pyrogp_models.kernels import External, member, resolve_kernel
from pyrogp_models.layers import unique_name
from pyrogp_models.likelihoods import make_likelihood
from pyrogp_models.models.local.initialisation import (
    initial_gaussian_variances,
    initial_kernel,
    input_spread,
)
from pyrogp_models.models.local.svgp import BatchedSVGP
from pyrogp_models.modules.record import Module


class LocalGPs(PyroModule):
    """One SVGP per partition, grouped by M: the sum over partitions k of the SVGP ELBO L_k
    (Hensman et al. 2015, eq. 4), or of Titsias' collapsed bound (2009, eq. 9) for Gaussian data.

    Args:
        X, y: standardised inputs [N, D] and targets [N] (tensors of the wanted dtype/device).
        partition: which partition each point belongs to.
        num_inducing: M for every partition, one M_k per partition, or ``None``: M_k =
            min(⌈N_k/2⌉, 100).
        likelihood, likelihood_options: likelihood name and options (link, num_classes, ...).
        kernel: a kernel name or expression, a kernel of :mod:`pyrogp_models.kernels` (values
            it gives are kept; model units), a ``pyro.contrib.gp`` kernel or any PyroModule with
            ``forward(X, Z=None, diag=False)`` (:func:`~pyrogp_models.kernels.choice.
            resolve_kernel`); every partition gets its own copy, its other values from its data
            (:func:`~pyrogp_models.models.local.initialisation.initial_kernel`).
        ard: one lengthscale per input dimension for a kernel given by name.
        inducing_init: ``"kmeans"`` or ``"grid"`` (a partition with M_k = N_k takes Z = X_k).
        learn_inducing: optimise Z (never where M_k = N_k).
        collapsed: train Gaussian partitions on the collapsed (Titsias) bound.
        batch_size: minibatches of B positions of the padded partitions per evaluation, shared
            by all partitions (uncollapsed only; :meth:`BatchedSVGP.model`).
        jitter: relative jitter on K_zz.
        noise: initial Gaussian noise variance (standardised units); default: from each
            partition's data (:mod:`~pyrogp_models.models.local.initialisation`, like the other
            hyperparameters).
        generator: random source for the k-means initialisation.
        inducing: initial Z per partition ([M_k, D] each, model units; ignored where
            M_k = N_k) instead of ``inducing_init`` (e.g. drawn once by
            :func:`initial_inducing` for a fit split over workers).
        start_scales: [K, 2] factors on each partition's initial lengthscales (and periods) and
            Gaussian noise that the data set (the starts of restarts,
            :mod:`pyrogp_models.inference.restarts`); default ones.
        standardisation: the map from data units to the model units of X, y; the partition's
            rule routes new inputs in data units (:meth:`predictive_model`). Without it the
            rule is applied to model units (right when X is in data units).
        name: the Pyro name (default: a fresh ``"local"``).
    """

    def __init__(self, X: torch.Tensor, y: torch.Tensor, partition: Partition,
                 num_inducing: int | Sequence[int] | None, likelihood: str = "gaussian",
                 likelihood_options: dict | None = None,
                 kernel: str | torch.nn.Module = "rbf", ard: bool = False,
                 inducing_init: str = "kmeans", learn_inducing: bool = True,
                 collapsed: bool = False, batch_size: int | None = None,
                 jitter: float = DEFAULT_JITTER, noise: float | None = None,
                 generator: torch.Generator | None = None,
                 inducing: Sequence[torch.Tensor] | None = None,
                 start_scales: torch.Tensor | None = None,
                 standardisation: Standardisation | None = None, name: str | None = None):
        super().__init__(name or unique_name("local"))
        self.standardisation = standardisation
        self.likelihood_name = likelihood
        self.likelihood_options = dict(likelihood_options or {})
        self.collapsed = collapsed
        self.partition = partition
        template = resolve_kernel(kernel, X.shape[-1], ard)
        per_partition = inducing_per_partition(partition, num_inducing)
        make_likelihood(likelihood, (), **self.likelihood_options).validate_targets(y)
        Xp, yp, mask, index = pad_partitions(X, y, partition)
        self.num_points = len(y)
        self.groups = PyroModuleList([])
        self.group_members: list[torch.Tensor] = []
        self._group_index: list[torch.Tensor] = []
        scales = (X.new_ones(len(per_partition), 2) if start_scales is None
                  else torch.as_tensor(start_scales).to(X))
        sizes = partition.sizes
        for M, members, whole in _groups(per_partition, sizes):
            if inducing is None or whole:
                Z = _group_inducing(Xp, mask, sizes, M, members, whole, inducing_init, generator)
            else:
                Z = torch.stack([inducing[k] for k in members.tolist()]).to(X)
            rows = int(sizes[members].max())
            members = torch.as_tensor(members, device=X.device)
            self.groups.append(self._build_group(
                Xp[members, :rows], yp[members, :rows], mask[members, :rows], Z, template,
                learn_inducing and not whole, batch_size, jitter, noise, scales[members]))
            self.group_members.append(members)
            self._group_index.append(index[members, :rows])

    def _build_group(self, X, y, mask, Z, template, learn_inducing, batch_size, jitter,
                     noise, scales) -> BatchedSVGP:
        """One group's SVGP, initialised by the rule of
        :mod:`~pyrogp_models.models.local.initialisation`."""
        count = len(X)
        variance, values = X.new_ones(count), {}
        if self.likelihood_name == "gaussian":
            variance, initial_noise = initial_gaussian_variances(y, mask)
            values = {"variance": initial_noise * scales[:, 1] if noise is None else noise}
        likelihood = make_likelihood(self.likelihood_name, (count,), X.dtype, X.device,
                                     **self.likelihood_options, **values)
        if isinstance(template, External):
            kernel_module = template.batched((count, likelihood.num_latent)).to(X)
        else:
            kernel_module = initial_kernel(template, X, mask, Z.shape[-2],
                                           variance, likelihood.num_latent, scales[:, 0])
        return BatchedSVGP(Z, kernel_module, likelihood, X, y, mask,
                           learn_inducing=learn_inducing, inducing_scale=input_spread(X, mask),
                           collapsed=self.collapsed, batch_size=batch_size, jitter=jitter,
                           name="group")

    @property
    def svgps(self) -> list[BatchedSVGP]:
        return list(self.groups)

    @property
    def noisy_objective(self) -> bool:
        """Whether the ELBO is estimated (minibatches or Monte Carlo expectations): the trainer
        then judges convergence against the loss's own noise."""
        return any(svgp.batch_size is not None or svgp.likelihood.stochastic
                   for svgp in self.svgps)

    @property
    def num_partitions(self) -> int:
        return sum(len(m) for m in self.group_members)

    # Pyro model / guide -----------------------------------------------------------------------
    @pyro_method
    def model(self, offset: torch.Tensor | None = None):
        """Every group's model; ``offset`` [N] (data order) is added to the latent means."""
        for group, index in zip(self.groups, self._group_index, strict=True):
            group.model(None if offset is None else offset[index])

    @pyro_method
    def guide(self, *args, **kwargs):
        """Every group's q(v) (nothing for collapsed groups); arguments are ignored."""
        for group in self.groups:
            group.guide()

    @pyro_method
    def predictive_model(self, X: torch.Tensor | None = None,
                         assignments: np.ndarray | None = None):
        """f and y at the data (default) or at new inputs X [N, D] (model units), each point in
        its partition (``assignments`` [N], default: :meth:`route`). Per-group sites are
        padded; the deterministic sites ``f`` [N(, L)] and ``y`` [N] are in point order."""
        if X is None:
            layout = [(g.data_X, index, g.data_mask) for g, index in
                      zip(self.groups, self._group_index, strict=True)]
            count = self.num_points
        else:
            assignments = self.route(X) if assignments is None else np.asarray(assignments)
            index, mask = _padded_layout(assignments, self.num_partitions, X.device)
            layout = [(X[index[m]], index[m], mask[m]) for m in self.group_members]
            count = len(X)
        f_all = y_all = None
        trailing = int(self.groups[0].num_latent > 1)
        for group, (inputs, index, mask) in zip(self.groups, layout, strict=True):
            f, y = group.predictive_model(inputs)
            if f_all is None:  # one spare slot at the end receives the padding
                f_all = f.new_zeros(*f.shape[:f.dim() - 2 - trailing], count + 1,
                                    *f.shape[f.dim() - trailing:])
                y_all = y.new_zeros(*y.shape[:-2], count + 1)
            _scatter_points(f_all, f, mask, index, trailing)
            _scatter_points(y_all, y, mask, index, 0)
        spare = (..., slice(0, count)) + (slice(None),) * trailing
        pyro.deterministic(self._pyro_get_fullname("f"), f_all[spare])
        pyro.deterministic(self._pyro_get_fullname("y"), y_all[..., :count])

    def route(self, X: torch.Tensor) -> np.ndarray:
        """The partition of each new input X [N, D] (model units) by the partition's rule, which
        is in data units (mapped back by the ``standardisation``); [N]. Raises
        :class:`~pyrogp_models.errors.DataError` if the rule does not send the model's own
        inputs to their partitions (a standardisation was due and not given)."""
        def rule_units(inputs: torch.Tensor) -> np.ndarray:
            values = inputs.detach().cpu().numpy()
            s = self.standardisation
            return values if s is None else values * s.x_scale + s.x_mean

        sample = np.linspace(0, self.num_points - 1, min(self.num_points, 64)).astype(np.int64)
        rows = [(g.data_X[k, : int(mask.sum())], members[k]) for g, members in
                zip(self.groups, self.group_members, strict=True)
                for k, mask in enumerate(g.data_mask)]
        own = torch.cat([inputs for inputs, _ in rows])
        expected = np.concatenate([np.full(len(inputs), int(k)) for inputs, k in rows])
        if not np.array_equal(route(self.partition.rule, rule_units(own[sample])),
                              expected[sample]):
            raise DataError("the partition's rule does not route the model's own inputs to "
                            "their partitions: give LocalGPs the standardisation of its inputs "
                            "(or pass assignments)")
        return route(self.partition.rule, rule_units(X))

    @pyro_method
    def predictive_guide(self, *args, **kwargs):
        """q(v) of every group (collapsed groups: their optimum); arguments are ignored."""
        for group in self.groups:
            group.predictive_guide()

    def member_objectives(self, precise: bool = False) -> list:
        """Every group's (parameters, −objective [K_g]) (see
        :meth:`~pyrogp_models.models.local.svgp.BatchedSVGP.member_objectives`)."""
        return [block for group in self.groups for block in group.member_objectives(precise)]

    def held_parameters(self) -> list[torch.nn.Parameter]:
        """Every group's Z (:meth:`~pyrogp_models.models.local.svgp.BatchedSVGP.
        held_parameters`)."""
        return [p for group in self.groups for p in group.held_parameters()]

    # Results ----------------------------------------------------------------------------------
    @torch.no_grad()
    def finalise(self) -> None:
        """After collapsed training, write the optimal q(u) into every group."""
        for group in self.groups:
            group.finalise()

    @torch.no_grad()
    def take_partitions(self, other: LocalGPs, taken: torch.Tensor) -> None:
        """Copy every value of the partitions where ``taken`` [K] (partition order) is true from
        ``other``, a model of the same data, kernel structure and inducing sizes (a fit from
        other starts)."""
        for mine, theirs, members in zip(self.groups, other.groups, self.group_members,
                                         strict=True):
            chosen = taken.to(members.device)[members]
            replacements = theirs.state_dict()
            for name, value in mine.state_dict().items():
                if value.shape[:1] != chosen.shape or replacements[name].shape != value.shape:
                    raise ValueError(f"'{name}' has no value per partition to take")
                mask = chosen.reshape(-1, *[1] * (value.dim() - 1))
                value.copy_(torch.where(mask, replacements[name], value))

    def partition_values(self, values: list) -> list:
        """Per-member values in the order of :meth:`member_objectives` (group by group) →
        partition order (empty stays empty; one value of a group that is one member, with a
        kernel from outside the library, stands for each of its partitions)."""
        if not values:
            return []
        order = torch.cat(self.group_members).tolist()
        if len(values) < len(order):
            values = [value for group, value in zip(self.group_members, values, strict=True)
                      for _ in range(len(group))]
        out = [None] * len(order)
        for k, value in zip(order, values, strict=True):
            out[k] = value
        return out

    def member_values(self, values: list) -> list:
        """Per-partition values → the order of :meth:`member_objectives`, where every member is
        one partition (the inverse of :meth:`partition_values`; empty stays empty)."""
        if not values:
            return []
        return [values[k] for k in torch.cat(self.group_members).tolist()]

    @torch.no_grad()
    def elbo(self) -> torch.Tensor:
        """The exact ELBO of every partition, in partition order; [K]."""
        return self._in_partition_order([group.elbo() for group in self.groups])

    @torch.no_grad()
    def elbo_ceiling(self) -> torch.Tensor:
        """What no ELBO of a partition reaches above, in partition order [K]: its likelihood's
        :meth:`~pyrogp_models.likelihoods.base.Likelihood.log_likelihood_ceiling` for its
        points (+∞ where the likelihood knows none)."""
        return self._in_partition_order([
            group.likelihood.log_likelihood_ceiling(group.data_mask.sum(-1).to(group.data_X.dtype))
            for group in self.groups])

    def _in_partition_order(self, per_group: list[torch.Tensor]) -> torch.Tensor:
        """Values of every group's members [K_g] → one tensor in partition order [K]."""
        out = per_group[0].new_empty(self.num_partitions)
        for values, members in zip(per_group, self.group_members, strict=True):
            out[members] = values
        return out

    def above_ceiling(self, elbos: torch.Tensor) -> torch.Tensor:
        """Which of the partitions' ``elbos`` [K] are not at or below :meth:`elbo_ceiling` (NaN
        included): rounding error, not a fit (float32 kernel values that ran off: a periodic ×
        RBF term's variances at 10¹² over a noise of 10⁻², where the bound's large terms
        cancel)."""
        return ~(elbos <= self.elbo_ceiling())

    def possible(self, elbos: torch.Tensor) -> torch.Tensor:
        """The partitions' ``elbos`` [K] with −∞ where one lies :meth:`above_ceiling`, so that
        no choice between fits keeps it."""
        return torch.where(self.above_ceiling(elbos), -math.inf, elbos)

    @torch.no_grad()
    def to_modules(self, standardisation: Standardisation, names: Sequence[str] | None = None,
                   info: dict | None = None) -> dict[str, Module]:
        """Export every partition as a :class:`Module` (q(u) of collapsed groups at its
        optimum). Names default to ``part000``, ``part001``, ..."""
        self.finalise()
        elbos = self.elbo()
        width = max(3, len(str(self.num_partitions - 1)))
        names = list(names or [f"part{k:0{width}d}" for k in range(self.num_partitions)])
        modules: dict[int, tuple[str, Module]] = {}
        for group, members in zip(self.groups, self.group_members, strict=True):
            q_mean, q_chol = group.unwhitened_posterior()
            params = group.likelihood.parameter_values()
            counts = group.data_mask.sum(-1)
            for j, k in enumerate(members.tolist()):
                modules[k] = (names[k], Module(
                    kernel=member(group.kernel, j),
                    likelihood_name=self.likelihood_name,
                    likelihood_options=group.likelihood.options(),
                    likelihood_params={key: v[j].detach().clone() for key, v in params.items()},
                    inducing=group.inducing[j].detach().clone(),
                    q_mean=q_mean[j].clone(), q_chol=q_chol[j].clone(),
                    num_data=int(counts[j]), elbo=float(elbos[k]),
                    standardisation=standardisation, jitter=group.jitter,
                    info={"name": names[k], "partition": k, **(info or {})}))
        return dict(modules[k] for k in sorted(modules))


@torch.no_grad()
def initial_inducing(X: torch.Tensor, y: torch.Tensor, partition: Partition,
                     num_inducing: int | Sequence[int] | None, method: str = "kmeans",
                     generator: torch.Generator | None = None) -> list[torch.Tensor]:
    """Initial Z [M_k, D] of every partition, drawn exactly as :class:`LocalGPs` draws them."""
    per_partition = inducing_per_partition(partition, num_inducing)
    Xp, _, mask, _ = pad_partitions(X, y, partition)
    return _initial_inducing_padded(Xp, mask, per_partition, partition.sizes, method, generator)


def inducing_per_partition(partition: Partition, num_inducing: int | Sequence[int] | None
                           ) -> np.ndarray:
    """M_k of every partition [K]; ``None``: M_k = min(⌈N_k/2⌉, 100)
    (:func:`~pyrogp_models.data.inducing.default_num_inducing`). A partition with fewer points
    than its M_k is refused."""
    sizes = partition.sizes
    if num_inducing is None:
        return default_num_inducing(sizes)
    per_partition = np.broadcast_to(np.asarray(num_inducing), sizes.shape)
    if bool((per_partition > sizes).any()):
        k = int(np.argmax(per_partition > sizes))
        raise DataError(f"partition {k} has {sizes[k]} points, fewer than its "
                        f"{per_partition[k]} inducing inputs")
    return per_partition


def _groups(per_partition: np.ndarray, sizes: np.ndarray
            ) -> list[tuple[int, np.ndarray, bool]]:
    """(M, members, whole) of every group, one per distinct (M_k, whole): whole partitions have
    M_k = N_k and keep Z = X_k fixed."""
    whole = per_partition == sizes
    keys = sorted(set(zip(per_partition.tolist(), whole.tolist(), strict=True)))
    return [(M, np.flatnonzero((per_partition == M) & (whole == w)), w) for M, w in keys]


def _group_inducing(Xp, mask, sizes, M: int, members: np.ndarray, whole: bool, method,
                    generator) -> torch.Tensor:
    """Initial Z [G, M, D] of one group: the partitions' own inputs where whole, else one
    batched k-means or grid over them."""
    if whole:
        return Xp[members, :M]
    rows = int(sizes[members].max())
    return init_inducing(Xp[members, :rows], M, mask[members, :rows], method, generator)


def _initial_inducing_padded(Xp, mask, per_partition, sizes, method, generator
                             ) -> list[torch.Tensor]:
    """Initial Z of every partition, group by group in :class:`LocalGPs`' order (so the same
    ``generator`` gives the same draws)."""
    inducing: dict[int, torch.Tensor] = {}
    for M, members, whole in _groups(per_partition, sizes):
        Z = _group_inducing(Xp, mask, sizes, M, members, whole, method, generator)
        inducing.update(zip(members.tolist(), Z, strict=True))
    return [inducing[k] for k in range(len(per_partition))]


def _padded_layout(assignments: np.ndarray, num_partitions: int, device: torch.device
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of the points of every partition, padded: ``index`` [K, N_max] (0 on padding) and
    ``mask`` [K, N_max]; partitions may be empty. Computed on the host from host assignments."""
    sizes = np.bincount(assignments, minlength=num_partitions)
    order = np.argsort(assignments, kind="stable")
    positions = np.arange(order.size) - (np.cumsum(sizes) - sizes)[assignments[order]]
    index = np.zeros((num_partitions, max(int(sizes.max(initial=0)), 1)), dtype=np.int64)
    index[assignments[order], positions] = order
    mask = np.arange(index.shape[1]) < sizes[:, None]
    return (torch.as_tensor(index, device=device), torch.as_tensor(mask, device=device))


def _scatter_points(out: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                    index: torch.Tensor, trailing: int) -> None:
    """Write padded values [..., K, N, *T] (``trailing`` = len(T) dimensions) into ``out``
    [..., P + 1, *T] at the data rows ``index`` of the real (``mask``) slots; padded slots go to
    the spare row P (no data-dependent shapes, so nothing is read back to the host)."""
    moved = values.movedim(tuple(range(-trailing, 0)), tuple(range(trailing)))
    target = out.movedim(tuple(range(-trailing, 0)), tuple(range(trailing)))
    rows = torch.where(mask, index, target.shape[-1] - 1)
    target[..., rows.reshape(-1)] = moved.reshape(*moved.shape[:-2], -1)
