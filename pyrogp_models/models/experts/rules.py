"""Product-of-experts combination rules in f-space (Cohen et al., ICML 2020, §2.2–§4).

Inputs are the experts' latent predictions ``mean``, ``var`` of shape ``[J, N]`` or ``[J, N, C]``
(expert axis first); every rule returns the combined ``(mean, var)`` of shape ``[N]`` / ``[N, C]``.
All rules are written in precision form relative to the prior so they stay finite:

* PoE / gPoE (eq. 3):  σ⁻² = Σ β_j σ_j⁻²,                 m = σ² Σ β_j σ_j⁻² m_j.
* BCM / rBCM (eq. 4):  σ⁻² = σ*⁻² + Σ β_j (σ_j⁻² − σ*⁻²),
  m = σ² [Σ β_j σ_j⁻² m_j + (1 − Σβ_j) σ*⁻² μ0] = μ0 + σ² Σ β_j σ_j⁻² (m_j − μ0).
* grBCM (eq. 5): the rBCM with the communication expert N(μ_c, σ_c²) in the prior's place.

The prior variance σ*² = k(x*, x*) is the latent one (no noise) and is given per point. The
likelihood is applied after combining (§2.2, eq. 6); :func:`combine_in_y_space` is the
alternative of Liu et al. (2018) and others, kept for comparison (§6): it combines the experts'
noisy y-predictives against the noisy prior.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .barycenter import barycenter_paper, barycenter_w2
from .weights import _align, _min_var, expert_weights, grbcm_liu, normalise_weights

__all__ = ["poe", "gpoe", "bcm", "rbcm", "grbcm", "combine", "combine_in_y_space", "RULES",
           "PRESETS"]

#: Rule names accepted by :func:`combine`.
RULES = ("poe", "gpoe", "bcm", "rbcm", "grbcm", "barycenter", "barycenter-paper")

#: The paper's named models (Tables 1–2) as ``combine`` keyword sets; add ``temperature=T``.
PRESETS = {
    "PoE": {"rule": "poe"},
    "BCM": {"rule": "bcm"},
    "gPoE_unif": {"rule": "gpoe", "weights": "uniform"},
    "gPoE_var": {"rule": "gpoe", "weights": "softmax-var"},
    "rBCM_entr": {"rule": "rbcm", "weights": "entropy", "normalise": False},
    "rBCM_var_u": {"rule": "rbcm", "weights": "softmax-var", "normalise": False},
    "BAR_var": {"rule": "barycenter-paper", "weights": "softmax-var"},
    "BAR_var_w2": {"rule": "barycenter", "weights": "softmax-var"},
    "grBCM": {"rule": "grbcm"},
}


def _check_experts(mean: Tensor, var: Tensor) -> tuple[Tensor, Tensor]:
    if not isinstance(mean, Tensor) or not isinstance(var, Tensor):
        raise TypeError("mean and var must be torch tensors")
    if mean.shape != var.shape:
        raise ValueError(f"mean {tuple(mean.shape)} and var {tuple(var.shape)} differ in shape")
    if mean.dim() < 2 or mean.shape[0] < 1:
        raise ValueError(f"expected [J, N] or [J, N, C] expert tensors, got {tuple(mean.shape)}")
    if not mean.is_floating_point():
        raise TypeError("mean and var must be floating-point tensors")
    return mean, var.clamp_min(_min_var(var.dtype))


def _check_weights(weights, mean: Tensor) -> Tensor:
    beta = _align(weights, mean, "weights").expand_as(mean)
    if (beta < 0).any():
        raise ValueError("expert weights must be non-negative")
    return beta


def poe(mean: Tensor, var: Tensor) -> tuple[Tensor, Tensor]:
    """Product of experts, eq. (3) with β ≡ 1: σ⁻² = Σ σ_j⁻², m = σ² Σ σ_j⁻² m_j."""
    mean, var = _check_experts(mean, var)
    return gpoe(mean, var, torch.ones_like(mean))


def gpoe(mean: Tensor, var: Tensor, weights) -> tuple[Tensor, Tensor]:
    """Generalised PoE, eq. (3): σ⁻² = Σ β_j σ_j⁻², m = Σ_j (β_j σ_j⁻² / σ⁻²) m_j.

    The weights are used as given (pass normalised weights for the prior fallback, Σβ = 1).
    The mean is a convex combination of the m_j for any β ≥ 0.
    """
    mean, var = _check_experts(mean, var)
    beta = _check_weights(weights, mean)
    a = beta / var
    precision = a.sum(0)
    if (precision <= 0).any():
        raise ValueError("gPoE weights sum to zero at some test point (precision 0)")
    out_var = 1.0 / precision
    return (a * mean).sum(0) * out_var, out_var


def rbcm(
    mean: Tensor, var: Tensor, weights, *, prior_var, prior_mean=0.0, clamp: bool = True
) -> tuple[Tensor, Tensor]:
    """Robust BCM, eq. (4): σ⁻² = σ*⁻² + Σ β_j(σ_j⁻² − σ*⁻²), m = μ0 + σ² Σ β_j σ_j⁻² (m_j − μ0).

    Computed as σ² = σ*² / (1 + Σ β_j r_j) with r_j = σ*²/σ_j² − 1. With ``clamp=True`` the expert
    variances are clipped to ≤ σ*² (exact GPs satisfy this; jitter, SVGP experts and y-space
    mismatches may not), which keeps every r_j ≥ 0 and the precision ≥ σ*⁻². A non-zero prior
    mean μ0 enters through the (1 − Σβ) σ*⁻² μ0 term (eq. 4 divides by p(f*)^{Σβ−1}; the paper
    takes μ0 = 0).
    """
    mean, var = _check_experts(mean, var)
    beta = _check_weights(weights, mean)
    prior_var = _align(prior_var, mean, "prior_var", point=True)
    prior_mean = _align(prior_mean, mean, "prior_mean", point=True)
    if (prior_var <= 0).any():
        raise ValueError("prior_var must be positive")
    return _prior_corrected(mean, var, beta, prior_mean, prior_var, clamp, "rBCM")


def _prior_corrected(mean, var, beta, ref_mean, ref_var, clamp, name):
    """Eq. (4)/(5) against a reference N(ref_mean, ref_var): the prior, or grBCM's expert c."""
    if clamp:
        var = torch.minimum(var, ref_var)
    excess = (ref_var - var) / var  # r_j = σ*² σ_j⁻² − 1, accurate when σ_j² ≈ σ*²
    scaled_precision = 1.0 + (beta * excess).sum(0)  # σ*² σ⁻²
    if (scaled_precision <= 0).any():
        raise ValueError(f"{name} precision is not positive at some test point; use clamp=True")
    out_var = ref_var / scaled_precision
    shift = (beta * (1.0 + excess) * (mean - ref_mean)).sum(0) / scaled_precision
    return ref_mean + shift, out_var


