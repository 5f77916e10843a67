"""Kernels as objects: a batch of covariance functions k(x, z), composed with ``+`` and ``*``.

Every kernel is a :class:`~pyro.nn.PyroModule` whose hyperparameters carry a leading batch shape
(one set per GP of a batch, e.g. ``(K, L)`` for K partitions with L latent functions). Inputs
X [*batch, N, D] and Z [*batch, M, D] (broadcastable batch) give

    forward(X, Z) = k(X, Z) [*batch, N, M],   forward(X, diag=True) = diag k(X, X) [*batch, N],

the call of ``pyro.contrib.gp`` kernels, so a kernel written for Pyro fits where ours do. A leaf
kernel acts on its ``active_dims`` of the input. ``k₁ + k₂`` and ``k₁ * k₂`` build a
:class:`Sum` and a :class:`Product`, kernels too (positive semi-definite: Rasmussen & Williams
2006, §4.2.4), batched like their parts, whose batch shapes must broadcast. Each part reads its
own active dimensions of the input, so ``RBF(1, active_dims=[0]) * Periodic(1, active_dims=[1])``
combines two inputs. The RBF's fused path (:mod:`~pyrogp_models.kernels.fused_rbf`) serves a
plain RBF only; a combination computes k(X, Z) and its Gram statistics directly. A product's
output scale is carried by its first factor when converting units: (a²k₁)·k₂.

A kernel describes itself as a JSON tree (:meth:`Kernel.tree`) plus named tensors
(:meth:`Kernel.named_values`); :func:`~pyrogp_models.kernels.registry.kernel_from_tree` builds
it back without running any code of the file. Each hyperparameter has a *role* that says how it
changes with the units of the data (:class:`Role`), which is what converting a module to other
units, initialising from the data and reading values given in data units need.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import torch
from pyro.nn import PyroModule, PyroModuleList

from pyrogp_models.kernels.fused_rbf import gram_statistics
from pyrogp_models.layers.naming import unique_name


class Role(enum.Enum):
    """How a hyperparameter depends on the units: x = s·x̃ + μ (inputs), y = a·ỹ (outputs).

    - ``INPUT_SCALE`` (lengthscales, periods): a distance, × s per input dimension;
    - ``INPUT_LOCATION`` (a centre): a point, (c − μ)/s per dimension (model from data units);
    - ``OUTPUT_SCALE`` (variances): × a²;
    - ``SLOPE`` (per-dimension weights of a linear kernel): × a²/s²;
    - ``SHAPE`` (dimensionless: a rational-quadratic α, a periodic kernel's lengthscale).
    """

    INPUT_SCALE = "input_scale"
    INPUT_LOCATION = "input_location"
    OUTPUT_SCALE = "output_scale"
    SLOPE = "slope"
    SHAPE = "shape"


class Kernel(PyroModule):
    """A batch of covariance functions; subclasses implement :meth:`forward`.

    Args:
        input_dim: D, the number of input dimensions the kernel sees (its active ones).
        active_dims: the columns of the input it acts on (default: the first ``input_dim``).
        batch_shape: leading shape of every hyperparameter.
        name: the Pyro name of a kernel used on its own (inside a model the model names it).
    """

    #: The name of the kind in files and kernel expressions.
    kind: str = ""

    def __init__(self, input_dim: int, active_dims: Sequence[int] | None = None,
                 batch_shape: Sequence[int] = (), name: str | None = None):
        super().__init__(name or unique_name(self.kind or "kernel"))
        self.input_dim = int(input_dim)
        active = list(range(self.input_dim)) if active_dims is None else [int(d)
                                                                         for d in active_dims]
        if len(active) != self.input_dim:
            raise ValueError(f"a kernel of {self.input_dim} input dimensions needs as many "
                             f"active dimensions, got {active}")
        self.active_dims = active
        self.batch_shape = torch.Size(batch_shape)

    # Covariances ----------------------------------------------------------------------------
    def forward(self, X: torch.Tensor, Z: torch.Tensor | None = None, diag: bool = False
                ) -> torch.Tensor:
        """k(X, Z) [*batch, N, M] (k(X, X) when Z is None), or its diagonal [*batch, N]."""
        raise NotImplementedError

    def diag(self, X: torch.Tensor) -> torch.Tensor:
        """diag k(X, X) of shape [*batch, N]."""
        return self(X, diag=True)

    def paired(self, X: torch.Tensor, Z: torch.Tensor) -> torch.Tensor:
        """k(x_n, z_n) of shape [*batch, N] for X, Z [*batch, N, D]: each row with its partner
        only, as 1 × 1 covariances (stationary kernels: elementwise)."""
        return self(X.unsqueeze(-2), Z.unsqueeze(-2))[..., 0, 0]

    def slice(self, X: torch.Tensor) -> torch.Tensor:
        """The active columns of X [..., D_all] → [..., D]."""
        if X.shape[-1] == self.input_dim and self.active_dims == list(range(self.input_dim)):
            return X
        return X[..., self.active_dims]

    def weighted_cross(self, X: torch.Tensor, Z: torch.Tensor,
                       weights: torch.Tensor | None = None) -> torch.Tensor:
        """√w_n k(x_n, z_m) [*batch, N, M] (w = 1 when ``weights`` is None)."""
        cross = self(X, Z)
        return cross if weights is None else cross * weights.sqrt().unsqueeze(-1)

    def exponent_factors(self, X: torch.Tensor, Z: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(P [N, R], Q [M, R]) with k(X, Z) = exp(P Qᵀ) for a kernel of batch shape (), or None
        when the kernel has no such form (only the RBF has)."""
        return None

    def weighted_gram(self, X: torch.Tensor, Z: torch.Tensor, weights: torch.Tensor,
                      y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Ψ₂ = k(Z, X)Wk(X, Z) [*batch, M, M] and Ψ₁ = k(Z, X)Wy [*batch, M] (W = diag w), from
        G = √W k(X, Z) (:func:`~pyrogp_models.kernels.fused_rbf.gram_statistics`)."""
        return gram_statistics(self.weighted_cross(X, Z, weights), weights.sqrt() * y)

    # Composition ----------------------------------------------------------------------------
    def __add__(self, other: Kernel) -> Kernel:
        return Sum([self, other])

    def __mul__(self, other: Kernel) -> Kernel:
        return Product([self, other])

    # Description ----------------------------------------------------------------------------
    def tree(self) -> dict:
        """The kernel's structure as JSON: kind, active dimensions, which values are fixed."""
        raise NotImplementedError

    def named_values(self, prefix: str = "kernel") -> dict[str, torch.Tensor]:
        """Every hyperparameter's (constrained) value under a name given by its place in the
        tree: ``kernel.lengthscale``, ``kernel.1.0.period``, …"""
        raise NotImplementedError

    def parts(self) -> list[tuple[str, Kernel]]:
        """(path, leaf) for every leaf of the tree, in order (``""`` for a leaf kernel)."""
        raise NotImplementedError

    def batched(self, batch_shape: Sequence[int]) -> Kernel:
        """A new kernel of the same structure and values with every hyperparameter broadcast to
        ``batch_shape`` (each member free to move on its own)."""
        raise NotImplementedError

    def converted(self, input_scale: torch.Tensor, input_shift: torch.Tensor,
                  output_scale: float | torch.Tensor) -> Kernel:
        """The same covariance for inputs x' = (x − shift)/scale and outputs a·y: k'(x', z') =
        a² k(x, z). ``input_scale``, ``input_shift`` [D_all] (the full input); ``output_scale``
        a number or one per member of the batch; a new kernel."""
        raise NotImplementedError

    def extra_repr(self) -> str:
        return f"kind={self.kind}, batch_shape={tuple(self.batch_shape)}"


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


def as_tensor(value, dtype: torch.dtype | None, device) -> torch.Tensor:
    """``value`` as a tensor of ``dtype`` on ``device`` (float64 where neither value nor dtype
    say otherwise)."""
    if torch.is_tensor(value):
        return value.to(dtype=dtype or value.dtype, device=device or value.device)
    return torch.as_tensor(value, dtype=dtype or torch.get_default_dtype(), device=device)
