"""A dictionary of modules as batched, cached float64 tensors, ready for a meta-GP.

Modules are grouped by their number of inducing inputs M_k (no padding); each group stacks the
inducing inputs Z_k, the means μ_k, chol(S_k) and chol(K_kk^{(k)} + jitter_k) — the module's prior
p_k(u_k) under its *own* kernel and jitter — and the site parameters P_k = S_k⁻¹ − K_kk^{(k)−1},
b_k = S_k⁻¹μ_k (:func:`pyrogp_models.gaussian.expectations.site_parameters`), all computed once,
since none
of them changes while a meta-GP trains. Building a stack checks that the modules can be combined
into one latent function (or, for the multi-output meta-GP, into correlated outputs).

:func:`clip_site_precisions` is the optional repair of modules whose site precision P_k is
indefinite, which makes the ensemble bound of Recyclable GPs (eq. 6) unbounded above.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from pyrogp_models.data import Standardisation
from pyrogp_models.errors import CholeskyError, IncompatibleModulesError
from pyrogp_models.gaussian.expectations import site_parameters
from pyrogp_models.gaussian.linalg import cholesky, triangular_solve
from pyrogp_models.kernels import PROFILES, stationary_covariance
from pyrogp_models.likelihoods import LIKELIHOODS
from pyrogp_models.modules.record import Module

#: Relative tolerance when comparing the standardisations of modules.
STANDARDISATION_RTOL = 1e-9
#: A site precision counts as indefinite when a singular value of L_pk⁻¹L_k exceeds 1 + this.
SITE_TOLERANCE = 1e-8


@dataclass(frozen=True, eq=False)
class ModuleGroup:
    """The modules of a stack that share M_k, stacked along dim 0 (G modules).

    The site parameters are derived from μ_k, S_k and K_kk^{(k)} when the group is built (and
    again by :func:`dataclasses.replace`).
    """

    names: tuple[str, ...]
    indices: torch.Tensor  # positions in the stack's module order, [G]
    inducing: torch.Tensor  # Z_k, [G, M_k, D]
    mean: torch.Tensor  # μ_k, [G, M_k]
    chol: torch.Tensor  # chol S_k, [G, M_k, M_k]
    prior_chol: torch.Tensor  # chol(K_kk^{(k)} + jitter_k), [G, M_k, M_k]
    site_precision: torch.Tensor = field(init=False, repr=False)  # P_k, [G, M_k, M_k]
    site_shift: torch.Tensor = field(init=False, repr=False)  # b_k = S_k⁻¹μ_k, [G, M_k]
    # μ_kᵀS_k⁻¹μ_k + log|S_k| − log|K_kk^{(k)}|, [G]
    site_constant: torch.Tensor = field(init=False, repr=False)

    def __post_init__(self):
        sites = site_parameters(self.mean, self.chol, self.prior_chol)
        object.__setattr__(self, "site_precision", sites.precision)
        object.__setattr__(self, "site_shift", sites.shift)
        object.__setattr__(self, "site_constant", sites.constant)

    @property
    def num_inducing(self) -> int:
        return self.inducing.shape[-2]


@dataclass(frozen=True, eq=False)
class ModuleStack:
    """Modules (in float64, in the given order) and their cached tensors grouped by M_k.

    ``standardisation`` is the modules' common input standardisation, with the output
    standardisation of the target-standardising modules when they share one latent function.
    """

    modules: dict[str, Module]
    groups: tuple[ModuleGroup, ...]
    standardisation: Standardisation

    @classmethod
    def from_modules(cls, modules: Mapping[str, Module], shared_output: bool = True,
                     dtype: torch.dtype = torch.float64, device=None) -> ModuleStack:
        """Check compatibility (see :func:`check_compatible`), convert and cache.

        ``shared_output``: the modules observe one latent function (the meta-GP), so modules with
        standardised targets must share their output standardisation; ``False`` for the
        multi-output meta-GP, where each module is its own output.
        """
        check_compatible(modules, shared_output)
        converted = {name: _converted(module, dtype, device) for name, module in modules.items()}
        names = list(converted)
        groups = []
        for size in sorted({module.num_inducing for module in converted.values()}):
            members = [k for k, name in enumerate(names) if converted[name].num_inducing == size]
            group = [converted[names[k]] for k in members]
            groups.append(ModuleGroup(
                names=tuple(names[k] for k in members),
                indices=torch.as_tensor(members, device=device),
                inducing=torch.stack([m.inducing for m in group]),
                mean=torch.stack([m.q_mean[0] for m in group]),
                chol=torch.stack([m.q_chol[0] for m in group]),
                prior_chol=_prior_choleskies(group)))
        return cls(converted, tuple(groups), _common_standardisation(converted, shared_output))

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
    def num_data(self) -> int:
        """Σ_k N_k."""
        return sum(module.num_data for module in self.modules.values())

    @property
    def elbo_sum(self) -> float:
        """Σ_k L_k, the modules' final ELBOs."""
        return float(sum(module.elbo for module in self.modules.values()))

    def indefinite_sites(self) -> list[str]:
        """Modules whose site precision P_k is indefinite: S_k is wider than the module's own
        prior K_kk^{(k)} in some direction (an under-fitted module)."""
        found = []
        for group in self.groups:
            widest = _whitened_singular_values(group)[1].amax(-1)
            found += [name for name, s in zip(group.names, widest.tolist(), strict=True)
                      if s > 1.0 + SITE_TOLERANCE]
        return found


