"""From a combined latent N(m, σ²) to observations (Cohen et al., ICML 2020, eq. 6, §2.2, §6).

The paper combines in f-space and applies the likelihood afterwards: Gaussian noise is added
*after* combining, and class probabilities are E[φ(f)] under the combined latent Gaussian.
:func:`combine_in_y_space` is the alternative of Liu et al. (2018) and others, kept for
comparison: it combines the experts' noisy y-predictives against the noisy prior.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from .rules import combine
from .weights import _min_var

__all__ = [
    "gaussian_predictive",
    "gaussian_log_density",
    "combine_in_y_space",
    "gauss_hermite",
    "bernoulli_probit",
    "bernoulli_logit",
    "multiclass_softmax_mc",
    "multiclass_robustmax",
    "categorical_log_prob",
]

_LOG_2PI = math.log(2.0 * math.pi)


def gaussian_predictive(mean: Tensor, var: Tensor, noise_var) -> tuple[Tensor, Tensor]:
    """p(y*) = N(m, σ² + σ_y²) for a combined latent N(m, σ²) (f-space, §2.2)."""
    return mean, var + torch.as_tensor(noise_var, dtype=var.dtype, device=var.device)


def gaussian_log_density(y: Tensor, mean: Tensor, var: Tensor, noise_var=0.0) -> Tensor:
    """Pointwise log N(y | m, σ² + σ_y²); NLPD is minus its mean."""
    total = var + torch.as_tensor(noise_var, dtype=var.dtype, device=var.device)
    return -0.5 * (_LOG_2PI + torch.log(total) + (y - mean) ** 2 / total)


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
    computed from the noisy variances too, as in the y-space literature (spec §1.5). Keyword
    arguments are passed to :func:`~pyrogp_models.experts.rules.combine`.
    """
    noise = torch.as_tensor(noise_var, dtype=var.dtype, device=var.device)
    if prior_var is not None:
        prior_var = torch.as_tensor(prior_var, dtype=var.dtype, device=var.device) + noise
    if communication is not None:
        communication = (communication[0], communication[1] + noise)
    return combine(
        rule, mean, var + noise, prior_var=prior_var, communication=communication, **kwargs
    )


def gauss_hermite(n_points: int, like: Tensor) -> tuple[Tensor, Tensor]:
    """Nodes x_i and weights w_i/√π for E_{N(0,1)}[g] ≈ Σ_i w_i g(√2 x_i) (numpy.hermgauss)."""
    x, w = np.polynomial.hermite.hermgauss(n_points)
    nodes = torch.as_tensor(x, dtype=like.dtype, device=like.device)
    weights = torch.as_tensor(w / math.sqrt(math.pi), dtype=like.dtype, device=like.device)
    return nodes, weights


def bernoulli_probit(mean: Tensor, var: Tensor) -> Tensor:
    """p(y=1) = ∫ Φ(f) N(f|m, σ²) df = Φ(m / √(1 + σ²)) (closed form, eq. 6)."""
    return torch.special.ndtr(mean / torch.sqrt(1.0 + var))


def bernoulli_logit(mean: Tensor, var: Tensor, *, n_points: int = 20) -> Tensor:
    """p(y=1) = ∫ sigmoid(f) N(f|m, σ²) df by ``n_points``-node Gauss–Hermite quadrature (eq. 6)."""
    nodes, weights = gauss_hermite(n_points, mean)
    f = mean.unsqueeze(-1) + math.sqrt(2.0) * var.clamp_min(0.0).sqrt().unsqueeze(-1) * nodes
    return (torch.sigmoid(f) * weights).sum(-1)


def multiclass_softmax_mc(
    mean: Tensor,
    var: Tensor,
    *,
    num_samples: int = 4096,
    seed: int = 0,
    generator: torch.Generator | None = None,
    chunk: int = 512,
) -> Tensor:
    """p(y=c) = E[softmax(f)_c], f ~ N(m, diag σ²) of shape [N, C], by seeded Monte Carlo.

    Samples are drawn in chunks of ``chunk`` to bound memory at N·chunk·C.
    """
    if generator is None:
        generator = torch.Generator(device=mean.device).manual_seed(seed)
    sd = var.clamp_min(0.0).sqrt()
    total = torch.zeros_like(mean)
    done = 0
    while done < num_samples:
        s = min(chunk, num_samples - done)
        eps = torch.randn(
            (s, *mean.shape), generator=generator, dtype=mean.dtype, device=mean.device
        )
        total = total + torch.softmax(mean + sd * eps, dim=-1).sum(0)
        done += s
    return total / num_samples


def multiclass_robustmax(
    mean: Tensor, var: Tensor, *, epsilon: float = 1e-3, n_points: int = 20
) -> Tensor:
    """RobustMax class probabilities for a diagonal Gaussian N(m, σ²) over C latents, [N, C].

    P_c = P(f_c is the max) = ∫ N(x|m_c, σ_c²) Π_{j≠c} Φ((x − m_j)/σ_j) dx by 1-D Gauss–Hermite
    (as GPflow's RobustMax, without its clipping of Φ to [1e-4, 1 − 1e-4]), then
    p(y=c) = (1 − ε) P_c + ε/(C − 1) (1 − P_c).
    """
    n_class = mean.shape[-1]
    if n_class < 2:
        raise ValueError("robust-max needs at least two classes")
    nodes, weights = gauss_hermite(n_points, mean)
    sd = var.clamp_min(_min_var(var.dtype)).sqrt()
    # x[..., c, i] = m_c + √2 σ_c t_i ; z[..., c, j, i] = (x[..., c, i] − m_j) / σ_j
    x = mean.unsqueeze(-1) + math.sqrt(2.0) * sd.unsqueeze(-1) * nodes
    z = (x.unsqueeze(-2) - mean[..., None, :, None]) / sd[..., None, :, None]
    log_cdf = torch.special.log_ndtr(z)
    eye = torch.eye(n_class, dtype=torch.bool, device=mean.device)[..., None]
    log_prod = log_cdf.masked_fill(eye, 0.0).sum(-2)
    p_max = (torch.exp(log_prod) * weights).sum(-1)
    return (1.0 - epsilon) * p_max + epsilon / (n_class - 1) * (1.0 - p_max)


def categorical_log_prob(probs: Tensor, labels: Tensor, *, clip: float = 1e-12) -> Tensor:
    """log p(y = label), after clipping probabilities to [clip, 1 − clip] and renormalising."""
    p = probs.clamp(clip, 1.0 - clip)
    p = p / p.sum(-1, keepdim=True)
    return torch.log(p.gather(-1, labels.long().unsqueeze(-1))).squeeze(-1)
