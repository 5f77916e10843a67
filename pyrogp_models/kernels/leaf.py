"""A kernel with named hyperparameters: the common part of every leaf of a kernel tree.

A leaf declares its hyperparameters (:class:`Hyperparameter`: name, :class:`~pyrogp_models.
kernels.base.Role`, whether it has one value per input dimension, default) and implements
:meth:`Leaf.covariance` on inputs already restricted to its active dimensions. Positive values
are Pyro parameters with a positivity constraint (optimised in log space); a *fixed* value is a
buffer. Per-dimension values have shape ``[*batch, D]`` (``ard=True``) or ``[*batch, 1]``
(shared); the others ``[*batch]``. ``given`` records which values the user chose, so a fit
initialises only the others from the data, and can hold them through a first fit
(:meth:`Leaf.hold_given`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from pyro.distributions import constraints
from pyro.nn import PyroParam

from pyrogp_models.kernels.base import Kernel, Role, as_tensor


@dataclass(frozen=True)
class Hyperparameter:
    """One hyperparameter of a leaf kind: its name, role, whether it has a value per input
    dimension, whether it must be positive, and its default (model units)."""

    name: str
    role: Role
    per_dimension: bool = False
    positive: bool = True
    default: float = 1.0


class Leaf(Kernel):
    """A leaf kernel (see the module docstring).

    Args:
        input_dim, active_dims, batch_shape, name: as for :class:`~pyrogp_models.kernels.base.
            Kernel`.
        ard: one value per input dimension for the per-dimension hyperparameters.
        fixed: names of hyperparameters held at their value (not trained).
        dtype, device: of the hyperparameters.
        values: initial values by name (scalars or broadcastable tensors).
    """

    #: The hyperparameters of the kind, in order.
    hyperparameters: tuple[Hyperparameter, ...] = ()

    def __init__(self, input_dim: int, *, active_dims: Sequence[int] | None = None,
                 batch_shape: Sequence[int] = (), ard: bool = False,
                 fixed: Sequence[str] = (), dtype: torch.dtype | None = None, device=None,
                 name: str | None = None, **values):
        super().__init__(input_dim, active_dims, batch_shape, name)
        names = {h.name for h in self.hyperparameters}
        unknown = (set(values) | set(fixed)) - names
        if unknown:
            raise ValueError(f"the {self.kind} kernel has no hyperparameter "
                             f"{', '.join(sorted(unknown))}; it has {', '.join(sorted(names))}")
        self.ard = bool(ard)
        self.held = False
        self.given_held = False
        self.fixed = tuple(h.name for h in self.hyperparameters if h.name in fixed)
        self.given = tuple(h.name for h in self.hyperparameters if h.name in values)
        for h in self.hyperparameters:
            value = as_tensor(values.get(h.name, h.default), dtype, device)
            self._set(h, value.expand(self.value_shape(h)).clone())

    def assign(self, name: str, value: torch.Tensor) -> None:
        """Set hyperparameter ``name`` to ``value`` (broadcast to its shape), keeping whether
        it is fixed or trained."""
        h = next(h for h in self.hyperparameters if h.name == name)
        reference = getattr(self, name)
        value = value.to(dtype=reference.dtype, device=reference.device)
        self._set(h, value.expand(self.value_shape(h)).clone())

    def value_shape(self, h: Hyperparameter) -> tuple[int, ...]:
        """The shape of hyperparameter ``h``'s value."""
        if h.per_dimension:
            return (*self.batch_shape, self.input_dim if self.ard else 1)
        return tuple(self.batch_shape)

    def hold(self) -> Leaf:
        """Hold every value as a constant (a buffer), as the kernel of a fitted module is: no
        gradient and nothing in Pyro's parameter store when it is evaluated; :meth:`tree` still
        records which values were fixed during the fit. Returns the leaf."""
        self.held = True
        for h in self.hyperparameters:
            self._set(h, getattr(self, h.name).detach().clone())
        return self

    def hold_given(self, hold: bool = True) -> bool:
        """Hold the trained values the user gave (not fixed) as constants (``hold``), or train
        again the ones held so; returns whether any changed."""
        given = self.given_trained()
        if not given or hold == self.given_held:
            return False
        self.given_held = hold
        for h in given:
            self._set(h, getattr(self, h.name).detach().clone())
        return True

    def given_trained(self) -> list[Hyperparameter]:
        """The hyperparameters the user gave that the fit trains (not fixed, not held, with a
        gradient; or held by :meth:`hold_given`)."""
        trained = self.given_held or any(p.requires_grad for p in self.parameters(recurse=False))
        if self.held or not trained:
            return []
        return [h for h in self.hyperparameters
                if h.name in self.given and h.name not in self.fixed]

    def _set(self, h: Hyperparameter, value: torch.Tensor) -> None:
        if h.name in self.fixed or self.held or (self.given_held and h.name in self.given):
            if h.name in self._pyro_params:
                delattr(self, h.name)
            self.register_buffer(h.name, value)
        elif h.positive:
            setattr(self, h.name, PyroParam(value, constraint=constraints.positive))
        else:
            setattr(self, h.name, PyroParam(value, constraint=constraints.real))

    # Covariances ----------------------------------------------------------------------------
    def forward(self, X: torch.Tensor, Z: torch.Tensor | None = None, diag: bool = False
                ) -> torch.Tensor:
        """k(X, Z) [*batch, N, M] on the active dimensions, or its diagonal [*batch, N]."""
        same = Z is None or Z is X
        X = self.slice(X)
        if diag:
            return self.diagonal(X)
        return self.covariance(X, X if same else self.slice(Z), same=same)

    def covariance(self, X: torch.Tensor, Z: torch.Tensor, same: bool) -> torch.Tensor:
        """k(X, Z) on sliced inputs; ``same`` when Z is X (k(X, X): one set of inputs)."""
        raise NotImplementedError

    def diagonal(self, X: torch.Tensor) -> torch.Tensor:
        """diag k(X, X) on sliced inputs; [*batch, N]. Stationary kinds: the variance."""
        return self.variance.unsqueeze(-1).expand(*self.variance.shape, X.shape[-2])

    # Description ----------------------------------------------------------------------------
    def tree(self) -> dict:
        """``{"kind", "input_dim", "active_dims", "ard", "fixed"}``."""
        return {"kind": self.kind, "input_dim": self.input_dim,
                "active_dims": list(self.active_dims), "ard": self.ard,
                "fixed": list(self.fixed)}

    def named_values(self, prefix: str = "kernel") -> dict[str, torch.Tensor]:
        """``{prefix}.{name}`` → the value of every hyperparameter."""
        return {f"{prefix}.{h.name}": getattr(self, h.name) for h in self.hyperparameters}

    def parts(self) -> list[tuple[str, Kernel]]:
        """This leaf alone, at the root."""
        return [("", self)]

    def values(self) -> dict[str, torch.Tensor]:
        """The hyperparameters' values by name (detached)."""
        return {h.name: getattr(self, h.name).detach() for h in self.hyperparameters}

    def rebuilt(self, values: dict[str, torch.Tensor], ard: bool | None = None,
                batch_shape: Sequence[int] | None = None) -> Leaf:
        """A new leaf of this kind, dims, fixed set and ``given`` with other ``values``."""
        reference = next(iter(values.values()))
        leaf = type(self)(self.input_dim, active_dims=self.active_dims,
                          batch_shape=self.batch_shape if batch_shape is None else batch_shape,
                          ard=self.ard if ard is None else ard, fixed=self.fixed,
                          dtype=reference.dtype, device=reference.device, **values)
        leaf.given = self.given
        return leaf

    def batched(self, batch_shape: Sequence[int]) -> Leaf:
        """This leaf with every value broadcast to ``batch_shape``."""
        batch = torch.Size(batch_shape)
        values = {}
        for h in self.hyperparameters:
            value = getattr(self, h.name).detach()
            trailing = value.shape[len(self.batch_shape):]
            values[h.name] = value.expand(torch.Size([*batch, *trailing])).clone()
        return self.rebuilt(values, batch_shape=batch)

    def converted(self, input_scale: torch.Tensor, input_shift: torch.Tensor,
                  output_scale: float | torch.Tensor) -> Leaf:
        """Values for inputs (x − shift)/scale and outputs × a (see :class:`Role`); ``a`` may
        have the batch shape (one per member). A per-dimension value the user gave (all of a
        fitted kernel's) becomes one per dimension where the scales differ; one not given keeps
        its form (a fit initialises it from the data)."""
        scale = input_scale[..., self.active_dims]
        shift = input_shift[..., self.active_dims]
        values = self.values()
        varies = bool((scale != scale[..., :1]).any())
        ard = self.ard or (varies and any(h.per_dimension and h.role is not Role.SHAPE
                                          and h.name in self.given
                                          for h in self.hyperparameters))
        for h in self.hyperparameters:
            value = values[h.name]
            if h.per_dimension and ard and not self.ard:
                value = value.expand(*value.shape[:-1], self.input_dim)
            if h.role is Role.INPUT_SCALE:
                value = value / (scale if ard else scale[..., :1])
            elif h.role is Role.INPUT_LOCATION:
                value = (value - shift) / scale
            elif h.role is Role.SLOPE:
                value = value * (scale if ard else scale[..., :1]) ** 2
            if h.role in (Role.OUTPUT_SCALE, Role.SLOPE):
                factor = torch.as_tensor(output_scale, dtype=value.dtype, device=value.device)
                factor = factor.reshape(factor.shape + (1,) * (value.dim() - factor.dim()))
                value = value * factor**2
            values[h.name] = value
        return self.rebuilt(values, ard=ard)
