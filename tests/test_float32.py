"""float32 everywhere it is offered: every model trains in float32 without a non-finite loss on
the data of its tests, and predicts within float32 accuracy of the same fit in float64.

Fits by L-BFGS (the collapsed local and meta-GP bounds, exact experts) run with their defaults to
their optimum, which the float32 fit reaches to its own dtype's tolerance; fits by Adam run the
same 100 steps in both dtypes, so that only rounding separates them. Prediction differences are
measured against the float64 predictive: the mean in predictive standard deviations, the
variance relative to itself.
"""

import warnings
from dataclasses import replace

import numpy as np
import pytest
import torch

from model_zoo import CASES, X_NEW

#: float32 rounding (ε = 1.2e-7) amplified by an optimisation path — or two, for a meta-GP of
#: local fits made in the same dtype: a hundredth of a standard deviation for the mean and of
#: the variance (measured: at most 2e-3 and 5e-3, for the multi-output meta-GP).
MEAN_TOLERANCE, VARIANCE_TOLERANCE = 1e-2, 1e-2
#: Where the two fits take different paths (``Case.paths_differ``: Monte Carlo draws from torch's
#: generator, whose float32 and float64 streams differ; Adam from a stationary start), they are
#: different realisations, compared at that accuracy (measured: 0.13 standard deviations and 3 %
#: of the variance for the deep multitask GPs; 0.03 and 2 % for the distributed kernel by Adam).
DIFFERENT_PATHS_TOLERANCE = 0.5, 0.2
ADAM_STEPS = 100


def adjust(config):
    if config.optimizer == "lbfgs":
        return config
    return replace(config, steps=ADAM_STEPS, tol=None)


@pytest.mark.filterwarnings("ignore::pyrogp_models.errors.NotConvergedWarning")
@pytest.mark.parametrize("name", list(CASES))
def test_float32_trains_and_predicts_like_float64(name):
    fits = {dtype: CASES[name].fit(dtype, adjust) for dtype in (torch.float64, torch.float32)}
    losses = np.asarray(fits[torch.float32].result.losses)
    assert len(losses) and np.isfinite(losses).all()
    assert next(p for p in fits[torch.float32].model.parameters()).dtype == torch.float32
    (mean64, var64), (mean32, var32) = (
        tuple(np.asarray(value, dtype=np.float64) for value in fits[dtype].predict(X_NEW))
        for dtype in (torch.float64, torch.float32))
    assert np.isfinite(mean32).all() and np.isfinite(var32).all()
    mean_error = np.max(np.abs(mean32 - mean64) / np.sqrt(var64))
    variance_error = np.max(np.abs(var32 / var64 - 1))
    mean_tolerance, variance_tolerance = (DIFFERENT_PATHS_TOLERANCE if CASES[name].paths_differ
                                          else (MEAN_TOLERANCE, VARIANCE_TOLERANCE))
    assert mean_error < mean_tolerance and variance_error < variance_tolerance, (
        f"float32 predictions {mean_error:.2g} sd and {variance_error:.2g} (variance) away")


def test_a_float32_composite_fit_keeps_no_bound_above_its_ceiling():
    """A trend and a yearly cycle in 3 partitions, ``rbf + periodic(period=1) * rbf``, every
    default: in float32 one path of partition 0 runs its product's variances off to 10¹² over a
    noise of 10⁻², where the bound's large terms cancel to rounding error (it read 1.9e10, far
    above −½N log 2πσ², the most any fit reaches). The fit kept must be a fit: every module's
    ELBO within 0.5 nats of the float64 fit's, and every module converged without a warning (in
    float64 a held path's partition made accepted steps that changed nothing, unpinned, to the
    step limit)."""
    from pyrogp_models.inference.local_fit import LocalFitSpec, default_config, fit_local

    from pyrogp_models.data.partitioners import partition_contiguous
    from pyrogp_models.errors import NotConvergedWarning, RoundingWarning

    rng = np.random.default_rng(0)
    x = np.sort(rng.uniform(0.0, 6.0, 300))
    y = 0.4 * x + np.sin(2 * np.pi * x) + 0.1 * rng.standard_normal(300)
    data = (x[:, None], y, partition_contiguous(x[:, None], 3))
    elbos = {}
    for dtype in (torch.float64, torch.float32):
        spec = LocalFitSpec(kernel="rbf + periodic(period=1) * rbf", dtype=dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("error", NotConvergedWarning)
            warnings.simplefilter("error", RoundingWarning)
            fit = fit_local(data, spec, default_config(spec))
        assert all(module.info["converged"] for module in fit.modules.values())
        elbos[dtype] = np.array([module.elbo for module in fit.modules.values()])
    np.testing.assert_allclose(elbos[torch.float32], elbos[torch.float64], atol=0.5)
