"""Recycling a dictionary of modules into a meta-GP: initialise, guard, train, export.

:func:`recycle` is what the ``pyrogp recycle`` command calls::

    modules = load_modules(path)
    fit = recycle(modules, RecycleSpec(num_inducing=35), TrainConfig(...))
    save_module(fit.module, out)       # fit.model is the trained MetaGP

The exported module keeps the data columns (feature and target names, units) the modules share.

Initialisation: Z_* are k-means centres of all modules' inducing inputs (and of the raw inputs),
or a grid over their span; ψ_* starts at the median of the modules' hyperparameters and, where a
lengthscale is longer than the spread of the modules' inducing inputs, also at that spread
(:func:`global_kernel_starts`); the meta-GP is fitted from each start and the higher bound kept
(:func:`~pyrogp_models.inference.restarts.best_fit`). q(v) starts at the collapsed optimum (when
the bound is bounded).
:func:`recycle_multioutput` does the same for the LMC meta-GP.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch
from pyrogp_models.inference.fit_result import Fit
from pyrogp_models.inference.restarts import best_fit
from pyrogp_models.inference.train_config import COLLAPSED_CONFIG, UNCOLLAPSED_CONFIG, TrainConfig
from pyrogp_models.inference.trainer import TrainResult, parameter_scope, train

from pyrogp_models.data import Standardisation, require_finite
from pyrogp_models.data.columns import Columns
from pyrogp_models.data.inducing import default_num_inducing, init_inducing
from pyrogp_models.errors import DataError
from pyrogp_models.gaussian.linalg import DEFAULT_JITTER
from pyrogp_models.kernels import Kernel, Leaf, Role, Stationary, kernel_text, resolve_kernel
from pyrogp_models.likelihoods import LIKELIHOODS, make_likelihood
from pyrogp_models.models.local.initialisation import input_spread
from pyrogp_models.models.meta.meta_gp import MetaGP, choose_likelihood, common_likelihood
from pyrogp_models.models.meta.multioutput import MultiOutputMetaGP
from pyrogp_models.modules.predictor import Predictor
from pyrogp_models.modules.record import Module
from pyrogp_models.modules.stack import ModuleStack, clip_site_precisions
from pyrogp_models.modules.units import kernel_in_model_units


@dataclass
class RawData:
    """New raw data in data units, fitted together with the modules (combined bound, eq. 19).

    ``likelihood=None`` takes the modules' common likelihood
    (:class:`~pyrogp_models.errors.MixedLikelihoodsError` if they differ);
    ``likelihood_options=None`` the options of the modules with that
    likelihood (none without such modules)."""

    X: np.ndarray | torch.Tensor
    y: np.ndarray | torch.Tensor
    likelihood: str | None = "gaussian"
    likelihood_options: dict | None = None


@dataclass
class RecycleSpec:
    """How to build the meta-GP.

    ``num_inducing``: M of the meta-GP (default: half the modules' inducing inputs and raw
    rows it summarises, at most 100 — a local fit's rule,
    :func:`~pyrogp_models.data.inducing.default_num_inducing`). ``collapsed``: learn ψ_*, Z_*
    on the collapsed bound L_E^* (q(v) at its optimum); the default ``None`` is the collapsed
    bound unless raw data with a non-Gaussian likelihood are fitted too. ``kernel``: the global
    kernel, a name, expression or kernel object (:func:`initial_global_kernel`; default: the
    kernel structure most modules share); ``ard``: one lengthscale per dimension for a kernel
    given by name (default: if any module has ARD).
    ``inducing_init``: ``"kmeans"`` or ``"grid"``.
    ``on_unbounded``: ``"raise"`` or ``"warn"`` when the bound is unbounded above;
    ``repair_sites`` clips the modules' site precisions first. ``likelihood`` /
    ``likelihood_params``: the exported module's likelihood (see
    :func:`pyrogp_models.models.meta.meta_gp.choose_likelihood`).
    """

    num_inducing: int | None = None
    collapsed: bool | None = None
    kernel: str | torch.nn.Module | None = None
    ard: bool | None = None
    inducing_init: str = "kmeans"
    learn_inducing: bool = True
    learn_kernel: bool = True
    jitter: float = DEFAULT_JITTER
    on_unbounded: str = "raise"
    repair_sites: bool = False
    likelihood: str | None = None
    likelihood_params: dict | None = None
    name: str = "meta"
    dtype: torch.dtype = torch.float64
    device: str | torch.device = "cpu"


def uses_collapsed_bound(spec: RecycleSpec, raw_data: RawData | None = None,
                         modules: Mapping[str, Module] | None = None) -> bool:
    """As asked, else the collapsed bound unless non-Gaussian raw data are fitted too."""
    if spec.collapsed is not None:
        return spec.collapsed
    return raw_data is None or raw_likelihood(raw_data, modules) == "gaussian"


def raw_likelihood(raw_data: RawData, modules: Mapping[str, Module] | None) -> str:
    """The raw data's likelihood: as named, else the modules' common likelihood."""
    if raw_data.likelihood is not None:
        return raw_data.likelihood
    if not modules:
        raise ValueError("raw data without modules need their likelihood named")
    return common_likelihood(modules.values())


@dataclass
class Recycled(Fit):
    """The trained :class:`MetaGP` (``model``), its training record and its exported module
    (``predictor``, also ``module``): a module again, so it can be saved and recycled."""

    @property
    def module(self) -> Module:
        return self.predictor


def recycle(modules: Mapping[str, Module], spec: RecycleSpec | None = None,
            config: TrainConfig | None = None, raw_data: RawData | None = None) -> Recycled:
    """Fit a meta-GP to ``modules`` (and ``raw_data``) on the ensemble bound L_E of Recyclable GPs
    (eq. 6), or with raw data the combined bound (eq. 19).

    With ``spec.collapsed`` ψ_*, Z_* are learned on the collapsed bound L_E^*; otherwise q(v),
    ψ_*, Z_* (and the raw data's likelihood) are learned on L_E, starting from the collapsed
    optimum. The boundedness of the bound is checked before, during (every ``config.window``
    model evaluations) and after training.
    """
    spec = spec or RecycleSpec()
    collapsed = uses_collapsed_bound(spec, raw_data, modules)
    config = config or (COLLAPSED_CONFIG if collapsed else UNCOLLAPSED_CONFIG)
    with parameter_scope(config):  # nothing is left in Pyro's global parameter store
        stack = (ModuleStack.from_modules(modules, dtype=spec.dtype, device=spec.device)
                 if modules else None)
        repairs: dict[str, int] = {}
        if stack is not None and spec.repair_sites:
            stack, repairs = clip_site_precisions(stack)
        likelihood, raw_X, raw_y, standardisation = _raw_data_terms(stack, raw_data, spec)
        if raw_data is None:  # the likelihood to export is chosen (or refused) before training
            choose_likelihood(stack, None, spec.likelihood, None, spec.likelihood_params)
        points = torch.cat([*([stack.inducing_points] if stack is not None else []),
                            *([raw_X] if raw_X is not None else [])])
        num_inducing = global_inducing(spec, points)
        inducing = initial_inducing(points, num_inducing, spec.inducing_init, config.seed)
        kernel = initial_global_kernel(stack, spec, inducing.shape[-1], standardisation,
                                       likelihood is None or likelihood.standardise_targets)

        def fit_from(start: Kernel) -> tuple[MetaGP, TrainResult]:
            return _trained(MetaGP(
                stack, inducing, start, likelihood=copy.deepcopy(likelihood), raw_X=raw_X,
                raw_y=raw_y, collapsed=collapsed, learn_inducing=spec.learn_inducing,
                learn_kernel=spec.learn_kernel, jitter=spec.jitter,
                on_unbounded=spec.on_unbounded, check_every=config.window,
                standardisation=standardisation), config)

        meta, result = best_fit(global_kernel_starts(kernel, stack, spec), fit_from,
                                "the meta-GP's kernel")
        module = meta.to_module(spec.likelihood, None, spec.likelihood_params, spec.name)
    provenance = {"num_inducing": num_inducing, "collapsed": collapsed,
                  "site_repairs": repairs, "train_steps": result.steps,
                  "converged": result.converged,
                  "spec": {k: str(v) for k, v in asdict(spec).items()}}
    columns = stack.modules[stack.names[0]].columns if stack is not None else Columns()
    return Recycled(meta, result, replace(module, info={**module.info, "recycle": provenance},
                                          columns=columns), meta.standardisation)


def _raw_data_terms(stack: ModuleStack | None, raw_data: RawData | None, spec: RecycleSpec):
    """The raw data's likelihood (initialised from modules with the same likelihood), inputs and
    targets in model units, and the standardisation of the meta-GP."""
    if raw_data is None:
        if stack is None:
            raise ValueError("recycle needs modules, raw data or both")
        return None, None, None, stack.standardisation
    name = raw_likelihood(raw_data, stack.modules if stack is not None else None)
    if name not in LIKELIHOODS:
        raise ValueError(f"unknown likelihood '{name}'; choose from {sorted(LIKELIHOODS)}")
    X = np.asarray(raw_data.X, dtype=np.float64)
    y = np.asarray(raw_data.y, dtype=np.float64)
    require_finite(X, "raw inputs")
    require_finite(y, "raw targets")
    if X.ndim != 2 or len(X) != len(y) or (stack is not None and X.shape[1] != stack.input_dim):
        raise DataError(f"raw data of shapes {X.shape} and {y.shape} do not match modules with "
                        f"input dimension {stack.input_dim if stack is not None else '?'}")
    standardise_y = LIKELIHOODS[name].standardise_targets
    standardisation = (stack.standardisation if stack is not None
                       else Standardisation.fit(X, y, standardise_y=standardise_y))
    options, initial = raw_data.likelihood_options or {}, {}
    if stack is not None and any(m.likelihood_name == name for m in stack.modules.values()):
        _, options, initial, _ = choose_likelihood(stack, None, name,
                                                   raw_data.likelihood_options)
    likelihood = make_likelihood(name, (), spec.dtype, spec.device, **options, **initial)
    as_tensor = lambda a: torch.as_tensor(a, dtype=spec.dtype, device=spec.device)  # noqa: E731
    targets = standardisation.transform_y(y) if standardise_y else y
    return likelihood, as_tensor(standardisation.transform_x(X)), as_tensor(targets), \
        standardisation


def global_inducing(spec: RecycleSpec, points: torch.Tensor) -> int:
    """M of the meta-GP: ``spec.num_inducing``, or by default
    :func:`~pyrogp_models.data.inducing.default_num_inducing` of the P points [P, D] it
    summarises (the modules' inducing inputs and any raw inputs)."""
    if spec.num_inducing is not None:
        return spec.num_inducing
    return int(default_num_inducing(points.shape[0]))


def initial_inducing(points: torch.Tensor, num_inducing: int, method: str = "kmeans",
                     seed: int | None = 0) -> torch.Tensor:
    """Z_* [M, D] from the modules' inducing inputs (and raw inputs) ``points`` [P, D] by
    :func:`~pyrogp_models.data.inducing.init_inducing`: ``method`` — but a grid over their
    span when there are fewer distinct points than M (modules of one fit share many)."""
    if method == "kmeans" and torch.unique(points, dim=0).shape[0] < num_inducing:
        method = "grid"
    generator = torch.Generator(device=points.device).manual_seed(seed or 0)
    return init_inducing(points, num_inducing, method=method, generator=generator)


def initial_global_kernel(stack: ModuleStack | None, spec: RecycleSpec, input_dim: int,
                          standardisation, standardise_targets: bool) -> Kernel:
    """The meta-GP's kernel ψ_* (batch shape ()): ``spec.kernel`` — a name, expression or
    kernel whose given values are in data units; each value it does not give starts at the
    median of the modules' values for a leaf of the same kind (else its default) — or, without
    one, the kernel structure most modules share with the median of their values (an RBF of
    lengthscale and variance 1 without modules)."""
    ard = spec.ard if spec.ard is not None else stack is not None and any(
        getattr(leaf, "ard", False) for m in stack.modules.values() for _, leaf in m.kernel.parts())
    if spec.kernel is None:
        kernel = stack.most_common_kernel() if stack is not None else None
        if kernel is None:
            kernel = resolve_kernel("rbf", input_dim, ard)
    else:
        kernel = kernel_in_model_units(resolve_kernel(spec.kernel, input_dim, ard),
                                       standardisation, standardise_targets)
        if stack is not None:
            _fill_from_modules(kernel, stack)
    return kernel.to(dtype=spec.dtype, device=spec.device)


def global_kernel_starts(kernel: Kernel, stack: ModuleStack | None, spec: RecycleSpec
                         ) -> list[Kernel]:
    """The starts of the meta-GP's kernel: ``kernel`` (:func:`initial_global_kernel`) and, when
    kernels are learned, the same with its lengthscales capped at the spread of the modules'
    inducing inputs if any is longer (:func:`capped_lengthscales`)."""
    if stack is None or not spec.learn_kernel:
        return [kernel]
    spread = input_spread(stack.inducing_points)
    capped = capped_lengthscales(kernel, spread, keep_given=spec.kernel is not None)
    return [kernel] if capped is None else [kernel, capped]


def capped_lengthscales(kernel: Kernel, spread: torch.Tensor, keep_given: bool
                        ) -> Kernel | None:
    """``kernel`` with every lengthscale (not given by the user, with ``keep_given``) at most
    ``spread`` [D] (model units); None when none is longer. Modules of narrow partitions that see
    only noise end at lengthscales far beyond their span, and a meta-GP started from their median
    can settle constant over its inputs (``docs/limits.md``)."""
    capped, changed = copy.deepcopy(kernel), False
    for _, leaf in capped.parts():
        if not isinstance(leaf, Leaf):
            continue
        for h in leaf.hyperparameters:
            if h.role is not Role.INPUT_SCALE or (keep_given and h.name in leaf.given):
                continue
            value = getattr(leaf, h.name).detach()
            cap = _shaped(spread[list(leaf.active_dims)].to(value), leaf.value_shape(h))
            if bool((value > cap).any()):
                leaf.assign(h.name, torch.minimum(value, cap))
                changed = True
    return capped if changed else None


def _fill_from_modules(kernel: Kernel, stack: ModuleStack) -> None:
    """Set every value ``kernel`` does not give to the modules' median for its kind."""
    for _, leaf in kernel.parts():
        if not isinstance(leaf, Leaf):
            continue
        same = [part for module in stack.modules.values() for _, part in module.kernel.parts()
                if isinstance(part, Leaf) and part.kind == leaf.kind]
        for h in leaf.hyperparameters:
            if h.name in leaf.given or not same:
                continue
            shape = leaf.value_shape(h)
            values = torch.stack([_shaped(getattr(part, h.name)[0].detach(), shape)
                                  for part in same])
            leaf.assign(h.name, values.median(0).values)


def _shaped(value: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """``value`` as ``shape``: broadcast, or (per-dimension values of another width) its mean."""
    if value.numel() == 1 or value.shape == shape:
        return value.expand(shape)
    return value.mean(-1, keepdim=True).expand(shape)


def initial_mixing(stack: ModuleStack, inducing: torch.Tensor, num_latent: int,
                   seed: int | None = 0) -> torch.Tensor:
    """W [K, Q] from the modules' posterior means F [K, M] at the inducing inputs: with
    F = U diag(s) Vᵀ, W = U_Q diag(s_Q)/√M, so that the latents F ≈ W H have unit-scale rows
    like their unit-variance kernels; columns beyond the rank of F get small random weights."""
    standardisation = stack.standardisation
    X = (inducing * torch.as_tensor(standardisation.x_scale, dtype=inducing.dtype)
         + torch.as_tensor(standardisation.x_mean, dtype=inducing.dtype))
    means = torch.stack([module.predict_f(X)[0] for module in stack.modules.values()])
    U, singular, _ = torch.linalg.svd(means, full_matrices=False)
    rank = min(num_latent, len(singular))
    generator = torch.Generator(device=inducing.device).manual_seed(seed or 0)
    mixing = 1e-2 * torch.randn(stack.num_modules, num_latent, generator=generator,
                                dtype=inducing.dtype, device=inducing.device)
    mixing[:, :rank] += U[:, :rank] * singular[:rank] / inducing.shape[0] ** 0.5
    return mixing


def _trained(meta, config: TrainConfig) -> tuple[torch.nn.Module, TrainResult]:
    """A meta-GP from its start: q(v) at the collapsed optimum (when the bound is bounded), then
    trained; its boundedness checked again after training."""
    if meta.check_bounded() > 0:
        meta.set_optimal_posterior()
    result = _train_if_trainable(meta, config)
    meta.check_bounded()
    return meta, result


def _train_if_trainable(module, config: TrainConfig) -> TrainResult:
    """Train, or (nothing to learn) record the current loss."""
    if any(p.requires_grad for p in module.parameters()):
        return train(module, config=config)
    return TrainResult(losses=[-float(module.bound())], converged=True, steps=0)


# Multi-output --------------------------------------------------------------------------------
@dataclass
class RecycledMultiOutput:
    """The trained multi-output meta-GP (``model``) and its training record; ``predictor(name)``
    is the data-units predictor of the output of module ``name``."""

    model: MultiOutputMetaGP
    result: TrainResult

    def predictor(self, output: str) -> Predictor:
        """The meta-GP's predictor of one output (the name of its module), in data units."""
        return self.model.predictor(output)


def recycle_multioutput(modules: Mapping[str, Module], num_latent: int,
                        spec: RecycleSpec | None = None, config: TrainConfig | None = None
                        ) -> RecycledMultiOutput:
    """Fit the LMC meta-GP with ``num_latent`` latent functions and M inducing inputs each
    (:func:`global_inducing`), one output per module.

    Every latent starts with the k-means Z_* and the modules' median lengthscale (fitted also
    from that capped at the spread of their inducing inputs: :func:`global_kernel_starts`); the
    mixing weights start from the leading singular vectors of the modules' posterior means at
    Z_* (see :func:`initial_mixing`); q starts at the mean-field optimum.
    """
    spec = spec or RecycleSpec()
    config = config or UNCOLLAPSED_CONFIG
    with parameter_scope(config):  # nothing is left in Pyro's global parameter store
        stack = ModuleStack.from_modules(modules, "recycle-outputs", dtype=spec.dtype,
                                         device=spec.device)
        if spec.repair_sites:
            stack, _ = clip_site_precisions(stack)
        points = stack.inducing_points
        inducing = initial_inducing(points, global_inducing(spec, points), spec.inducing_init,
                                    config.seed)
        kernel = initial_global_kernel(stack, spec, inducing.shape[-1], stack.standardisation,
                                       True)
        if not isinstance(kernel, Stationary):
            raise ValueError("the multi-output meta-GP's latent functions take one stationary "
                             "kernel (rbf, matern12, matern32, matern52), not "
                             f"{kernel_text(kernel)}")
        mixing = initial_mixing(stack, inducing, num_latent, config.seed)

        def fit_from(start: Stationary) -> tuple[MultiOutputMetaGP, TrainResult]:
            return _trained(MultiOutputMetaGP(
                stack, inducing.expand(num_latent, -1, -1), start.family,
                start.lengthscale.detach().expand(num_latent, -1), mixing.clone(),
                learn_inducing=spec.learn_inducing, jitter=spec.jitter,
                on_unbounded=spec.on_unbounded, check_every=config.window), config)

        meta, result = best_fit(global_kernel_starts(kernel, stack, spec), fit_from,
                                "the meta-GP's kernel")
    return RecycledMultiOutput(meta, result)
