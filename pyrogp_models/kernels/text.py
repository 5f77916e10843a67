"""A kernel written back as an expression with its values: the inverse of
:func:`~pyrogp_models.kernels.expression.parse_kernel`.

``rbf(lengthscale=12.3, variance=45.6) + periodic(period=fixed(1), lengthscale=0.81,
variance=3.1) * rbf(lengthscale=95, variance=1)`` — what ``pyrogp info`` prints (in data units,
after :meth:`~pyrogp_models.kernels.base.Kernel.converted`); ``--kernel`` reads it back as
initial values when every value is a single number. Per-dimension values print as a list and
values of a batch (several members) as their range.
"""

from __future__ import annotations

import torch

from pyrogp_models.kernels.base import Combination, Kernel, Product, Sum
from pyrogp_models.kernels.external import External
from pyrogp_models.kernels.leaf import Leaf


def kernel_text(kernel: Kernel, digits: int = 4) -> str:
    """The expression of ``kernel`` with its values to ``digits`` significant digits."""
    if isinstance(kernel, Combination):
        separator = " + " if isinstance(kernel, Sum) else " * "
        parts = []
        for part in kernel.kernels:
            text = kernel_text(part, digits)
            needs_parentheses = isinstance(kernel, Product) and isinstance(part, Sum)
            parts.append(f"({text})" if needs_parentheses else text)
        return separator.join(parts)
    if isinstance(kernel, External):
        return f"<{kernel.description}>"
    if not isinstance(kernel, Leaf):
        return f"<{type(kernel).__name__}>"
    arguments = []
    for h in kernel.hyperparameters:
        value = _number(getattr(kernel, h.name).detach(), digits)
        arguments.append(f"{h.name}={f'fixed({value})' if h.name in kernel.fixed else value}")
    if kernel.ard:
        arguments.append("ard")
    if kernel.active_dims != list(range(kernel.input_dim)):
        arguments.append("dims=[" + ",".join(str(d) for d in kernel.active_dims) + "]")
    return f"{kernel.kind}({', '.join(arguments)})"


def _number(value: torch.Tensor, digits: int) -> str:
    flat = value.reshape(-1)
    if flat.numel() == 1:
        return f"{float(flat[0]):.{digits}g}"
    low, high = float(flat.min()), float(flat.max())
    if low == high:
        return f"{low:.{digits}g}"
    if value.dim() >= 1 and flat.numel() == value.shape[-1] <= 8:
        return "[" + ", ".join(f"{float(v):.{digits}g}" for v in flat) + "]"
    return f"{low:.{digits}g}…{high:.{digits}g}"
