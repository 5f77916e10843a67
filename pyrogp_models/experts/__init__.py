"""Product-of-experts combination of GP expert predictions (Cohen et al., ICML 2020).

Expert predictions are latent ``mean``/``var`` tensors ``[J, N]`` or ``[J, N, C]`` (expert axis
first). ``combine(rule, mean, var, ...)`` returns the combined latent ``(mean, var)``; apply the
likelihood afterwards with the functions in :mod:`.predictive`.
"""

from .barycenter import (
    barycenter_full,
    barycenter_paper,
    barycenter_w2,
    fixed_point_residual,
    sqrtm_psd,
    w2_squared,
    w2_squared_1d,
)
from .predictive import (
    bernoulli_logit,
    bernoulli_probit,
    categorical_log_prob,
    combine_in_y_space,
    gauss_hermite,
    gaussian_log_density,
    gaussian_predictive,
    multiclass_robustmax,
    multiclass_softmax_mc,
)
from .rules import PRESETS, RULES, bcm, combine, gpoe, grbcm, poe, rbcm
from .weights import (
    WEIGHTINGS,
    differential_entropy,
    expert_weights,
    grbcm_liu,
    normalise_weights,
    softmax_entropy,
    softmax_variance,
    softmax_w2,
    tempered_softmax,
    uniform,
)

__all__ = [
    "PRESETS",
    "RULES",
    "WEIGHTINGS",
    "barycenter_full",
    "barycenter_paper",
    "barycenter_w2",
    "bcm",
    "bernoulli_logit",
    "bernoulli_probit",
    "categorical_log_prob",
    "combine",
    "combine_in_y_space",
    "differential_entropy",
    "expert_weights",
    "fixed_point_residual",
    "gauss_hermite",
    "gaussian_log_density",
    "gaussian_predictive",
    "gpoe",
    "grbcm",
    "grbcm_liu",
    "multiclass_robustmax",
    "multiclass_softmax_mc",
    "normalise_weights",
    "poe",
    "rbcm",
    "softmax_entropy",
    "softmax_variance",
    "softmax_w2",
    "sqrtm_psd",
    "tempered_softmax",
    "uniform",
    "w2_squared",
    "w2_squared_1d",
]
