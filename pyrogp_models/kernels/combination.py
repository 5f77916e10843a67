"""Sums and products of kernels: k = k₁ + k₂ + … and k = k₁ · k₂ · …

Both are kernels (positive semi-definite: Rasmussen & Williams 2006, §4.2.4), batched like
their parts, whose batch shapes must broadcast. Each part reads its own active dimensions of the
input, so ``RBF(1, active_dims=[0]) * Periodic(1, active_dims=[1])`` combines two inputs. The
RBF's fused path (:mod:`~pyrogp_models.kernels.fused_rbf`) serves a plain RBF only; a
combination computes k(X, Z) and its Gram statistics directly.

A product's output scale is carried by its first factor when converting units: (a²k₁)·k₂.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from pyro.nn import PyroModuleList

from pyrogp_models.kernels.base import Kernel


class Combination(Kernel):
    """The parts of a sum or product (flattened: (k₁ + k₂) + k₃ has three terms)."""

    def __init__(self, kernels: Sequence[Kernel], name: str | None = None):
        flat = []
        for kernel in kernels:
            if not isinstance(kernel, Kernel):
                raise TypeError(f"cannot combine a kernel with {type(kernel).__name__}")
            flat.extend(kernel.kernels if type(kernel) is type(self) else [kernel])
        width = max(max(k.active_dims) + 1 for k in flat)
        batch = torch.broadcast_shapes(*(k.batch_shape for k in flat))
        super().__init__(width, None, batch, name)
        self.kernels = PyroModuleList(flat)

    def combine(self, values: list[torch.Tensor]) -> torch.Tensor:
        """Σ or Π of the parts' values."""
        raise NotImplementedError

    def forward(self, X: torch.Tensor, Z: torch.Tensor | None = None, diag: bool = False
                ) -> torch.Tensor:
        """The sum or product of every part's k(X, Z) (or diagonal)."""
        return self.combine([kernel(X, Z, diag=diag) for kernel in self.kernels])

    def slice(self, X: torch.Tensor) -> torch.Tensor:
        """The full input: each part slices its own dimensions."""
        return X

    def tree(self) -> dict:
        """``{"kind": "sum"|"product", "parts": [...]}``."""
        return {"kind": self.kind, "parts": [kernel.tree() for kernel in self.kernels]}

    def named_values(self, prefix: str = "kernel") -> dict[str, torch.Tensor]:
        """The parts' values under ``{prefix}.{i}``."""
        out = {}
        for index, kernel in enumerate(self.kernels):
            out.update(kernel.named_values(f"{prefix}.{index}"))
        return out

    def parts(self) -> list[tuple[str, Kernel]]:
        """Every leaf with its path ``i`` or ``i.j…``."""
        out = []
        for index, kernel in enumerate(self.kernels):
            out.extend((f"{index}.{path}".rstrip("."), leaf) for path, leaf in kernel.parts())
        return out

    def batched(self, batch_shape: Sequence[int]) -> Combination:
        """Every part broadcast to ``batch_shape``."""
        return type(self)([kernel.batched(batch_shape) for kernel in self.kernels])

    def converted(self, input_scale, input_shift, output_scale) -> Combination:
        """Every part converted (a product scales its first factor only)."""
        parts = []
        for index, kernel in enumerate(self.kernels):
            scale = output_scale if (self.kind == "sum" or index == 0) else 1.0
            parts.append(kernel.converted(input_scale, input_shift, scale))
        return type(self)(parts)


class Sum(Combination):
    """k(x, z) = Σ_i k_i(x, z)."""

    kind = "sum"

    def combine(self, values: list[torch.Tensor]) -> torch.Tensor:
        """Σ_i values_i (broadcast)."""
        total = values[0]
        for value in values[1:]:
            total = total + value
        return total


class Product(Combination):
    """k(x, z) = Π_i k_i(x, z)."""

    kind = "product"

    def combine(self, values: list[torch.Tensor]) -> torch.Tensor:
        """Π_i values_i (broadcast)."""
        total = values[0]
        for value in values[1:]:
            total = total * value
        return total