def bcm(mean: Tensor, var: Tensor, *, prior_var, prior_mean=0.0, clamp: bool = True):
    """Bayesian committee machine (Tresp 2000), eq. (4) with β ≡ 1: σ⁻² = Σσ_j⁻² + (1−J)σ*⁻²."""
    return rbcm(
        mean, var, torch.ones_like(mean), prior_var=prior_var, prior_mean=prior_mean, clamp=clamp
    )


def grbcm(
    mean: Tensor, var: Tensor, communication, weights=None, *, clamp: bool = True
) -> tuple[Tensor, Tensor]:
    """Generalised rBCM (Liu et al. 2018), eq. (5), in whichever space the inputs live.

    ``mean``, ``var``: the J augmented experts +j, each trained on D_c ∪ D_j (the communication
    expert itself is *not* among them). ``communication = (μ_c, σ_c²)``, each ``[N]``/``[N, C]``.
    σ⁻² = σ_c⁻² + Σ β_j (σ_{+j}⁻² − σ_c⁻²),  m = σ² [Σ β_j σ_{+j}⁻² m_{+j} − (Σβ − 1) σ_c⁻² μ_c].
    ``weights=None`` uses Liu's: β = 1 for the first augmented expert, ½ log(σ_c²/σ_{+j}²) after.
    """
    mean, var = _check_experts(mean, var)
    if not isinstance(communication, tuple | list) or len(communication) != 2:
        raise ValueError("communication must be a (mean, var) pair for the communication expert")
    c_mean = _align(communication[0], mean, "communication mean", point=True)
    c_var = _align(communication[1], mean, "communication var", point=True)
    c_var = c_var.clamp_min(_min_var(mean.dtype))
    beta = grbcm_liu(var, c_var) if weights is None else _check_weights(weights, mean)
    return _prior_corrected(mean, var, beta, c_mean, c_var, clamp, "grBCM")