def _converted(module: Module, dtype: torch.dtype, device) -> Module:
    """The module in ``dtype`` on ``device`` (itself when it already is)."""
    target = torch.device(device) if device is not None else module.inducing.device
    tensors = [module.lengthscale, module.variance, module.inducing, module.q_mean,
               module.q_chol, *module.likelihood_params.values()]
    if all(t.dtype == dtype and t.device == target for t in tensors):
        return module
    return module.to(dtype=dtype, device=device)


def _prior_choleskies(group: list[Module]) -> torch.Tensor:
    """chol(K_kk^{(k)} + jitter_k) of modules with one M_k, [G, M_k, M_k]: batched over the
    modules that share kernel family, jitter and lengthscale shape (the same factors as
    :meth:`Module.prior_cholesky`, whose error names the module when one fails)."""
    kinds: dict[tuple, list[int]] = {}
    for k, module in enumerate(group):
        kinds.setdefault((module.kernel_family, module.jitter, module.lengthscale.shape[-1]),
                         []).append(k)
    first = group[0].inducing
    out = first.new_empty(len(group), first.shape[-2], first.shape[-2])
    for (family, jitter, _), members in kinds.items():
        inducing = torch.stack([group[k].inducing for k in members])
        lengthscale = torch.stack([group[k].lengthscale[0] for k in members])
        variance = torch.stack([group[k].variance[0] for k in members])
        try:
            chol = cholesky(stationary_covariance(family, inducing, inducing, lengthscale,
                                                  variance), jitter)
        except CholeskyError:
            for k in members:  # raise the error that names the module
                group[k].prior_cholesky()
            raise
        out[members] = chol
    return out


def check_compatible(modules: Mapping[str, Module], shared_output: bool = True) -> None:
    """Raise :class:`IncompatibleModulesError`, naming the modules, unless every module has one
    latent function, a known kernel family and likelihood, the same input dimension and the same
    input standardisation (and, with ``shared_output``, the same output standardisation among
    modules whose likelihood standardises its targets)."""
    if not modules:
        raise IncompatibleModulesError("no modules to combine")
    names = list(modules)

    def differ(what: str, key) -> None:
        odd = _odd_ones(names, [key(modules[name]) for name in names])
        if odd:
            raise IncompatibleModulesError(
                f"modules {_listing(odd)} differ from module '{names[0]}' in {what}")

    several = [name for name in names if modules[name].num_latent != 1]
    if several:
        raise IncompatibleModulesError(
            f"modules {_listing(several)} have several latent functions; only single-latent "
            "modules can be recycled")
    unknown = [name for name in names if modules[name].likelihood_name not in LIKELIHOODS
               or modules[name].kernel_family not in PROFILES]
    if unknown:
        raise IncompatibleModulesError(
            f"modules {_listing(unknown)} have an unknown likelihood or kernel family")
    differ("input dimension", lambda m: m.input_dim)
    differ("input standardisation (x_mean, x_scale)",
           lambda m: np.concatenate([m.standardisation.x_mean, m.standardisation.x_scale]))
    if shared_output:
        standardised = [name for name in names
                        if LIKELIHOODS[modules[name].likelihood_name].standardise_targets]
        if standardised:
            odd = _odd_ones(standardised, [(modules[name].standardisation.y_mean,
                                             modules[name].standardisation.y_scale)
                                            for name in standardised])
            if odd:
                raise IncompatibleModulesError(
                    f"modules {_listing(odd)} standardise their targets differently from module "
                    f"'{standardised[0]}', so their latent functions are in different units")


