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

:func:`embed_transfer` starts an mMDGP where the tasks already share something: the free (zero-mean)
column of its shared process takes the fitted iGP of the source task, g(x) ≈ f^s(x) (its inducing
inputs, kernel and whitened q(u) copied, so the column's q marginals are iGP's of task s), the
private processes pass x through, and every task's top GP starts on g alone (a long lengthscale on
every other column) with its linear mean the least-squares line of the task's targets on ḡ — so
a task observed where the source is learns its output as a function of the source's latent and
carries it through its own gaps. From the iGP embedding the top layers have no reason to leave
x, and a deep fit finds no transfer.
"""

from __future__ import annotations

import torch

from pyrogp_models.models.multitask.model import MultitaskGP
from pyrogp_models.models.multitask.processes import ConcatenatedLatents, CoregionalisedLatents

#: The shallow model each deep model contains.
CONTAINED = {"smdgp": "igp", "mmdgp": "igp", "idgp": "igp", "cmdgp": "cgp"}
#: Inner kernel variance of a deep model set to reproduce its shallow one.
SWITCHED_OFF = 1e-12
#: Top-layer lengthscale (model units: inputs and targets standardised) of the columns a
#: transfer start leaves unused, and of the shared latent column, whose values are a
#: standardised task's.
UNUSED_LENGTHSCALE, LATENT_LENGTHSCALE = 10.0, 1.0


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
        layer.set_posterior_to_prior()
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


def transfer_column(deep: MultitaskGP) -> int | None:
    """The column of λ a transfer start (:func:`embed_transfer`) gives the source task's latent:
    the first zero-mean column of the shared process of a model with shared and private
    processes (mMDGP with a process width W > D_in, so that every input still passes through
    the private processes); None otherwise."""
    latent = deep.latent
    if not isinstance(latent, ConcatenatedLatents) or latent.shared is None \
            or latent.private is None or latent.shared.mean_weights is None:
        return None
    free = (latent.shared.mean_weights == 0).all(0).nonzero().flatten()
    return int(free[0]) if len(free) else None


def source_task(task: torch.Tensor, num_tasks: int) -> int:
    """The task a transfer start shares, from every row's task [N]: the one with the most rows
    (the first of equals)."""
    return int(torch.bincount(task, minlength=num_tasks).argmax())


@torch.no_grad()
def embed_transfer(deep: MultitaskGP, shallow: MultitaskGP, source: int) -> None:
    """Start ``deep`` (an mMDGP, :func:`transfer_column` not None) from the fitted iGP
    ``shallow`` with its shared process's free column g the latent of task ``source``: Z, the
    Matérn kernel and the whitened q(u) of that task's GP, so that q(g(x)) = q(f^s(x)); the other
    shared columns at the prior with that kernel, the private processes switched off (λ's
    private columns are the inputs), the likelihood iGP's. Every task's top GP gets inducing
    inputs λ̄(Z^t) (the latent space's mean at its iGP inducing inputs), ARD lengthscales
    :data:`LATENT_LENGTHSCALE` on g and :data:`UNUSED_LENGTHSCALE` on the other columns, iGP's
    variance, q(u) at the prior (a natural-gradient step sets it) and, where it has a linear
    mean m^t(λ) = λb^t and a Gaussian likelihood, b^t = β_t e_g with
    β_t = Σ_n ḡ_n y_n / Σ_n ḡ_n² over the task's rows."""
    column = transfer_column(deep)
    if column is None or shallow.kind != "igp":
        raise ValueError(f"a transfer start needs an mMDGP with a free shared column and a "
                         f"fitted iGP, got {deep.kind} and {shallow.kind}")
    embed_shallow(deep, shallow, SWITCHED_OFF)
    source_gp, shared = shallow.top.layer, deep.latent.shared.layer
    shared.inducing_unit = ((source_gp.inducing[source] - shared.inducing_centre)
                            / shared.inducing_scale).expand_as(shared.inducing_unit)
    lengthscale = source_gp.kernel.lengthscale[source]
    if shared.kernel.lengthscale.shape[-1] != lengthscale.shape[-1]:
        lengthscale = lengthscale.log().mean(-1, keepdim=True).exp()
    shared.kernel.lengthscale = lengthscale.expand_as(shared.kernel.lengthscale).clone()
    shared.kernel.variance = source_gp.kernel.variance[source].expand_as(
        shared.kernel.variance).clone()
    mean, sqrt = shared.q_mean.clone(), shared.q_sqrt.clone()                # the prior
    mean[0, column], sqrt[0, column] = source_gp.q_mean[source, 0], source_gp.q_sqrt[source, 0]
    shared.set_whitened_posterior(mean, sqrt)
    top = deep.top.layer
    latent_mean, _ = deep.latent.marginals(source_gp.inducing[:, 0])        # [T, M, D^λ]
    top.inducing_unit = ((latent_mean - top.inducing_centre) / top.inducing_scale).unsqueeze(1)
    lengthscale = torch.full_like(top.kernel.lengthscale, UNUSED_LENGTHSCALE)
    lengthscale[..., column] = LATENT_LENGTHSCALE
    top.kernel.lengthscale = lengthscale
    top.set_posterior_to_prior()
    if getattr(deep.top, "mean_weights", None) is not None and deep.likelihood.name == "gaussian":
        deep.top.mean_weights = latent_slopes(deep, column)


def latent_slopes(deep: MultitaskGP, column: int) -> torch.Tensor:
    """b^t [T, D^λ, 1] of a transfer start's top linear means: β_t = Σ_n ḡ_n y_n / Σ_n ḡ_n² on
    column g over task t's rows (ḡ the shared process's mean), 0 on the other columns."""
    latent_mean, _ = deep.latent.shared.marginals(deep.data_X.unsqueeze(0))
    g = latent_mean[0, :, column]
    num_tasks = deep.num_tasks
    moment = g.new_zeros(num_tasks).index_add_(0, deep.data_task, g * deep.data_y)
    energy = g.new_zeros(num_tasks).index_add_(0, deep.data_task, g.square())
    slopes = torch.zeros_like(deep.top.mean_weights)
    slopes[:, column, 0] = moment / energy.clamp_min(torch.finfo(g.dtype).tiny)
    return slopes
