"""Kernels from outside the library, one copy per member of a batch.

Any ``pyro.contrib.gp.kernels.Kernel`` — or a user's :class:`~pyro.nn.PyroModule` with
``forward(X, Z=None, diag=False)`` on inputs [N, D] — works wherever the library's kernels do:
:class:`External` keeps one deep copy per member of the batch (so every partition has its own
hyperparameters, trained by the library's trainer or a user's own ``pyro.infer.SVI``) and
evaluates them member by member. Such a kernel sees the inputs as the model does (standardised,
model units); it cannot be converted to other units or stored in a file: a module that holds one
predicts in this process but is refused by :func:`~pyrogp_models.modules.files.save_module`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import torch
from pyro.nn import PyroModule, PyroModuleList

from pyrogp_models.kernels.base import Kernel


class External(Kernel):
    """``kernel`` (one member) or ``copies`` (one per member, flattened ``batch_shape``)."""

    kind = "external"

    def __init__(self, kernel: torch.nn.Module, batch_shape: Sequence[int] = (),
                 copies: Sequence[torch.nn.Module] | None = None):
        batch = torch.Size(batch_shape)
        input_dim = int(getattr(kernel, "input_dim", 1))
        super().__init__(input_dim, None, batch)
        count = math.prod(batch)
        if copies is None:
            copies = [kernel] if count == 1 else [detached_copy(kernel) for _ in range(count)]
        if len(copies) != count:
            raise ValueError(f"{len(copies)} kernels for a batch of {count}")
        self.copies = PyroModuleList(list(copies))
        self.description = type(kernel).__module__ + "." + type(kernel).__qualname__

    def slice(self, X: torch.Tensor) -> torch.Tensor:
        """The full input (the kernel slices what it uses)."""
        return X

    def forward(self, X: torch.Tensor, Z: torch.Tensor | None = None, diag: bool = False
                ) -> torch.Tensor:
        """Each member's kernel on its own slice of X [*batch, N, D] (and Z)."""
        shape = torch.broadcast_shapes(self.batch_shape, X.shape[:-2],
                                       () if Z is None else Z.shape[:-2])
        if math.prod(shape) != len(self.copies) and len(self.copies) != 1:
            raise ValueError(f"inputs of batch shape {tuple(X.shape[:-2])} for kernels of "
                             f"batch shape {tuple(self.batch_shape)}")
        inputs = X.expand(*shape, *X.shape[-2:]).reshape(-1, *X.shape[-2:])
        others = None if Z is None or Z is X else Z.expand(*shape, *Z.shape[-2:]).reshape(
            -1, *Z.shape[-2:])
        out = []
        for index in range(inputs.shape[0]):
            kernel = self.copies[index % len(self.copies)]
            out.append(kernel(inputs[index], None if others is None else others[index],
                              diag=diag))
        stacked = torch.stack(out)
        return stacked.reshape(*shape, *stacked.shape[1:])

    def tree(self) -> dict:
        """Not describable: a file cannot hold this kernel."""
        raise TypeError(f"a {self.description} kernel cannot be stored in a file")

    def named_values(self, prefix: str = "kernel") -> dict[str, torch.Tensor]:
        """Nothing the library can name."""
        return {}

    def parts(self) -> list[tuple[str, Kernel]]:
        """This kernel alone."""
        return [("", self)]

    def batched(self, batch_shape: Sequence[int]) -> External:
        """One deep copy of the first member per member of ``batch_shape``."""
        return External(self.copies[0], batch_shape)

    def converted(self, input_scale, input_shift, output_scale) -> External:
        """Refused: the library cannot change the units of a kernel it does not know."""
        raise TypeError(f"a {self.description} kernel cannot be converted to other units; "
                        "build it from pyrogp_models.kernels to recycle or combine modules "
                        "fitted in different units")


def as_kernel(kernel) -> Kernel:
    """The library's kernel itself, or an outside kernel wrapped in :class:`External`."""
    if isinstance(kernel, Kernel):
        return kernel
    if isinstance(kernel, torch.nn.Module) and callable(getattr(kernel, "forward", None)):
        return External(kernel)
    raise TypeError(f"expected a kernel (pyrogp_models.kernels, pyro.contrib.gp.kernels or a "
                    f"PyroModule with forward(X, Z=None, diag=False)), got "
                    f"{type(kernel).__name__}")


def detached_copy(kernel: torch.nn.Module) -> torch.nn.Module:
    """A deep copy that a new module can hold: a copy of a PyroModule that has run keeps the
    record of its run (its Pyro context), and Pyro refuses to adopt such a module as a
    submodule; every copied PyroModule gets a fresh context."""
    copied = copy.deepcopy(kernel)
    for module in copied.modules():
        if isinstance(module, PyroModule):
            module._pyro_context = type(module._pyro_context)()
    return copied
