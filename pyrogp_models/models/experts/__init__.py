"""Product-of-experts combination of GP expert predictions (Cohen et al., ICML 2020).

Expert predictions are latent ``mean``/``var`` tensors ``[J, N]`` or ``[J, N, C]`` (expert axis
first). ``combine(rule, mean, var, ...)`` returns the combined latent ``(mean, var)``.

* :mod:`.exact` — exact GP experts with shared hyperparameters (eq. 2), exported as modules
  (fitted by ``pyrogp_models.inference.experts_fit``);
* :mod:`.module_experts` — batched latent predictions of any dictionary of modules;
* :mod:`.predictor` — :class:`ExpertCombination`, modules + rule + likelihood as a predictor
  (the likelihood is the experts' own, from :mod:`pyrogp_models.likelihoods`).
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
from .exact import ExactExperts, grbcm_rows
from .module_experts import ModuleExperts
from .predictor import SPACES, ExpertCombination
from .rules import PRESETS, RULES, bcm, combine, combine_in_y_space, gpoe, grbcm, poe, rbcm
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
    "ExactExperts",
    "ExpertCombination",
    "ModuleExperts",
    "PRESETS",
    "RULES",
    "SPACES",
    "WEIGHTINGS",
    "barycenter_full",
    "barycenter_paper",
    "barycenter_w2",
    "bcm",
    "combine",
    "combine_in_y_space",
    "differential_entropy",
    "expert_weights",
    "fixed_point_residual",
    "gpoe",
    "grbcm",
    "grbcm_rows",
    "grbcm_liu",
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
