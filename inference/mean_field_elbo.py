"""Pyro's mean-field ELBO without reading a value back to the host.

``pyro.infer.TraceMeanField_ELBO.differentiable_loss`` returns the same surrogate loss as below,
but calls ``.item()`` on it and checks it for NaN on the host at every evaluation (and registers a
backward hook that checks the gradient the same way): two device synchronisations per training
step on a GPU. :class:`DeviceMeanFieldELBO` computes, per particle,

    ELBO = Σ_observed log p(x) − Σ_latent KL[q(z) ‖ p(z)]

(scaled and masked by the sites' plates and ``poutine.scale``; a latent site without a KL in
closed form falls back on log p(z) − log q(z) at the guide's draw, as Pyro does) and returns −ELBO
as a tensor on the model's device. The trainer judges non-finite losses itself, once per
convergence window.
"""

from __future__ import annotations

import torch
from pyro.distributions.kl import kl_divergence
from pyro.distributions.util import scale_and_mask
from pyro.infer import TraceMeanField_ELBO


class DeviceMeanFieldELBO(TraceMeanField_ELBO):
    """``TraceMeanField_ELBO`` whose ``differentiable_loss`` stays on the device (see the module
    docstring); its value equals Pyro's to rounding."""

    def differentiable_loss(self, model, guide, *args, **kwargs) -> torch.Tensor:
        """−ELBO averaged over ``num_particles``, a differentiable tensor (no host read)."""
        loss = 0.0
        for model_trace, guide_trace in self._get_traces(model, guide, args, kwargs):
            loss = loss - _elbo_particle(model_trace, guide_trace) / self.num_particles
        return loss


def _elbo_particle(model_trace, guide_trace) -> torch.Tensor:
    """One particle's ELBO: observed log-densities minus the latent sites' KL terms."""
    elbo = 0.0
    for name, site in model_trace.nodes.items():
        if site["type"] != "sample":
            continue
        if site["is_observed"]:
            elbo = elbo + site["log_prob_sum"]
            continue
        guide_site = guide_trace.nodes[name]
        try:
            kl = kl_divergence(guide_site["fn"], site["fn"])
        except NotImplementedError:
            elbo = elbo + site["log_prob_sum"] - guide_site["score_parts"].entropy_term.sum()
            continue
        elbo = elbo - scale_and_mask(kl, guide_site["scale"], guide_site["mask"]).sum()
    for name, guide_site in guide_trace.nodes.items():  # auxiliary sites of the guide
        if guide_site["type"] == "sample" and name not in model_trace.nodes:
            elbo = elbo - guide_site["score_parts"].entropy_term.sum()
    return elbo
