"""What a user may pass as a kernel: a name or expression, a library kernel, or a kernel from
outside the library — resolved to one :class:`~pyrogp_models.kernels.base.Kernel`."""

from __future__ import annotations

import torch

from pyrogp_models.kernels.base import Kernel
from pyrogp_models.kernels.expression import parse_kernel
from pyrogp_models.kernels.external import External


def resolve_kernel(kernel: str | torch.nn.Module, input_dim: int, ard: bool = False) -> Kernel:
    """``kernel`` as a kernel for inputs of ``input_dim`` columns: an expression
    (:func:`~pyrogp_models.kernels.expression.parse_kernel`; ``ard`` gives every leaf one value
    per dimension), a library kernel (as is), or any other module with ``forward(X, Z=None,
    diag=False)``, e.g. a ``pyro.contrib.gp`` kernel (wrapped in :class:`External`)."""
    if isinstance(kernel, str):
        return parse_kernel(kernel, input_dim, ard)
    if isinstance(kernel, Kernel):
        return kernel
    if isinstance(kernel, torch.nn.Module):
        return External(kernel)
    raise TypeError(f"expected a kernel name or expression, a kernel of pyrogp_models.kernels "
                    f"or pyro.contrib.gp.kernels, or a PyroModule with forward(X, Z=None, "
                    f"diag=False); got {type(kernel).__name__}")