def _same(value, reference) -> bool:
    return bool(np.allclose(value, reference, rtol=STANDARDISATION_RTOL, atol=0.0))


def _odd_ones(names: list[str], values: list) -> list[str]:
    """The names whose value differs from the first one's (:func:`_same`), compared in one
    vectorised test when the values have one shape."""
    try:
        stacked = np.asarray(values, dtype=np.float64)
    except ValueError:  # ragged: compare one by one
        return [name for name, value in zip(names, values, strict=True)
                if not _same(value, values[0])]
    close = np.isclose(stacked, stacked[0], rtol=STANDARDISATION_RTOL, atol=0.0)
    return [name for name, same in zip(names, close.reshape(len(names), -1).all(-1),
                                       strict=True) if not same]


def _listing(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(f"'{name}'" for name in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _common_standardisation(modules: dict[str, Module], shared_output: bool) -> Standardisation:
    first = next(iter(modules.values())).standardisation
    if shared_output:
        for module in modules.values():
            if LIKELIHOODS[module.likelihood_name].standardise_targets:
                return module.standardisation
    return Standardisation(first.x_mean, first.x_scale, 0.0, 1.0)


def most_common_kernel(stack: ModuleStack) -> str:
    """The kernel family used by most modules (the first one on ties)."""
    return Counter(m.kernel_family for m in stack.modules.values()).most_common(1)[0][0]


# Repair of indefinite sites -----------------------------------------------------------------
def _whitened_singular_values(group: ModuleGroup) -> tuple[torch.Tensor, torch.Tensor]:
    """U and σ of T = L_pk⁻¹ L_k = U diag(σ) Vᵀ: L_pk⁻¹ S_k L_pk⁻ᵀ = U diag(σ²) Uᵀ."""
    U, singular, _ = torch.linalg.svd(triangular_solve(group.prior_chol, group.chol))
    return U, singular


def clip_site_precisions(stack: ModuleStack) -> tuple[ModuleStack, dict[str, int]]:
    """Project every module's site precision onto the PSD cone; returns the repaired stack and
    the number of clipped directions per module.

    The clip is done in the module's prior metric: with T = L_pk⁻¹L_k = U diag(σ) Vᵀ the whitened
    site precision is L_pkᵀ P_k L_pk = U diag(σ⁻² − 1) Uᵀ, and its negative eigenvalues (σ > 1,
    directions where S_k is wider than the prior) are set to zero while the site's linear term
    b_k = S_k⁻¹μ_k is kept. The repaired module has S_k' = L_pk U diag(min(σ², 1)) Uᵀ L_pkᵀ ⪯ K
    and μ_k' = S_k' b_k. Sites that are already PSD are unchanged.
    """
    groups, clipped = [], {}
    for group in stack.groups:
        U, singular = _whitened_singular_values(group)
        variance = singular.square().clamp_max(1.0)
        whitened_mean = triangular_solve(group.prior_chol, group.mean.unsqueeze(-1))
        shrink = variance / singular.square()
        repaired_mean = group.prior_chol @ (U @ (shrink.unsqueeze(-1) * (U.mT @ whitened_mean)))
        root = group.prior_chol @ (U * variance.sqrt().unsqueeze(-2))  # S_k' = root rootᵀ
        _, upper = torch.linalg.qr(root.mT)  # rootᵀ = QR, so S_k' = RᵀR with no jitter
        repaired_chol = upper.mT * upper.diagonal(dim1=-2, dim2=-1).sign().unsqueeze(-2)
        counts = (singular > 1.0 + SITE_TOLERANCE).sum(-1)
        needs = counts > 0
        groups.append(replace(
            group, mean=torch.where(needs.unsqueeze(-1), repaired_mean.squeeze(-1), group.mean),
            chol=torch.where(needs.unsqueeze(-1).unsqueeze(-1), repaired_chol, group.chol)))
        clipped.update(zip(group.names, counts.tolist(), strict=True))
    return replace(stack, groups=tuple(groups)), clipped
