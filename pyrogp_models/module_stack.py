"""A dictionary of modules as batched, cached float64 tensors, ready for a meta-GP.

Modules are grouped by their number of inducing inputs M_k (no padding); each group stacks the
inducing inputs Z_k, the means μ_k, chol(S_k) and chol(K_kk^{(k)} + jitter_k) — the module's prior
p_k(u_k) under its *own* kernel and jitter — computed once, since none of them changes while a
meta-GP trains. Building a stack checks that the modules can be combined into one latent function
(or, for the multi-output meta-GP, into correlated outputs).

:func:`clip_site_precisions` is the optional repair of modules whose site precision
P_k = S_k⁻¹ − K_kk^{(k)−1} is indefinite (spec §2.14).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
import torch

from pyrogp_models.data import Standardisation
from pyrogp_models.errors import IncompatibleModulesError
from pyrogp_models.kernels import PROFILES
from pyrogp_models.likelihoods import LIKELIHOODS
from pyrogp_models.linalg import triangular_solve
from pyrogp_models.module import Module

#: Relative tolerance when comparing the standardisations of modules.
STANDARDISATION_RTOL = 1e-9
#: A site precision counts as indefinite when a singular value of L_pk⁻¹L_k exceeds 1 + this.
SITE_TOLERANCE = 1e-8


@dataclass(frozen=True, eq=False)
class ModuleGroup:
    """The modules of a stack that share M_k, stacked along dim 0 (G modules)."""

    names: tuple[str, ...]
    indices: torch.Tensor  # positions in the stack's module order, [G]
    inducing: torch.Tensor  # Z_k, [G, M_k, D]
    mean: torch.Tensor  # μ_k, [G, M_k]
    chol: torch.Tensor  # chol S_k, [G, M_k, M_k]
    prior_chol: torch.Tensor  # chol(K_kk^{(k)} + jitter_k), [G, M_k, M_k]

    @property
    def num_inducing(self) -> int:
        return self.inducing.shape[-2]


@dataclass(frozen=True, eq=False)
class ModuleStack:
    """Modules (float64 copies, in the given order) and their cached tensors grouped by M_k.

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
        converted = {name: module.to(dtype=dtype, device=device)
                     for name, module in modules.items()}
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
                prior_chol=torch.stack([m.prior_cholesky()[0] for m in group])))
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


def check_compatible(modules: Mapping[str, Module], shared_output: bool = True) -> None:
    """Raise :class:`IncompatibleModulesError`, naming the modules, unless every module has one
    latent function, a known kernel family and likelihood, the same input dimension and the same
    input standardisation (and, with ``shared_output``, the same output standardisation among
    modules whose likelihood standardises its targets)."""
    if not modules:
        raise IncompatibleModulesError("no modules to combine")
    names = list(modules)

    def differ(what: str, key) -> None:
        values = [key(modules[name]) for name in names]
        reference = values[0]
        odd = [name for name, value in zip(names, values, strict=True)
               if not _same(value, reference)]
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
            reference = modules[standardised[0]].standardisation
            odd = [name for name in standardised
                   if not _same(np.array([modules[name].standardisation.y_mean,
                                          modules[name].standardisation.y_scale]),
                                np.array([reference.y_mean, reference.y_scale]))]
            if odd:
                raise IncompatibleModulesError(
                    f"modules {_listing(odd)} standardise their targets differently from module "
                    f"'{standardised[0]}', so their latent functions are in different units")


def _same(value, reference) -> bool:
    return bool(np.allclose(value, reference, rtol=STANDARDISATION_RTOL, atol=0.0))


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
