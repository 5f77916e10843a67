"""A deep multitask GP started at the fitted shallow model it contains.

With its inner processes switched off (q(u) at the prior, a vanishing kernel variance), a deep
model's latent space is the fixed linear image of the inputs, λ = xW_λ, and its top layer is a
GP on x (Boustati et al., Sec. 2; spec addendum):

- sMDGP, mMDGP, iDGP contain the independent GPs (iGP): task t's top GP with ARD weights ω on the
  columns of λ has k^t(λ, λ') = σ_t² κ(Σ_j ω_j (λ_j − λ'_j)²). When every column of W_λ is a unit
  vector e_d (the identity means, zero-padded: D_in ≤ the process width) and input d appears in
  c_d columns, ω_j = 1/(c_d ℓ_td²) gives exactly iGP's Σ_d (x_d − x'_d)²/ℓ_td²;
- cMDGP contains cGP: λ^t = xW_λ + A^t u(x) with A^t u → 0, and its coregionalised top layer takes
  cGP's mixing and latent GPs the same way.

:func:`embed_shallow` copies the shallow model's top layer (inducing inputs mapped through W_λ,
whitened q(u), kernel variances, ARD weights as above) and its likelihood into the deep model,
leaving the inner layer at its prior; with a tiny ``inner_variance`` the deep ELBO is the shallow
one up to that variance, which is how a fit keeps a deep model never below its shallow one.
"""

from __future__ import annotations

import torch

from pyrogp_models.models.multitask.model import MultitaskGP
from pyrogp_models.models.multitask.processes import ConcatenatedLatents, CoregionalisedLatents

#: The shallow model each deep model contains.
CONTAINED = {"smdgp": "igp", "mmdgp": "igp", "idgp": "igp", "cmdgp": "cgp"}
#: Inner kernel variance of a deep model set to reproduce its shallow one.
SWITCHED_OFF = 1e-12


def latent_weights(model: MultitaskGP) -> torch.Tensor | None:
    """W_λ [D, D^λ]: the inner layer's fixed linear means (None without them)."""
    latent = model.latent
    if isinstance(latent, CoregionalisedLatents):
        return latent.mean_weights
    if not isinstance(latent, ConcatenatedLatents):
        return None
    parts = []
    for _, block in latent.blocks():
        if block.mean_weights is None:
            return None
        parts += [block.mean_weights] * block.num_processes
    return torch.cat(parts, -1)


def lengthscales_through(weights: torch.Tensor, lengthscale: torch.Tensor
                         ) -> tuple[torch.Tensor, bool]:
    """ARD lengthscales [..., D^λ] on λ = xW_λ that give the kernel with ``lengthscale``
    [..., D] (or [..., 1]) on x, and whether that is exact (every column a unit vector or 0).
    A column of zeros gets the largest lengthscale; other columns the geometric mean."""
    lengthscale = lengthscale.expand(*lengthscale.shape[:-1], weights.shape[0])
    nonzero = weights != 0
    count = nonzero.sum(0)                                                      # [D^λ]
    unit = (count == 1) & ((weights.abs().sum(0) - 1).abs() < 1e-12)
    zero = count == 0
    source = nonzero.long().argmax(0)                                           # [D^λ]
    copies = (nonzero & unit).sum(1).clamp_min(1).to(weights.dtype)             # [D]
    mapped = lengthscale[..., source] * copies[source].sqrt()
    fallback = lengthscale.log().mean(-1, keepdim=True).exp() * weights.shape[1] ** 0.5
    result = torch.where(unit, mapped, fallback)
    result = torch.where(zero, 10.0 * lengthscale.amax(-1, keepdim=True), result)
    return result, bool((unit | zero).all())


@torch.no_grad()
def embed_shallow(deep: MultitaskGP, shallow: MultitaskGP,
                  inner_variance: float | None = None) -> bool:
    """Set ``deep``'s top layer and likelihood from the fitted ``shallow`` model it contains,
    its inner q(u) at the prior and (``inner_variance``) its inner kernel variances; returns
    whether the embedding is exact as the variance vanishes (False: W_λ mixes inputs, or there
    is no fixed linear mean, and only the likelihood and q(u) are copied where shapes allow)."""
    if CONTAINED.get(deep.kind) != shallow.kind:
        raise ValueError(f"{deep.kind} does not contain {shallow.kind}")
    deep.likelihood.load_state_dict(shallow.likelihood.state_dict())
    for _, block in deep.latent.blocks():
        layer = block.layer
        layer.set_whitened_posterior(torch.zeros_like(layer.q_mean),
                                     torch.eye(layer.num_inducing, dtype=layer.q_mean.dtype,
                                               device=layer.q_mean.device)
                                     .expand_as(layer.q_sqrt))
        if inner_variance is not None:
            layer.kernel.variance = torch.full_like(layer.kernel.variance, inner_variance)
    weights = latent_weights(deep)
    if weights is None:
        return False
    top, source = deep.top.layer, shallow.top.layer
    lengthscale, exact = lengthscales_through(weights, source.kernel.lengthscale)
    top.kernel.lengthscale = lengthscale
    top.kernel.variance = source.kernel.variance.clone()
    top.inducing_unit = ((source.inducing @ weights - top.inducing_centre)
                         / top.inducing_scale)
    top.set_whitened_posterior(source.q_mean, source.q_sqrt)
    if getattr(deep.top, "mean_weights", None) is not None:
        deep.top.mean_weights = torch.zeros_like(deep.top.mean_weights)
    if hasattr(shallow.top, "mixing"):
        deep.top.mixing = shallow.top.mixing.clone()
    return exact
