"""What the trainer asks of a model beyond Pyro's ``model()`` and ``guide()``: four optional
hooks, each declared here as a :class:`typing.Protocol` (a model provides them by having the
method or attribute; nothing is inherited).

- :class:`IndependentMembers` — ``member_objectives(precise)``: the model is a batch of
  independent members (the K partitions of a local fit, the meta-GP's one), each with its own
  parameters and objective [K], so the batched L-BFGS keeps one memory and one step length per
  member (:mod:`pyrogp_models.inference.batched_lbfgs`); ``precise=True`` asks for the
  objective evaluated to rounding, by which convergence is judged at the end. A model whose
  members are independent only for some objectives (a multitask iGP on its collapsed bound)
  returns None for the others.
- :class:`NaturalGradientLayers` — ``natural_gradient_objectives()``: (layer, objective) for
  every sparse-GP layer with a variational q(u), the objective being what the natural-gradient
  step on that layer's q(u) improves (None: the ELBO's own expected log-likelihood,
  :mod:`pyrogp_models.inference.natural_gradient`).
- :class:`HeldParameters` — ``held_parameters()``: parameters (inducing inputs) that the
  batched L-BFGS may hold where they are, late in a fit, to pin the others at their optimum.
- :class:`NoisyObjective` — ``noisy_objective``: true when the loss is a Monte Carlo estimate,
  so that convergence discounts changes within twice its standard error.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from pyrogp_models.layers import SparseGPLayer


@runtime_checkable
class IndependentMembers(Protocol):
    """A model of independent members: one (parameters, −objective [K]) pair per group of
    members sharing a batch."""

    def member_objectives(self, precise: bool = False
                          ) -> list[tuple[Sequence[torch.nn.Parameter],
                                          Callable[[], torch.Tensor]]] | None:
        """(parameters, −objective [K]) per group; ``precise``: evaluated to rounding. None:
        the members are not independent under the current objective."""


@runtime_checkable
class NaturalGradientLayers(Protocol):
    """A model whose variational layers take natural-gradient steps on q(u)."""

    def natural_gradient_objectives(self) -> list[tuple[SparseGPLayer,
                                                        Callable[[], torch.Tensor] | None]]:
        """(layer, objective or None) for every variational sparse-GP layer."""


@runtime_checkable
class HeldParameters(Protocol):
    """A model of independent members some of whose parameters may be held fixed late in a
    fit (:class:`~pyrogp_models.inference.trainer.TrainResult` ``held``)."""

    def held_parameters(self) -> list[torch.nn.Parameter]:
        """The parameters to hold (inducing inputs): where the objective is nearly flat in
        them, the others still pin at their optimum given them."""


@runtime_checkable
class NoisyObjective(Protocol):
    """A model whose loss is a Monte Carlo estimate (``noisy_objective`` true)."""

    noisy_objective: bool
