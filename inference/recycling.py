"""Recycling a dictionary of modules into a meta-GP: initialise, guard, train, export.

:func:`recycle` is what the ``pyrogp recycle`` command calls::

    modules = load_modules_from(path)
    fit = recycle(modules, RecycleSpec(num_inducing=35), TrainConfig(...))
    save_module(fit.module, out)       # fit.model is the trained MetaGP

Initialisation: Z_* are k-means centres of all modules' inducing inputs (and of the raw inputs),
or a grid over their span; ψ_* takes the median of the modules' hyperparameters; q(v) starts at
the collapsed optimum for these (when the bound is bounded). :func:`recycle_multioutput` does the
same for the LMC meta-GP.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import torch
from pyrogp_models.inference.fit_result import Fit
from pyrogp_models.inference.trainer import TrainConfig, TrainResult, parameter_scope, train

from pyrogp_models.data import Standardisation, require_finite
from pyrogp_models.data.inducing import grid_inducing
from pyrogp_models.data.kmeans import kmeans
from pyrogp_models.errors import DataError
from pyrogp_models.gaussian.linalg import DEFAULT_JITTER
from pyrogp_models.kernels import Stationary
from pyrogp_models.likelihoods import LIKELIHOODS, make_likelihood
from pyrogp_models.models.meta.meta_gp import MetaGP, choose_likelihood
from pyrogp_models.models.meta.multioutput import MultiOutputMetaGP
from pyrogp_models.modules.predictor import Predictor
from pyrogp_models.modules.record import Module
from pyrogp_models.modules.stack import ModuleStack, clip_site_precisions


@dataclass
class RawData:
    """New raw data in data units, fitted together with the modules (combined bound, eq. 19)."""

    X: np.ndarray | torch.Tensor
    y: np.ndarray | torch.Tensor
    likelihood: str = "gaussian"
    likelihood_options: dict = field(default_factory=dict)


@dataclass
class RecycleSpec:
    """How to build the meta-GP.

    ``num_inducing``: M of the meta-GP. ``collapsed``: learn ψ_*, Z_* on the collapsed bound
    L_E^* (q(v) at its optimum); the default ``None`` is the collapsed bound unless raw data with
    a non-Gaussian likelihood are fitted too. ``kernel``/``ard``: the global kernel
    family and ARD flag (default: the modules' most common family; ARD if any module is ARD).
    ``inducing_init``: ``"kmeans"`` or ``"grid"``.
    ``on_unbounded``: ``"raise"`` or ``"warn"`` when the bound is unbounded above;
    ``repair_sites`` clips the modules' site precisions first. ``likelihood`` /
    ``likelihood_params``: the exported module's likelihood (see
    :func:`pyrogp_models.models.meta.meta_gp.choose_likelihood`).
    """

    num_inducing: int = 35
    collapsed: bool | None = None
    kernel: str | None = None
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


#: The collapsed bound: L-BFGS with a backtracking line search that rejects non-finite trial
#: points (:mod:`pyrogp_models.inference.batched_lbfgs`), stopping when the bound changes by less
#: than 1e-6 (relative) over 10 iterations, as the local fits do.
COLLAPSED_CONFIG = TrainConfig(optimizer="lbfgs", lr=1.0, steps=500, window=10, tol=1e-6)
#: The uncollapsed bound: a unit natural-gradient step on q(v) (exact for modules and Gaussian
#: raw data, safeguarded otherwise) before each Adam step on the kernel and Z_*.
UNCOLLAPSED_CONFIG = TrainConfig(optimizer="adam", lr=0.05, steps=1000, window=50, tol=1e-6,
                                 natural_gradient_lr=1.0)


def uses_collapsed_bound(spec: RecycleSpec, raw_data: RawData | None = None) -> bool:
    """As asked, else the collapsed bound unless non-Gaussian raw data are fitted too."""
    if spec.collapsed is not None:
        return spec.collapsed
    return raw_data is None or raw_data.likelihood == "gaussian"


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
    num_inducing, collapsed = spec.num_inducing, uses_collapsed_bound(spec, raw_data)
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
        points = torch.cat([*(g.inducing.reshape(-1, g.inducing.shape[-1]) for g in
                              (stack.groups if stack is not None else ())),
                            *([raw_X] if raw_X is not None else [])])
        inducing = initial_inducing(points, num_inducing, spec.inducing_init, config.seed)
        family = spec.kernel or (stack.most_common_kernel() if stack is not None else "rbf")
        ard = spec.ard if spec.ard is not None else (
            stack is not None and any(m.ard for m in stack.modules.values()))
        lengthscale, variance = initial_hyperparameters(stack, inducing.shape[-1], ard)
        kernel = Stationary(family, inducing.shape[-1], (), ard, lengthscale, variance,
                            spec.dtype, spec.device)
        meta = MetaGP(stack, inducing, kernel, likelihood=likelihood, raw_X=raw_X, raw_y=raw_y,
                      collapsed=collapsed, learn_inducing=spec.learn_inducing,
                      learn_kernel=spec.learn_kernel, jitter=spec.jitter,
                      on_unbounded=spec.on_unbounded, check_every=config.window,
                      standardisation=standardisation)
        if meta.check_bounded() > 0:
            meta.set_optimal_posterior()
        result = _train_if_trainable(meta, config)
        meta.check_bounded()
        module = meta.to_module(spec.likelihood, None, spec.likelihood_params, spec.name)
    provenance = {"num_inducing": num_inducing, "collapsed": collapsed,
                  "site_repairs": repairs, "train_steps": result.steps,
                  "converged": result.converged,
                  "spec": {k: str(v) for k, v in asdict(spec).items()}}
    return Recycled(meta, result, replace(module, info={**module.info, "recycle": provenance}),
                    meta.standardisation)


def _raw_data_terms(stack: ModuleStack | None, raw_data: RawData | None, spec: RecycleSpec):
    """The raw data's likelihood (initialised from modules with the same likelihood), inputs and
    targets in model units, and the standardisation of the meta-GP."""
    if raw_data is None:
        if stack is None:
            raise ValueError("recycle needs modules, raw data or both")
        return None, None, None, stack.standardisation
    if raw_data.likelihood not in LIKELIHOODS:
        raise ValueError(f"unknown likelihood '{raw_data.likelihood}'; "
                         f"choose from {sorted(LIKELIHOODS)}")
    X = np.asarray(raw_data.X, dtype=np.float64)
    y = np.asarray(raw_data.y, dtype=np.float64)
    require_finite(X, "raw inputs")
    require_finite(y, "raw targets")
    if X.ndim != 2 or len(X) != len(y) or (stack is not None and X.shape[1] != stack.input_dim):
        raise DataError(f"raw data of shapes {X.shape} and {y.shape} do not match modules with "
                        f"input dimension {stack.input_dim if stack is not None else '?'}")
    standardise_y = LIKELIHOODS[raw_data.likelihood].standardise_targets
    standardisation = (stack.standardisation if stack is not None
                       else Standardisation.fit(X, y, standardise_y=standardise_y))
    initial = {}
    if stack is not None and any(m.likelihood_name == raw_data.likelihood
                                 for m in stack.modules.values()):
        initial = choose_likelihood(stack, None, raw_data.likelihood,
                                    raw_data.likelihood_options)[2]
    likelihood = make_likelihood(raw_data.likelihood, (), spec.dtype, spec.device,
                                 **raw_data.likelihood_options, **initial)
    as_tensor = lambda a: torch.as_tensor(a, dtype=spec.dtype, device=spec.device)  # noqa: E731
    targets = standardisation.transform_y(y) if standardise_y else y
    return likelihood, as_tensor(standardisation.transform_x(X)), as_tensor(targets), \
        standardisation


def initial_inducing(points: torch.Tensor, num_inducing: int, method: str = "kmeans",
                     seed: int | None = 0) -> torch.Tensor:
    """Z_* [M, D]: k-means centres of ``points`` [P, D] (a grid over their span when there are
    fewer distinct points than M, or with ``method="grid"``)."""
    if method not in ("kmeans", "grid"):
        raise ValueError(f"unknown inducing initialisation '{method}'; use 'kmeans' or 'grid'")
    distinct = torch.unique(points, dim=0).shape[0]
    if method == "kmeans" and distinct >= num_inducing:
        generator = torch.Generator(device=points.device).manual_seed(seed or 0)
        return kmeans(points, num_inducing, generator=generator)
    return grid_inducing(points, num_inducing)


def initial_hyperparameters(stack: ModuleStack | None, input_dim: int, ard: bool
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Median lengthscale ([D] with ARD, else [1]) and median variance over the modules (1.0 and
    1.0 without modules)."""
    if stack is None:
        return torch.ones(input_dim if ard else 1), torch.ones(())
    lengthscales = torch.stack([m.lengthscale[0].expand(input_dim)
                                for m in stack.modules.values()])
    variances = torch.stack([m.variance[0] for m in stack.modules.values()])
    lengthscale = lengthscales.median(0).values if ard else lengthscales.median().reshape(1)
    return lengthscale, variances.median()


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
    """Fit the LMC meta-GP with ``num_latent`` latent functions and ``spec.num_inducing``
    inducing inputs each, one output per module.

    Every latent starts with the k-means Z_* and the modules' median lengthscale; the mixing
    weights start from the leading singular vectors of the modules' posterior means at Z_* (see
    :func:`initial_mixing`); q starts at the mean-field optimum.
    """
    spec = spec or RecycleSpec()
    config = config or UNCOLLAPSED_CONFIG
    with parameter_scope(config):  # nothing is left in Pyro's global parameter store
        stack = ModuleStack.from_modules(modules, "recycle-outputs", dtype=spec.dtype,
                                         device=spec.device)
        if spec.repair_sites:
            stack, _ = clip_site_precisions(stack)
        points = torch.cat([g.inducing.reshape(-1, g.inducing.shape[-1]) for g in stack.groups])
        inducing = initial_inducing(points, spec.num_inducing, spec.inducing_init, config.seed)
        ard = spec.ard if spec.ard is not None else any(m.ard for m in stack.modules.values())
        lengthscale, _ = initial_hyperparameters(stack, inducing.shape[-1], ard)
        meta = MultiOutputMetaGP(stack, inducing.expand(num_latent, -1, -1), spec.kernel or
                                 stack.most_common_kernel(), lengthscale.expand(num_latent, -1),
                                 initial_mixing(stack, inducing, num_latent, config.seed),
                                 learn_inducing=spec.learn_inducing, jitter=spec.jitter,
                                 on_unbounded=spec.on_unbounded, check_every=config.window)
        if meta.check_bounded() > 0:
            meta.set_optimal_posterior()
        result = _train_if_trainable(meta, config)
        meta.check_bounded()
    return RecycledMultiOutput(meta, result)
