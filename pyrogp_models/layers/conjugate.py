"""What a model declares for a layer whose data term it can differentiate with respect to q(v)
in closed form: the natural-gradient step then needs no backward pass through the model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ClosedFormGradients:
    """A conjugate layer's objective, given by its data term's gradients: ``gradients()`` returns
    (∂E/∂m, ∂E/∂S) of the data term E (the objective without the whitened KL) with respect to
    the layer's q(v) = N(m, S), shaped like its ``q_mean`` and ``q_sqrt``."""

    gradients: Callable[[], tuple[torch.Tensor, torch.Tensor]]
