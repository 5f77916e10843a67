"""Initial hyperparameters of every partition's sparse GP, from the partition's own data.

The rule, in model units (inputs and Gaussian targets standardised over the whole fit), for a
partition with N_k points, inputs of spread s_d (standard deviation per input dimension) in D
dimensions and M_k inducing inputs:

- lengthscale ℓ_d = max(2 s_d / M_k^{1/D}, 4 s_d / N_k^{1/D}): twice the spacing of M_k inducing
  inputs spread over the partition, and at least four times the typical spacing of its points
  (a shorter lengthscale is not identified by the data); ARD keeps one per dimension, an
  isotropic kernel their mean;
- Gaussian likelihood: signal variance σ_f² = the mean of y² over the partition (the second
  moment that a zero-mean prior must explain) and noise σ² = 0.1 × the variance of y over the
  partition — a fit that starts with the noise explaining 10 % of the partition's spread starts
  away from the "everything is noise" optimum; other likelihoods: σ_f² = 1;
- floors: spreads and lengthscales 10⁻³, σ_f² 10⁻³ and σ² 10⁻⁶.

A composite kernel (:func:`initial_kernel`) shares σ_f² equally among the terms of a sum (a
product's first factor takes its term's share, the other factors 1); each leaf gets the
lengthscale of the rule on its own input dimensions, a period not given the same, a linear
kernel weights that explain its share over one spread of the inputs and the partitions' mean
input as its centre. Values the user gave (``Leaf.given``) are kept.
"""

from __future__ import annotations

import torch

from pyrogp_models.kernels import Kernel, Leaf, Product, Role, Sum

#: Floor on input spreads and initial lengthscales (standardised units).
MIN_SPREAD = 1e-3
#: Fraction of the partition's output variance the initial Gaussian noise explains.
NOISE_FRACTION = 0.1


def input_spread(X: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Standard deviation of each partition's inputs per dimension (the rows of ``mask``, every
    row when None), floored; [K, D]."""
    weights = X.new_ones(X.shape[:-1]) if mask is None else mask.to(X.dtype)
    weights = weights.unsqueeze(-1)
    count = weights.sum(-2).clamp_min(1.0)
    mean = (X * weights).sum(-2) / count
    spread = (((X - mean.unsqueeze(-2)) * weights).square().sum(-2) / count).sqrt()
    return spread.clamp_min(MIN_SPREAD)


def spreads_per_lengthscale(num_inducing: torch.Tensor, points: torch.Tensor, dims: int
                            ) -> torch.Tensor:
    """s_d / ℓ_d of the rule above, min(M_k^{1/D} / 2, N_k^{1/D} / 4), for M_k and N_k [...]."""
    return torch.minimum(num_inducing ** (1.0 / dims) / 2.0, points ** (1.0 / dims) / 4.0)


def initial_lengthscale(X: torch.Tensor, mask: torch.Tensor, num_inducing: int, ard: bool
                        ) -> torch.Tensor:
    """ℓ of the rule above: [K, D] with ARD, else [K, 1]."""
    spread = input_spread(X, mask)
    points = mask.sum(-1, keepdim=True).to(X.dtype).clamp_min(1.0)
    ratio = spreads_per_lengthscale(torch.full_like(points, num_inducing), points,
                                    spread.shape[-1])
    lengthscale = (spread / ratio).clamp_min(MIN_SPREAD)
    return lengthscale if ard else lengthscale.mean(-1, keepdim=True)


def initial_gaussian_variances(y: torch.Tensor, mask: torch.Tensor
                               ) -> tuple[torch.Tensor, torch.Tensor]:
    """(σ_f², σ²) of the rule above for targets y [K, N]; each [K]."""
    weights = mask.to(y.dtype)
    count = weights.sum(-1).clamp_min(1.0)
    second_moment = (weights * y.square()).sum(-1) / count
    mean = (weights * y).sum(-1) / count
    variance = (second_moment - mean.square()).clamp_min(0.0)
    return second_moment.clamp_min(1e-3), (NOISE_FRACTION * variance).clamp_min(1e-6)


def initial_kernel(template: Kernel, X: torch.Tensor, mask: torch.Tensor, num_inducing: int,
                   signal_variance: torch.Tensor, num_latent: int = 1,
                   scale: torch.Tensor | None = None) -> Kernel:
    """``template`` (model units) batched to (K, ``num_latent``) with the values it does not
    give set by the rule of the module docstring from the partitions' data X [K, N, D], mask
    [K, N]; ``signal_variance`` [K] is σ_f² of the whole kernel; ``scale`` [K] multiplies the
    lengthscales and periods the rule sets (a restart's start)."""
    kernel = template.batched((X.shape[0], num_latent)).to(dtype=X.dtype, device=X.device)
    scale = X.new_ones(X.shape[0]) if scale is None else scale
    _share(kernel, signal_variance, X, mask, num_inducing, scale)
    return kernel


def _share(kernel: Kernel, variance: torch.Tensor, X, mask, num_inducing: int, scale) -> None:
    if isinstance(kernel, Sum):
        for part in kernel.kernels:
            _share(part, variance / len(kernel.kernels), X, mask, num_inducing, scale)
    elif isinstance(kernel, Product):
        for index, part in enumerate(kernel.kernels):
            _share(part, variance if index == 0 else torch.ones_like(variance), X, mask,
                   num_inducing, scale)
    elif isinstance(kernel, Leaf):
        _initialise_leaf(kernel, variance, X[..., kernel.active_dims], mask, num_inducing, scale)


def _initialise_leaf(leaf: Leaf, variance: torch.Tensor, X, mask, num_inducing: int,
                     scale: torch.Tensor) -> None:
    """Set the values of ``leaf`` [K, L, ...] that its user did not give."""
    for h in leaf.hyperparameters:
        if h.name in leaf.given:
            continue
        if h.role is Role.INPUT_SCALE:
            value = (initial_lengthscale(X, mask, num_inducing, leaf.ard)
                     * scale.unsqueeze(-1)).unsqueeze(1)
        elif h.role is Role.OUTPUT_SCALE:
            value = variance.unsqueeze(1)
        elif h.role is Role.SLOPE:
            spread = input_spread(X, mask)
            per_dimension = spread if leaf.ard else spread.mean(-1, keepdim=True)
            value = (variance.unsqueeze(-1) / (X.shape[-1] * per_dimension.square())).unsqueeze(1)
        elif h.role is Role.INPUT_LOCATION:
            weights = mask.to(X.dtype).unsqueeze(-1)
            value = ((X * weights).sum(-2) / weights.sum(-2).clamp_min(1.0)).unsqueeze(1)
        else:
            continue
        leaf.assign(h.name, value)
