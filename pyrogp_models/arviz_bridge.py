"""Thin shim over ArviZ 0.x (``InferenceData``) and ArviZ ≥ 1 (xarray ``DataTree``).

Draws come from SVI guides or other single-chain samplers, so every sampled array has leading
axis ``draw`` and the converter prepends a chain axis of length one: (draw, ...) → (1, draw, ...).
Everything else in the package should go through these helpers rather than call ``arviz``
directly, so that only this file knows which ArviZ generation is installed. ArviZ (with xarray
and scipy.stats, about 2 s) is imported on first use, so that commands and scripts that never
build an ArviZ container start without it.
"""

from __future__ import annotations

import functools
import importlib.metadata
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

__all__ = [
    "ARVIZ_MAJOR",
    "LooResult",
    "group",
    "loo",
    "loo_pit",
    "summary",
    "to_inference_data",
]

ARVIZ_MAJOR: int = int(importlib.metadata.version("arviz").split(".", 1)[0])


@functools.cache
def _arviz():
    """The ``arviz`` module, imported once, on first use."""
    with warnings.catch_warnings():
        # ArviZ 0.x announces its 1.x refactor on import; this module is the answer to it.
        warnings.simplefilter("ignore", FutureWarning)
        import arviz
    return arviz


def _to_numpy(x) -> np.ndarray:
    """x as a numpy array; torch tensors are detached and copied to CPU first."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def _add_chain(name: str, variables: Mapping[str, object]) -> dict[str, np.ndarray]:
    """Turn every (draw, ...) array of group ``name`` into (1, draw, ...)."""
    out = {var: _to_numpy(value)[np.newaxis] for var, value in variables.items()}
    for var, value in out.items():
        if value.ndim < 2:
            raise ValueError(f"{name}[{var!r}] needs a leading draw axis, got a scalar")
    return out


def to_inference_data(
    *,
    posterior: Mapping[str, object],
    posterior_predictive: Mapping[str, object] | None = None,
    log_likelihood: Mapping[str, object] | None = None,
    observed_data: Mapping[str, object] | None = None,
    dims: Mapping[str, Sequence[str]] | None = None,
    coords: Mapping[str, Sequence] | None = None,
):
    """Build an ArviZ container from single-chain draws: x[draw, ...] → x[chain=1, draw, ...].

    ``posterior``, ``posterior_predictive`` and ``log_likelihood`` map names to arrays (numpy
    or torch) with a leading draw axis, which must have the same length everywhere;
    ``observed_data`` arrays have no sample axes. ``dims`` maps a variable name to the names
    of its non-sample axes (shared by every group holding that name) and ``coords`` maps a
    dimension name to its labels.

    Returns ``az.InferenceData`` on ArviZ 0.x and an ``xarray.DataTree`` on ArviZ ≥ 1.
    """
    sampled = {
        "posterior": posterior,
        "posterior_predictive": posterior_predictive,
        "log_likelihood": log_likelihood,
    }
    groups = {name: _add_chain(name, v) for name, v in sampled.items() if v is not None}
    n_draws = {f"{g}[{v!r}]": a.shape[1] for g, d in groups.items() for v, a in d.items()}
    if len(set(n_draws.values())) > 1:
        raise ValueError(f"all sampled arrays need the same number of draws, got {n_draws}")
    if observed_data is not None:
        groups["observed_data"] = {k: _to_numpy(v) for k, v in observed_data.items()}
    dims = None if dims is None else {k: list(v) for k, v in dims.items()}
    if ARVIZ_MAJOR >= 1:  # pragma: no cover - ArviZ ≥ 1 needs Python ≥ 3.12
        return _arviz().from_dict(groups, dims=dims, coords=coords)
    return _arviz().from_dict(**groups, dims=dims, coords=coords)


def group(idata, name: str):
    """The ``xarray.Dataset`` of group ``name`` (e.g. ``"posterior"``); KeyError if absent."""
    import xarray

    node = idata[name]
    return node.to_dataset() if isinstance(node, xarray.DataTree) else node


@dataclass(frozen=True)
class LooResult:
    """PSIS-LOO estimate, the same on every ArviZ version.

    elpd_loo = Σ_i log p(y_i | y_−i) (PSIS estimate), se its standard error, p_loo = lppd −
    elpd_loo the effective number of parameters, loo_i the pointwise terms, pareto_k the
    per-point Pareto shape diagnostics, warning ArviZ's high-k flag, and raw the object ArviZ
    returned (for ``az.compare`` and plotting).
    """

    elpd_loo: float
    se: float
    p_loo: float
    loo_i: np.ndarray
    pareto_k: np.ndarray
    warning: bool
    raw: object = field(repr=False, compare=False)


def loo(idata, var_name: str | None = None) -> LooResult:
    """PSIS-LOO-CV: elpd_loo = Σ_i log Σ_s w̃_is p(y_i | θ_s) with Pareto-smoothed weights w̃.

    Wraps ``az.loo(idata, pointwise=True)``; ``var_name`` picks the log-likelihood variable
    when there are several.
    """
    raw = _arviz().loo(idata, pointwise=True, var_name=var_name)
    if ARVIZ_MAJOR >= 1:  # pragma: no cover - ArviZ ≥ 1 needs Python ≥ 3.12
        elpd, se, p, loo_i = raw.elpd, raw.se, raw.p, raw.elpd_i
        pareto_k, warning = raw.pareto_k, raw.warning
    else:
        elpd, se, p, loo_i = raw["elpd_loo"], raw["se"], raw["p_loo"], raw["loo_i"]
        pareto_k, warning = raw["pareto_k"], raw["warning"]
    return LooResult(
        elpd_loo=float(elpd),
        se=float(se),
        p_loo=float(p),
        loo_i=np.asarray(loo_i),
        pareto_k=np.asarray(pareto_k),
        warning=bool(warning),
        raw=raw,
    )


def loo_pit(idata, y_name: str) -> np.ndarray:
    """LOO-PIT values PIT_i = Σ_s w̃_is 1[ỹ_is ≤ y_i], shaped like ``observed_data[y_name]``.

    ``y_name`` must name the variable in observed_data, posterior_predictive and
    log_likelihood alike.
    """
    if ARVIZ_MAJOR >= 1:  # pragma: no cover - ArviZ ≥ 1 needs Python ≥ 3.12
        return np.asarray(_arviz().loo_pit(idata, var_names=[y_name])[y_name])
    return np.asarray(_arviz().loo_pit(idata, y=y_name))


def summary(idata, var_names: Sequence[str] | None = None, round_to: int | str = "none"):
    """``az.summary`` table (pandas DataFrame: mean, sd, interval, ESS, R̂, MCSE per variable).

    Unlike ArviZ's default the numbers are not rounded unless ``round_to`` is an int. With a
    single chain R̂ is not meaningful.
    """
    names = None if var_names is None else list(var_names)
    return _arviz().summary(idata, var_names=names, round_to=round_to)
