"""The one place where the multitask models make their kernels.

Every process of every multitask model — shared and private inner processes, the per-task top
GPs, the latent GPs of a coregionalised top layer — gets its covariance from
:func:`process_kernel`: a batch of Matérn-5/2 kernels, k(r) = σ² (1 + √5 r + 5r²/3) exp(−√5 r)
with r² = Σ_d (x_d − x'_d)²/ℓ_d² (ARD) or one ℓ (Boustati et al., Sec. 4: Matérn-5/2 everywhere;
eq. 10: ARD in the top layer). Changing the kernel family of the multitask models is a change here.
"""

from __future__ import annotations

import math

import torch

from pyrogp_models.kernels import Stationary

#: The kernel family of every multitask process.
KERNEL = "matern52"


def process_kernel(input_dim: int, batch_shape: tuple[int, ...], *, ard: bool,
                   lengthscale: float | torch.Tensor | None, variance: float | torch.Tensor,
                   like: torch.Tensor) -> Stationary:
    """A batch (``batch_shape``) of kernels on ``input_dim`` inputs with the given initial
    hyperparameters, on the dtype and device of ``like``; ``lengthscale`` None starts at
    :func:`initial_lengthscale`."""
    if lengthscale is None:
        lengthscale = initial_lengthscale(input_dim)
    return Stationary(KERNEL, input_dim, batch_shape, ard=ard, lengthscale=lengthscale,
                      variance=variance, dtype=like.dtype, device=like.device)


def initial_lengthscale(input_dim: int) -> float:
    """ℓ = √D for a process on D standardised inputs (the data's, or a deep model's latent
    columns): two points lie about √(2D) units apart, so ℓ = 1 would start most pairs √(2D)
    lengthscales apart, where a Matérn-5/2 kernel all but vanishes once D reaches 10 or so and
    no gradient reaches ℓ (a Bernoulli cGP on 20 inputs then shrinks its mixing to 0 and
    predicts ½ everywhere); ℓ = √D starts them about √2 apart, whatever D."""
    return math.sqrt(input_dim)
