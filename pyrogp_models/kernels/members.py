"""Batches of kernels taken apart and put together: one member of a batch, a frozen copy, a stack
of several kernels of one structure, a kernel on another dtype or device.

A trained batch of K local GPs has kernels of batch shape (K, L); module k keeps
:func:`member` (batch shape (L,)), frozen (no gradient). A stack of G modules whose kernels share
one tree evaluates them at once through :func:`stack` (batch shape (G, L)). Library kernels are
rebuilt from their tree and values (:func:`~pyrogp_models.kernels.registry.kernel_from_tree`);
kernels from outside are deep-copied.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

import torch

from pyrogp_models.kernels.base import Kernel
from pyrogp_models.kernels.external import External, detached_copy
from pyrogp_models.kernels.leaf import Leaf
from pyrogp_models.kernels.registry import describable, kernel_from_tree


def held(kernel: Kernel) -> Kernel:
    """``kernel`` with every leaf's values held as constants (:meth:`Leaf.hold`)."""
    for _, leaf in kernel.parts():
        if isinstance(leaf, Leaf):
            leaf.hold()
    return kernel.requires_grad_(False)


def hold_given(module: torch.nn.Module, hold: bool = True) -> bool:
    """Hold the trained values the user gave in every leaf kernel within ``module``
    (:meth:`Leaf.hold_given`), or train them again; returns whether any changed."""
    return any([leaf.hold_given(hold) for leaf in module.modules() if isinstance(leaf, Leaf)])


def _rebuilt(kernel: Kernel, change: Callable[[torch.Tensor], torch.Tensor], batch_dims: int
             ) -> Kernel:
    """A held copy with ``change`` applied to every value; a positive value that underflowed to
    zero in training (a part the fit switched off) becomes the dtype's smallest normal number,
    so that the copy is a valid kernel."""
    values = {}
    for path, leaf in kernel.parts():  # every part is a Leaf: the kernel is describable
        named = leaf.named_values(f"kernel.{path}" if path else "kernel")
        for h, (name, value) in zip(leaf.hyperparameters, named.items(), strict=True):
            value = change(value.detach())
            values[name] = value.clamp_min(torch.finfo(value.dtype).tiny) if h.positive else value
    return held(kernel_from_tree(kernel.tree(), values, batch_dims=batch_dims))


def frozen(kernel: Kernel) -> Kernel:
    """A copy with the same values held as constants (:func:`held`)."""
    if describable(kernel):
        return _rebuilt(kernel, lambda v: v.clone(), len(kernel.batch_shape))
    return detached_copy(kernel).requires_grad_(False)


def moved(kernel: Kernel, dtype: torch.dtype | None = None, device=None) -> Kernel:
    """A frozen copy on ``device`` in ``dtype``."""
    copied = frozen(kernel)
    return copied.to(dtype=dtype or _dtype(kernel), device=device or _device(kernel))


def member(kernel: Kernel, index: int) -> Kernel:
    """Member ``index`` of the first batch dimension, frozen: batch shape (K, L) → (L,)."""
    if describable(kernel):
        return _rebuilt(kernel, lambda v: v[index].clone(), len(kernel.batch_shape) - 1)
    if isinstance(kernel, External):
        per_member = len(kernel.copies) // kernel.batch_shape[0]
        copies = [detached_copy(kernel.copies[index * per_member + j]).requires_grad_(False)
                  for j in range(per_member)]
        return External(copies[0], kernel.batch_shape[1:], copies)
    raise TypeError(f"cannot take a member of a {type(kernel).__name__}")


def signature(kernel: Kernel) -> str | None:
    """A key equal for kernels that :func:`stack` can batch (same tree), None for kernels that
    cannot be stacked (from outside the library)."""
    return json.dumps(kernel.tree(), sort_keys=True) if describable(kernel) else None


def stack(kernels: Sequence[Kernel]) -> Kernel:
    """Kernels of one tree and batch shape (L,) as one kernel of batch shape (G, L)."""
    first = kernels[0]
    if signature(first) is None or any(signature(k) != signature(first) for k in kernels):
        raise ValueError("only kernels of one structure from pyrogp_models.kernels stack")
    values = {name: torch.stack([k.named_values()[name].detach() for k in kernels])
              for name in first.named_values()}
    return held(kernel_from_tree(first.tree(), values, batch_dims=len(first.batch_shape) + 1))


def _dtype(kernel: Kernel) -> torch.dtype:
    return next(iter(kernel.parameters()), next(iter(kernel.buffers()), torch.zeros(()))).dtype


def _device(kernel: Kernel) -> torch.device:
    return next(iter(kernel.parameters()), next(iter(kernel.buffers()), torch.zeros(()))).device
