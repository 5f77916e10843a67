"""Expert weightings β for product-of-experts rules (Cohen et al., ICML 2020, §2.2 and §4).

Every function takes per-expert tensors with the expert axis first, ``[J, N]`` or ``[J, N, C]``,
and returns weights of the same shape. Per-point quantities (``prior_var``, ``prior_mean``) may be
scalars, ``[N]`` or ``[N, C]``; they are aligned from the left, so a ``[N]`` prior variance is
shared by all C latent functions.

Sign conventions (eqs. 13 and 15 disagree on the sign of ψ):

* :func:`differential_entropy` is the *entropy reduction* ½(log σ*² − log σ_j²) of Cao & Fleet
  (2014) and Deisenroth & Ng (2015): ≥ 0 for an expert more confident than the prior, 0 at the
  prior. It is clamped at 0 (an expert less confident than the prior gets no weight).
* The tempered softmax of eq. (13) is β_j ∝ exp(−T ψ_j): a *small* ψ means a *confident* expert.
  With ψ = σ_j² (eq. 14) this is right as written. Eq. (15) plugs the entropy reduction in as ψ,
  which would up-weight the *least* confident experts; :func:`softmax_entropy` therefore uses
  ψ_j = −½(log σ*² − log σ_j²), i.e. β_j ∝ (σ*²/σ_j²)^{T/2}, and :func:`softmax_w2` uses
  ψ_j = −W2²(expert j, prior).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "uniform",
    "differential_entropy",
    "tempered_softmax",
    "softmax_variance",
    "softmax_entropy",
    "softmax_w2",
    "grbcm_liu",
    "normalise_weights",
    "expert_weights",
    "WEIGHTINGS",
]

#: Names accepted by :func:`expert_weights` (and by ``combine(weights=...)``).
WEIGHTINGS = ("uniform", "entropy", "softmax-var", "softmax-entropy", "softmax-w2")


def _min_var(dtype: torch.dtype) -> float:
    """Smallest variance we divide by: sqrt(tiny), so J precisions still sum without overflow."""
    return math.sqrt(torch.finfo(dtype).tiny)


def _align(x, like: Tensor, name: str, point: bool = False) -> Tensor:
    """Cast ``x`` to ``like``'s dtype/device and align its axes from the left.

    With ``point=True`` the target shape is ``like.shape[1:]`` (one value per test point), else the
    full ``[J, N(, C)]`` shape. Missing trailing axes become singletons, so broadcasting works.
    """
    t = torch.as_tensor(x, dtype=like.dtype, device=like.device)
    target = tuple(like.shape[1:] if point else like.shape)
    if t.dim() > len(target):
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected at most {target}")
    t = t.reshape(tuple(t.shape) + (1,) * (len(target) - t.dim()))
    try:
        ok = torch.broadcast_shapes(t.shape, target) == torch.Size(target)
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(f"{name} has shape {tuple(t.shape)}, which does not align with {target}")
    return t


def normalise_weights(weights: Tensor) -> Tensor:
    """β_j / Σ_k β_k over the expert axis (dim 0); where Σβ = 0 the weights become uniform 1/J.

    The uniform fallback matters for entropy weights far from the data, where every expert is at
    its prior and every weight is 0: any simplex weighting then returns the prior.
    """
    if (weights < 0).any():
        raise ValueError("expert weights must be non-negative")
    total = weights.sum(0, keepdim=True)
    safe = total.clamp_min(torch.finfo(weights.dtype).tiny)
    return torch.where(total > 0, weights / safe, torch.full_like(weights, 1.0 / weights.shape[0]))


def uniform(var: Tensor, *, normalise: bool = True) -> Tensor:
    """β_j = 1/J (gPoE_unif, §2.2) or, with ``normalise=False``, β_j = 1 (PoE/BCM)."""
    value = 1.0 / var.shape[0] if normalise else 1.0
    return torch.full_like(var, value)


def differential_entropy(var: Tensor, prior_var, *, normalise: bool = False) -> Tensor:
    """β_j = ½(log σ*² − log σ_j²), clamped ≥ 0 (rBCM_entr; Cao & Fleet 2014, eq. 15 as a weight).

    Unnormalised by default, as in the rBCM of Deisenroth & Ng (2015) and the paper's rBCM_entr.
    """
    prior_var = _align(prior_var, var, "prior_var", point=True)
    lo = _min_var(var.dtype)
    beta = 0.5 * (torch.log(prior_var.clamp_min(lo)) - torch.log(var.clamp_min(lo)))
    beta = beta.clamp_min(0.0)
    return normalise_weights(beta) if normalise else beta


def tempered_softmax(
    psi: Tensor, temperature, *, normalise: bool = True, log: bool = False
) -> Tensor:
    """β_j ∝ exp(−T ψ_j) over experts, eq. (13), computed in log space.

    ``normalise=True``: log β = −Tψ − logsumexp(−Tψ) (never 0/0, even at T = 1e4 in float32).
    ``normalise=False``: the unnormalised exp(−Tψ) the paper calls "_u" (e.g. rBCM_var_u).
    ``temperature=math.inf`` gives the Prop. 1 limit: equal weight on the argmin experts.
    ``log=True`` returns log β instead of β.
    """
    if isinstance(temperature, int | float):
        if math.isnan(temperature) or temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if math.isinf(temperature):
            if not normalise:
                raise ValueError("temperature=inf is only defined for normalised weights")
            best = psi == psi.min(0, keepdim=True).values
            beta = best.to(psi.dtype)
            beta = beta / beta.sum(0, keepdim=True)
            return torch.log(beta) if log else beta
    logits = -temperature * psi
    if normalise:
        logits = torch.log_softmax(logits, dim=0)
    return logits if log else torch.exp(logits)


def softmax_variance(
    var: Tensor,
    temperature,
    *,
    normalise: bool = True,
    relative_to=None,
    log: bool = False,
) -> Tensor:
    """Softmax-variance weights, eqs. (13–14): β_j ∝ exp(−T σ_j²) (gPoE_var, BAR_var, rBCM_var_u).

    ``relative_to=prior_var`` uses ψ_j = σ_j²/σ*² instead of σ_j² (T then has no units; with raw
    σ_j², T has units of 1/variance and the paper's T = 100 assumes σ_f² ≈ 1). The default, raw
    σ_j², reproduces the paper.
    """
    psi = var if relative_to is None else var / _align(relative_to, var, "relative_to", True)
    return tempered_softmax(psi, temperature, normalise=normalise, log=log)


def softmax_entropy(
    var: Tensor, prior_var, temperature, *, normalise: bool = True, log: bool = False
) -> Tensor:
    """Softmax of the entropy reduction, eqs. (13, 15), sign fixed: β_j ∝ (σ*²/σ_j²)^{T/2}."""
    gain = differential_entropy(var, prior_var)
    return tempered_softmax(-gain, temperature, normalise=normalise, log=log)


def softmax_w2(
    mean: Tensor,
    var: Tensor,
    prior_var,
    temperature,
    *,
    prior_mean=0.0,
    normalise: bool = True,
    log: bool = False,
) -> Tensor:
    """Softmax of the W2 distance to the prior, eqs. (7, 13): ψ_j = −W2²(N(m_j,σ_j²), N(μ0,σ*²)).

    W2² in 1-D is (m_j − μ0)² + (σ_j − σ*)² (standard deviations, eq. 7); the authors' code used
    variances instead and a different sign, and no table in the paper uses this weighting.
    """
    prior_var = _align(prior_var, var, "prior_var", point=True)
    prior_mean = _align(prior_mean, var, "prior_mean", point=True)
    lo = _min_var(var.dtype)
    w2 = (mean - prior_mean) ** 2 + (var.clamp_min(lo).sqrt() - prior_var.clamp_min(lo).sqrt()) ** 2
    return tempered_softmax(-w2, temperature, normalise=normalise, log=log)


def grbcm_liu(var: Tensor, communication_var) -> Tensor:
    """Liu et al. (2018) grBCM weights for the J augmented experts +j (eq. 5).

    β = 1 for the first augmented expert and ½(log σ_c² − log σ_{+j}²) ≥ 0 for the others,
    where σ_c² is the communication expert's variance (it plays the prior's role).
    """
    beta = differential_entropy(var, communication_var)
    first = torch.ones_like(beta[:1])
    return torch.cat([first, beta[1:]], dim=0)


def expert_weights(
    scheme,
    mean: Tensor,
    var: Tensor,
    *,
    prior_var=None,
    prior_mean=0.0,
    temperature=None,
    normalise: bool | None = None,
) -> Tensor:
    """Dispatch a weighting by name (see :data:`WEIGHTINGS`) or pass a tensor through.

    ``normalise=None`` means the scheme's own convention: uniform → 1/J, entropy → unnormalised,
    softmax-* → normalised (eq. 13); a tensor is used as given. ``True``/``False`` force it.
    """
    if isinstance(scheme, Tensor):
        beta = _align(scheme, mean, "weights").expand_as(mean)
        if (beta < 0).any():
            raise ValueError("expert weights must be non-negative")
        return normalise_weights(beta) if normalise else beta
    if not isinstance(scheme, str) or scheme not in WEIGHTINGS:
        raise ValueError(f"unknown weighting {scheme!r}; expected one of {WEIGHTINGS} or a tensor")
    if scheme == "uniform":
        return uniform(var, normalise=True if normalise is None else normalise)
    if prior_var is None and scheme != "softmax-var":
        raise ValueError(f"weighting {scheme!r} needs prior_var")
    if scheme == "entropy":
        return differential_entropy(var, prior_var, normalise=bool(normalise))
    if temperature is None:
        raise ValueError(
            f"weighting {scheme!r} needs a temperature "
            "(the paper uses T=100 for regression, 15 in Fig. 3, 10 for MNIST)"
        )
    norm = True if normalise is None else normalise
    if scheme == "softmax-var":
        return softmax_variance(var, temperature, normalise=norm)
    if scheme == "softmax-entropy":
        return softmax_entropy(var, prior_var, temperature, normalise=norm)
    return softmax_w2(mean, var, prior_var, temperature, prior_mean=prior_mean, normalise=norm)
