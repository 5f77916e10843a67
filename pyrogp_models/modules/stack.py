"""A dictionary of modules as batched, cached tensors: what recycling and expert combination read.

Every module is first converted to one coordinate system, exactly (the pooled standardisation
of the modules' data, :mod:`pyrogp_models.modules.units`), so modules fitted at independent
sites, with their own standardisations, combine. Modules are then grouped by kernel structure
(one tree of kinds, :func:`~pyrogp_models.kernels.members.signature`) and number of inducing
inputs M_k (no padding). Each group stacks the inducing inputs Z_k, the kernels (one batched
kernel, :func:`~pyrogp_models.kernels.members.stack`), the constant prior mean,
q(u_k) = N(μ_k, S_k) per latent function and chol(K_kk^{(k)} + jitter_k) — the module's prior
p_k(u_k) under its *own* kernel and jitter — computed once, since none of them changes while a
meta-GP trains or a combination predicts.
Derived per group on first use:

- the site parameters P_k = S_k⁻¹ − K_kk^{(k)−1}, b_k = S_k⁻¹μ_k − K_kk^{(k)−1}μ_pk of
  single-latent modules (:func:`pyrogp_models.gaussian.expectations.site_parameters`), which the
  meta-GPs' bounds use;
- :attr:`ModuleStack.sites`, the site parameters of all modules in the *stacked layout* the
  meta-GP's bound reads (:func:`pyrogp_models.gaussian.expectations.site_quadratic`): blocks of
  up to :data:`SITE_BLOCK_COLUMNS` module inducing inputs of one M_k-group, each block
  position-major (point j of its module g at j·G + g), so that applying the M_k × M_k site
  factors of all its modules is M_k scaled additions of [M, M_k, G] slices;
- the whitened posterior and L_k⁻¹ (by one triangular solve against I: batched products are
  several times faster than batched triangular solves on CPU), with which
  :meth:`ModuleGroup.latent` predicts every module of the group at once.

Building a stack checks that the modules fit its purpose (:func:`check_compatible`):
``"recycle"`` (one latent function, the meta-GP), ``"recycle-outputs"`` (one output each, the
multi-output meta-GP), ``"combine"`` (the same observations, products of experts) or ``"route"``
(one partition each). :func:`clip_site_precisions` is the optional repair of modules whose site
precision P_k is indefinite, which makes the ensemble bound of Recyclable GPs (eq. 6) unbounded
above.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import NamedTuple

import torch

from pyrogp_models.data import Standardisation
from pyrogp_models.errors import CholeskyError, IncompatibleModulesError
from pyrogp_models.gaussian import conditionals
from pyrogp_models.gaussian.expectations import SiteParameters, site_parameters
from pyrogp_models.gaussian.linalg import cholesky, triangular_solve
from pyrogp_models.kernels import (
    External,
    Kernel,
    describable,
    kernel_from_tree,
    signature,
)
from pyrogp_models.kernels import stack as stack_kernels
from pyrogp_models.likelihoods import LIKELIHOODS
from pyrogp_models.modules.record import Module
from pyrogp_models.modules.units import common_standardisation, convert

#: A site precision counts as indefinite when a singular value of L_pk⁻¹L_k exceeds 1 + this.
SITE_TOLERANCE = 1e-8
#: Module inducing inputs per block of the stacked layout (:attr:`ModuleStack.sites`): few
#: enough that a block's [M, columns] operands stay in the last-level cache, enough that the
#: per-block work on M × M matrices is small (M = 35, bound + gradient: 8192 beat 4096 by 8 % at
#: 5000 modules and by 7 % at 30 000, where it beat 16384 by 2 %).
SITE_BLOCK_COLUMNS = 8192
#: What a stack is for (see :func:`check_compatible`).
PURPOSES = ("recycle", "recycle-outputs", "combine", "route")


@dataclass(frozen=True, eq=False)
class ModuleGroup:
    """The G modules of a stack that share kernel structure and M_k, stacked along dim 0, with
    L latent functions each."""

    names: tuple[str, ...]
    indices: torch.Tensor  # positions in the stack's module order, [G]
    kernel: Kernel  # the modules' kernels, batch shape (G, L)
    inducing: torch.Tensor  # Z_k, [G, M_k, D]
    mean: torch.Tensor  # μ_k, [G, L, M_k]
    chol: torch.Tensor  # chol S_k, [G, L, M_k, M_k]
    prior_chol: torch.Tensor  # chol(K_kk^{(k)} + jitter_k), [G, L, M_k, M_k]
    prior_mean: torch.Tensor  # the constant prior mean, [G, L]

    @property
    def num_inducing(self) -> int:
        return self.inducing.shape[-2]

    def first_latent(self) -> tuple[torch.Tensor, ...]:
        """(μ_k [G, M_k], chol S_k, chol K_kk^{(k)} [G, M_k, M_k], μ_pk [G, M_k]) of the first
        latent function, the only one of modules that are recycled."""
        prior_mean = self.prior_mean[:, :1].expand(-1, self.num_inducing)
        return self.mean[:, 0], self.chol[:, 0], self.prior_chol[:, 0], prior_mean

    @cached_property
    def sites(self) -> SiteParameters:
        """P_k [G, M_k, M_k], b_k [G, M_k] and the constant [G] of single-latent modules, with
        P_k = R_k diag(s_k) R_kᵀ from :attr:`site_roots`."""
        roots, signs = self.site_roots
        precision = (roots * signs.unsqueeze(-2)) @ roots.mT
        return site_parameters(*self.first_latent())._replace(
            precision=0.5 * (precision + precision.mT))

    @cached_property
    def site_roots(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The site precisions in factored form P_k = R_k diag(s_k) R_kᵀ: R_k [G, M_k, M_k] and
        signs s_k ∈ {1, 0, −1} [G, M_k].

        P_k is formed in the prior metric: with T = L_pk⁻¹L_k = U diag(σ) Vᵀ,
        P_k = L_pk⁻ᵀ U diag(σ⁻² − 1) Uᵀ L_pk⁻¹ (= S_k⁻¹ − K_kk^{(k)−1}), so
        R_k = L_pk⁻ᵀ U diag(|σ⁻² − 1|)^½. Directions within :data:`SITE_TOLERANCE` of the prior
        (|σ − 1| ≤ tolerance) contribute exactly zero: there σ⁻² − 1 is rounding, which L_pk⁻ᵀ
        multiplies by up to the inverse of the module's prior scale (a module whose signal
        variance went to 10⁻⁸² gave P_k entries of 10⁷⁰ and an unbounded bound), and slightly
        negative values of it would make a bounded bound look unbounded under an ill-conditioned
        K_** of the meta-GP. Only the directions where a module is wider than its prior
        (under-fitted) get s = −1, for the boundedness guard to report."""
        _, _, prior_chol, _ = self.first_latent()
        U, singular = _whitened_singular_values(self)
        values = torch.where((singular - 1.0).abs() <= SITE_TOLERANCE, 0.0,
                             singular.pow(-2) - 1.0)
        basis = triangular_solve(prior_chol, U, transpose=True)  # L_pk⁻ᵀ U
        return basis * values.abs().sqrt().unsqueeze(-2), values.sign()

    @cached_property
    def _whitened(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """L_k⁻¹ and the whitened q(v_k) about the prior mean: mean [G, L, M], Cholesky factor
        [G, L, M, M]."""
        eye = torch.eye(self.num_inducing, dtype=self.mean.dtype, device=self.mean.device)
        mean_w, chol_w = conditionals.whiten(self.prior_chol,
                                             self.mean - self.prior_mean.unsqueeze(-1), self.chol)
        return triangular_solve(self.prior_chol, eye), mean_w, chol_w

    def latent(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q(f) marginals at X [N, D] (model units) of every module: mean, var [G, L, N]."""
        inverse_prior_chol, mean_w, chol_w = self._whitened
        cross = self.kernel(self.inducing.unsqueeze(1), X)  # [G, L, M, N]
        prior_diag = self.kernel(X, diag=True).expand(*cross.shape[:-2], X.shape[0])
        mean, var = conditionals.whitened_conditional(inverse_prior_chol @ cross, prior_diag,
                                                      mean_w, chol_w)
        return mean + self.prior_mean.unsqueeze(-1), var


class SiteBlock(NamedTuple):
    """Up to :data:`SITE_BLOCK_COLUMNS` module inducing inputs of G modules of one M_k-group in
    the stacked layout (position-major: point j of module g at j·G + g)."""

    inputs: torch.Tensor  # Z_k side by side, [G M_k, D]
    roots: torch.Tensor  # R_k, [M_k, M_k, G] (R_g[a, b] at [a, b, g])
    # s [G M_k]: P_k = R_k diag(s_k) R_kᵀ (None: no s is −1; the roots of an s = 0 are zero, so
    # +1 there changes nothing and saves the pass that applies s)
    sign: torch.Tensor | None
    shift: torch.Tensor  # b [G M_k]


class SiteTrace(NamedTuple):
    """The G modules of one M_k-group for Σ_k tr(P_k K_kk) = Σ_k [Σ_i (P_k)_ii K_ii +
    Σ_{i<j} ((P_k)_ij + (P_k)_ji) K_ij] with a symmetric K_kk: the diagonal of K_kk and its
    entries above the diagonal only, each pair (i, j) a row of ``left`` and ``right``."""

    inducing: torch.Tensor  # Z_k, [G, M_k, D]
    left: torch.Tensor  # z_ki of the pairs i < j, [G, P, D]
    right: torch.Tensor  # z_kj, [G, P, D]
    diagonal: torch.Tensor  # (P_k)_ii, [G, M_k]
    off_diagonal: torch.Tensor  # (P_k)_ij + (P_k)_ji, [G, P]


class StackedSites(NamedTuple):
    """The sites of all (single-latent) modules of a stack in the stacked layout (module
    docstring): constants of the meta-GP's bound, computed once per stack."""

    blocks: tuple[SiteBlock, ...]
    inputs: torch.Tensor  # the blocks' inputs one after another, [Σ_b G_b M_k, D]
    traces: tuple[SiteTrace, ...]  # per M_k-group
    constant: torch.Tensor  # Σ_k (the constants of SiteParameters), []


@dataclass(frozen=True, eq=False)
class ModuleStack:
    """Modules (converted to one coordinate system, dtype and device, in the given order) and
    their cached tensors grouped by kernel structure and M_k.

    ``standardisation`` is the common system (:func:`pyrogp_models.modules.units.
    common_standardisation`); for ``"recycle-outputs"`` every module keeps its own output units
    and the stack's output statistics are (0, 1).
    """

    modules: dict[str, Module]
    groups: tuple[ModuleGroup, ...]
    standardisation: Standardisation

    @classmethod
    def from_modules(cls, modules: Mapping[str, Module], purpose: str = "recycle",
                     dtype: torch.dtype = torch.float64, device=None) -> ModuleStack:
        """Check the modules fit ``purpose`` (:func:`check_compatible`), convert and cache."""
        check_compatible(modules, purpose)
        common = common_standardisation(modules)
        if purpose == "recycle-outputs":  # each output keeps its units
            common = Standardisation(common.x_mean, common.x_scale, 0.0, 1.0)
            targets = {name: Standardisation(common.x_mean, common.x_scale,
                                             m.standardisation.y_mean, m.standardisation.y_scale)
                       for name, m in modules.items()}
        else:
            targets = dict.fromkeys(modules, common)
        converted = {name: _converted(convert(module, targets[name]), dtype, device)
                     for name, module in modules.items()}
        names = list(converted)
        kinds: dict[tuple[int, str], list[int]] = {}
        for k, module in enumerate(converted.values()):  # kernels from outside: one group each
            key = signature(module.kernel) or f"external {k}"
            kinds.setdefault((module.num_inducing, key), []).append(k)
        groups = []
        for _, members in sorted(kinds.items()):
            group = [converted[names[k]] for k in members]
            kernel = _group_kernel([m.kernel for m in group])
            groups.append(ModuleGroup(
                names=tuple(names[k] for k in members),
                indices=torch.as_tensor(members, device=device), kernel=kernel,
                inducing=torch.stack([m.inducing for m in group]),
                mean=torch.stack([m.q_mean for m in group]),
                chol=torch.stack([m.q_chol for m in group]),
                prior_chol=_prior_choleskies(group, kernel),
                prior_mean=torch.stack([m.prior_mean for m in group])))
        return cls(converted, tuple(groups), common)

    @property
    def names(self) -> list[str]:
        return list(self.modules)

    @property
    def num_modules(self) -> int:
        return len(self.modules)

    @property
    def input_dim(self) -> int:
        return next(iter(self.modules.values())).input_dim

    @property
    def num_latent(self) -> int:
        return next(iter(self.modules.values())).num_latent

    @property
    def num_data(self) -> int:
        """Σ_k N_k."""
        return sum(module.num_data for module in self.modules.values())

    @property
    def elbo_sum(self) -> float:
        """Σ_k L_k, the modules' final ELBOs."""
        return float(sum(module.elbo for module in self.modules.values()))

    def latent(self, X: torch.Tensor, chunk_entries: int = 1 << 21
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Every module's q(f) marginals at X [N, D] (model units): mean, var [K, L, N], in
        chunks of test points of about ``chunk_entries`` cross-covariance entries per group."""
        N = X.shape[0]
        mean = X.new_empty((self.num_modules, self.num_latent, N))
        var = torch.empty_like(mean)
        for group in self.groups:
            chunk = max(1, chunk_entries // (group.num_inducing * len(group.names)
                                             * self.num_latent))
            for start in range(0, N, chunk):
                rows = slice(start, start + chunk)
                mean[group.indices, :, rows], var[group.indices, :, rows] = group.latent(X[rows])
        return mean, var

    @cached_property
    def inducing_points(self) -> torch.Tensor:
        """Every module's inducing inputs, group after group, [Σ_k M_k, D] (model units)."""
        return torch.cat([group.inducing.reshape(-1, self.input_dim) for group in self.groups])

    @cached_property
    def sites(self) -> StackedSites:
        """The site parameters of every module (first latent function) in the stacked layout,
        from :attr:`ModuleGroup.site_roots` and :attr:`ModuleGroup.sites`."""

        def position_major(values: torch.Tensor) -> torch.Tensor:  # [G, M_k, ...] → [M_k·G, ...]
            return values.transpose(0, 1).reshape(-1, *values.shape[2:])

        blocks = []
        for group in self.groups:
            roots, signs = group.site_roots
            step = max(1, SITE_BLOCK_COLUMNS // group.num_inducing)
            for start in range(0, len(group.names), step):
                part = slice(start, start + step)
                sign = position_major(signs[part])
                blocks.append(SiteBlock(position_major(group.inducing[part]),
                                        roots[part].permute(1, 2, 0).contiguous(),
                                        None if bool((sign >= 0).all()) else sign,
                                        position_major(group.sites.shift[part])))
        traces = []
        for group in self.groups:
            precision = group.sites.precision
            rows, columns = torch.triu_indices(group.num_inducing, group.num_inducing, 1,
                                               device=precision.device)  # the pairs i < j
            traces.append(SiteTrace(group.inducing, group.inducing[:, rows],
                                    group.inducing[:, columns],
                                    precision.diagonal(dim1=-2, dim2=-1),
                                    precision[:, rows, columns] + precision[:, columns, rows]))
        return StackedSites(tuple(blocks), torch.cat([block.inputs for block in blocks]),
                            tuple(traces),
                            sum(group.sites.constant.sum() for group in self.groups))

    def indefinite_sites(self) -> list[str]:
        """Modules whose site precision P_k is indefinite: S_k is wider than the module's own
        prior K_kk^{(k)} in some direction (an under-fitted module)."""
        found = []
        for group in self.groups:
            widest = _whitened_singular_values(group)[1].amax(-1)
            found += [name for name, s in zip(group.names, widest.tolist(), strict=True)
                      if s > 1.0 + SITE_TOLERANCE]
        return found

    def most_common_kernel(self) -> Kernel | None:
        """The kernel structure most modules share (the first one on ties), with the median of
        their values, batch shape (); None when no module's kernel is the library's."""
        keys = Counter(signature(m.kernel) for m in self.modules.values()
                       if describable(m.kernel))
        if not keys:
            return None
        key = keys.most_common(1)[0][0]
        kernels = [m.kernel for m in self.modules.values() if signature(m.kernel) == key]
        values = {name: torch.stack([k.named_values()[name][0] for k in kernels]).median(0)
                  .values for name in kernels[0].named_values()}
        return kernel_from_tree(kernels[0].tree(), values)


def _converted(module: Module, dtype: torch.dtype, device) -> Module:
    """The module in ``dtype`` on ``device`` (itself when it already is)."""
    target = torch.device(device) if device is not None else module.inducing.device
    tensors = [*module.kernel.named_values().values(), module.inducing, module.q_mean,
               module.q_chol, module.prior_mean, *module.likelihood_params.values()]
    if all(t.dtype == dtype and t.device == target for t in tensors):
        return module
    return module.to(dtype=dtype, device=device)


def _group_kernel(kernels: Sequence[Kernel]) -> Kernel:
    """The kernels of a group as one of batch shape (G, L): stacked, or (one module with a
    kernel from outside the library) the module's own copies."""
    if signature(kernels[0]) is not None:
        return stack_kernels(kernels)
    (kernel,) = kernels
    return External(kernel.copies[0], (1, *kernel.batch_shape), copies=list(kernel.copies))


def _prior_choleskies(group: list[Module], kernel: Kernel) -> torch.Tensor:
    """chol(K_kk^{(k)} + jitter_k) of modules with one kernel structure and M_k,
    [G, L, M_k, M_k], from the group's batched ``kernel``: one K for all, factorised per jitter
    (the same factors as :meth:`Module.prior_cholesky`, whose error names the module when one
    fails)."""
    inducing = torch.stack([module.inducing for module in group]).unsqueeze(1)
    covariance = kernel(inducing)
    out = torch.empty_like(covariance)
    jitters: dict[float, list[int]] = {}
    for k, module in enumerate(group):
        jitters.setdefault(module.jitter, []).append(k)
    for jitter, members in jitters.items():
        try:
            out[members] = cholesky(covariance[members], jitter)
        except CholeskyError:
            for k in members:  # raise the error that names the module
                group[k].prior_cholesky()
            raise
    return out


# Compatibility --------------------------------------------------------------------------------
Check = tuple[str, Callable[[Module], object]]

#: What every purpose needs of all modules alike, compared with the first module.
_SAME: dict[str, tuple[Check, ...]] = {
    "recycle": (("input dimension", lambda m: m.input_dim),
                ("data columns (features, target, units)", lambda m: m.columns)),
    "recycle-outputs": (("input dimension", lambda m: m.input_dim),
                        ("features", lambda m: m.columns.features)),
    "combine": (("likelihood", lambda m: (m.likelihood_name, m.likelihood_options)),
                ("number of latent functions", lambda m: m.num_latent),
                ("input dimension", lambda m: m.input_dim),
                ("data columns (features, target, units)", lambda m: m.columns)),
    "route": (("likelihood and number of latent functions",
               lambda m: (m.likelihood_name, m.num_latent)),
              ("input dimension", lambda m: m.input_dim),
              ("data columns (features, target, units)", lambda m: m.columns)),
}


def check_compatible(modules: Mapping[str, Module], purpose: str = "recycle") -> None:
    """Raise :class:`IncompatibleModulesError`, naming the modules, unless they fit ``purpose``:

    - every purpose: a known likelihood, the same input dimension and data columns
      (:class:`~pyrogp_models.data.columns.Columns`; only the features for
      ``"recycle-outputs"``, whose modules model different targets);
    - ``"recycle"``, ``"recycle-outputs"``: one latent function each;
    - ``"combine"``: the same likelihood (name and options) and number of latent functions;
    - ``"route"``: the same likelihood family and number of latent functions.

    Standardisations may differ: the stack converts every module to one system.
    """
    if purpose not in PURPOSES:
        raise ValueError(f"unknown purpose '{purpose}'; choose from {PURPOSES}")
    if not modules:
        raise IncompatibleModulesError("no modules to combine")
    names = list(modules)
    unknown = [name for name in names if modules[name].likelihood_name not in LIKELIHOODS]
    if unknown:
        raise IncompatibleModulesError(f"modules {listing(unknown)} have an unknown likelihood")
    if purpose.startswith("recycle"):
        several = [name for name in names if modules[name].num_latent != 1]
        if several:
            raise IncompatibleModulesError(
                f"modules {listing(several)} have several latent functions; only single-latent "
                "modules can be recycled")
    for what, key in _SAME[purpose]:
        odd = [name for name in names if key(modules[name]) != key(modules[names[0]])]
        if odd:
            raise IncompatibleModulesError(
                f"modules {listing(odd)} differ from module '{names[0]}' in {what}")


def listing(names: list[str], limit: int = 5) -> str:
    """Up to ``limit`` quoted names, then how many more."""
    shown = ", ".join(f"'{name}'" for name in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


# Repair of indefinite sites -----------------------------------------------------------------
def _whitened_singular_values(group: ModuleGroup) -> tuple[torch.Tensor, torch.Tensor]:
    """U and σ of T = L_pk⁻¹ L_k = U diag(σ) Vᵀ: L_pk⁻¹ S_k L_pk⁻ᵀ = U diag(σ²) Uᵀ."""
    _, chol, prior_chol, _ = group.first_latent()
    U, singular, _ = torch.linalg.svd(triangular_solve(prior_chol, chol))
    return U, singular


def clip_site_precisions(stack: ModuleStack) -> tuple[ModuleStack, dict[str, int]]:
    """Project every module's site precision onto the PSD cone; returns the repaired stack and
    the number of clipped directions per module.

    The clip is done in the module's prior metric: with T = L_pk⁻¹L_k = U diag(σ) Vᵀ the whitened
    site precision is L_pkᵀ P_k L_pk = U diag(σ⁻² − 1) Uᵀ, and its negative eigenvalues (σ > 1,
    directions where S_k is wider than the prior) are set to zero. The repaired module has
    S_k' = L_pk U diag(min(σ², 1)) Uᵀ L_pkᵀ ⪯ K
    and μ_k' − μ_pk = S_k' S_k⁻¹(μ_k − μ_pk), about the prior mean. Sites that are already PSD
    are unchanged.
    """
    groups, clipped = [], {}
    for group in stack.groups:
        mean, chol, prior_chol, prior_mean = group.first_latent()
        U, singular = _whitened_singular_values(group)
        variance = singular.square().clamp_max(1.0)
        whitened_mean = triangular_solve(prior_chol, (mean - prior_mean).unsqueeze(-1))
        shrink = variance / singular.square()
        repaired_mean = prior_mean.unsqueeze(-1) + prior_chol @ (
            U @ (shrink.unsqueeze(-1) * (U.mT @ whitened_mean)))
        root = prior_chol @ (U * variance.sqrt().unsqueeze(-2))  # S_k' = root rootᵀ
        _, upper = torch.linalg.qr(root.mT)  # rootᵀ = QR, so S_k' = RᵀR with no jitter
        repaired_chol = upper.mT * upper.diagonal(dim1=-2, dim2=-1).sign().unsqueeze(-2)
        counts = (singular > 1.0 + SITE_TOLERANCE).sum(-1)
        needs = counts > 0
        groups.append(replace(
            group,
            mean=torch.where(needs[:, None], repaired_mean.squeeze(-1), mean).unsqueeze(1),
            chol=torch.where(needs[:, None, None], repaired_chol, chol).unsqueeze(1)))
        clipped.update(zip(group.names, counts.tolist(), strict=True))
    return replace(stack, groups=tuple(groups)), clipped