def combine(
    rule: str,
    mean: Tensor,
    var: Tensor,
    *,
    prior_var=None,
    prior_mean=0.0,
    weights=None,
    temperature=None,
    normalise: bool | None = None,
    communication=None,
    clamp: bool = True,
) -> tuple[Tensor, Tensor]:
    """Combine expert predictions ``[J, N(, C)]`` with a named rule; returns ``(mean, var)``.

    rule: ``"poe"``, ``"gpoe"``, ``"bcm"``, ``"rbcm"``, ``"grbcm"``, ``"barycenter"`` (exact 1-D
    W2 barycenter, σ = Σβσ_j) or ``"barycenter-paper"`` (eq. 12, σ² = Σβσ_j²; the paper's BAR).
    weights: ``None`` (the rule's own: uniform 1/J for gpoe/barycenters, differential entropy for
    rbcm, Liu's for grbcm), ``"uniform"``, ``"entropy"``, ``"softmax-var"``, ``"softmax-entropy"``,
    ``"softmax-w2"`` or a tensor ``[J(, N(, C))]``. poe and bcm take no weights (β ≡ 1).
    normalise: ``None`` keeps each weighting's convention (see ``expert_weights``); barycenters
    always normalise. prior_var: latent k(x*,x*) per point, needed by bcm/rbcm and the
    entropy/W2 weightings. communication: ``(μ_c, σ_c²)`` for grbcm.
    """
    if not isinstance(rule, str) or rule.lower() not in RULES:
        raise ValueError(f"unknown combination rule {rule!r}; expected one of {RULES}")
    rule = rule.lower()
    mean, var = _check_experts(mean, var)
    if rule in ("poe", "bcm"):
        if weights is not None:
            raise ValueError(f"rule {rule!r} has fixed weights β ≡ 1; use 'gpoe' or 'rbcm'")
        if rule == "poe":
            return poe(mean, var)
        if prior_var is None:
            raise ValueError("rule 'bcm' needs prior_var")
        return bcm(mean, var, prior_var=prior_var, prior_mean=prior_mean, clamp=clamp)
    if rule == "grbcm":
        if communication is None:
            raise ValueError("rule 'grbcm' needs communication=(mean_c, var_c)")
        if weights is None or (isinstance(weights, str) and weights == "entropy"):
            if normalise:
                raise ValueError("Liu's grBCM weights are unnormalised; pass explicit weights")
            beta = None
        else:
            c_var = communication[1]
            beta = expert_weights(
                weights,
                mean,
                var,
                prior_var=c_var,
                prior_mean=communication[0],
                temperature=temperature,
                normalise=normalise,
            )
        return grbcm(mean, var, tuple(communication), beta, clamp=clamp)
    if rule == "rbcm" and prior_var is None:
        raise ValueError("rule 'rbcm' needs prior_var")
    if weights is None:
        weights = "entropy" if rule == "rbcm" else "uniform"
    if rule.startswith("barycenter") and normalise is False:
        raise ValueError("a barycenter needs weights on the simplex; normalise=False is invalid")
    beta = expert_weights(
        weights,
        mean,
        var,
        prior_var=prior_var,
        prior_mean=prior_mean,
        temperature=temperature,
        normalise=normalise,
    )
    if rule == "gpoe":
        return gpoe(mean, var, beta)
    if rule == "rbcm":
        return rbcm(mean, var, beta, prior_var=prior_var, prior_mean=prior_mean, clamp=clamp)
    beta = normalise_weights(beta)
    if rule == "barycenter":
        return barycenter_w2(mean, var, beta)
    return barycenter_paper(mean, var, beta)


def combine_in_y_space(
    rule: str,
    mean: Tensor,
    var: Tensor,
    *,
    noise_var,
    prior_var=None,
    communication=None,
    **kwargs,
) -> tuple[Tensor, Tensor]:
    """Combine the experts' y-predictives N(m_j, σ_j² + σ_y²) against the prior σ*² + σ_y².

    Returns the y-predictive (mean, var) directly (do not add the noise again). Weights are
    computed from the noisy variances too, as in the y-space aggregations that §6 compares
    against (Liu et al. 2018). Keyword arguments are passed to :func:`combine`.
    """
    noise = torch.as_tensor(noise_var, dtype=var.dtype, device=var.device)
    if prior_var is not None:
        prior_var = torch.as_tensor(prior_var, dtype=var.dtype, device=var.device) + noise
    if communication is not None:
        communication = (communication[0], communication[1] + noise)
    return combine(
        rule, mean, var + noise, prior_var=prior_var, communication=communication, **kwargs
    )
