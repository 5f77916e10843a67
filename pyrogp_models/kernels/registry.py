"""Kernel kinds by name, and kernels rebuilt from their JSON tree and named tensors.

A file stores a kernel as :meth:`~pyrogp_models.kernels.base.Kernel.tree` (kinds, active
dimensions, fixed values — plain JSON) and :meth:`~pyrogp_models.kernels.base.Kernel.
named_values` (tensors). :func:`kernel_from_tree` checks the tree against :data:`KINDS` and
builds the kernel from those data alone: loading never runs code of the file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from pyrogp_models.errors import ModuleFileError
from pyrogp_models.kernels.base import Kernel, Product, Sum
from pyrogp_models.kernels.constant import Constant, White
from pyrogp_models.kernels.leaf import Hyperparameter, Leaf
from pyrogp_models.kernels.linear import Linear
from pyrogp_models.kernels.periodic import Periodic
from pyrogp_models.kernels.rational_quadratic import RationalQuadratic
from pyrogp_models.kernels.stationary import PROFILES, Stationary


def _stationary(family: str) -> Callable[..., Leaf]:
    def build(input_dim: int, **kwargs) -> Leaf:
        return Stationary(family, input_dim, **kwargs)

    return build


#: Every leaf kind: name → constructor (input_dim, active_dims=, batch_shape=, ard=, fixed=,
#: dtype=, device=, **values).
KINDS: dict[str, Callable[..., Leaf]] = {
    **{family: _stationary(family) for family in PROFILES},
    "rq": RationalQuadratic,
    "periodic": Periodic,
    "linear": Linear,
    "constant": Constant,
    "white": White,
}

#: The hyperparameters of every leaf kind.
HYPERPARAMETERS: dict[str, tuple[Hyperparameter, ...]] = {
    **{family: Stationary.hyperparameters for family in PROFILES},
    **{kind: constructor.hyperparameters for kind, constructor in KINDS.items()
       if isinstance(constructor, type)},
}

#: Combinations by name.
COMBINATIONS: dict[str, type] = {"sum": Sum, "product": Product}


def describable(kernel) -> bool:
    """Whether ``kernel`` is made only of the library's kinds (so a file can hold it)."""
    if not isinstance(kernel, Kernel):
        return False
    return all(isinstance(leaf, Leaf) and leaf.kind in KINDS for _, leaf in kernel.parts())


def kernel_from_tree(tree: Mapping, values: Mapping[str, torch.Tensor], prefix: str = "kernel",
                     batch_dims: int = 0) -> Kernel:
    """The kernel of ``tree`` with the tensors ``values`` (named as by ``named_values(prefix)``);
    its hyperparameters have ``batch_dims`` leading dimensions. Raises
    :class:`~pyrogp_models.errors.ModuleFileError` for anything that is not a valid tree."""
    if not isinstance(tree, Mapping) or "kind" not in tree:
        raise ModuleFileError(f"kernel '{prefix}': not a kernel tree")
    kind = tree["kind"]
    if kind in COMBINATIONS:
        parts = tree.get("parts")
        if not isinstance(parts, list) or len(parts) < 2:
            raise ModuleFileError(f"kernel '{prefix}': a {kind} needs at least two parts")
        return COMBINATIONS[kind]([kernel_from_tree(part, values, f"{prefix}.{index}",
                                                    batch_dims)
                                   for index, part in enumerate(parts)])
    if kind not in KINDS:
        raise ModuleFileError(f"kernel '{prefix}': unknown kind '{kind}'; known: "
                              f"{', '.join(sorted([*KINDS, *COMBINATIONS]))}")
    try:
        input_dim = int(tree["input_dim"])
        active_dims = [int(d) for d in tree["active_dims"]]
        ard = bool(tree["ard"])
        fixed = [str(name) for name in tree["fixed"]]
    except (KeyError, TypeError, ValueError) as error:
        raise ModuleFileError(f"kernel '{prefix}': malformed {kind} node ({error})") from None
    found = {}
    for h in HYPERPARAMETERS[kind]:
        name = f"{prefix}.{h.name}"
        if name not in values:
            raise ModuleFileError(f"kernel '{prefix}': missing tensor '{name}'")
        found[h.name] = values[name]
        if not bool(torch.isfinite(found[h.name]).all()):
            raise ModuleFileError(f"kernel '{prefix}': '{h.name}' contains NaN or inf")
        if h.positive and not bool((found[h.name] > 0).all()):
            raise ModuleFileError(f"kernel '{prefix}': '{h.name}' must be positive")
    reference = next(iter(found.values()))
    batch_shape = reference.shape[:batch_dims]
    try:
        leaf = KINDS[kind](input_dim, active_dims=active_dims, batch_shape=batch_shape, ard=ard,
                           fixed=fixed, dtype=reference.dtype, device=reference.device,
                           **found)
    except (ValueError, RuntimeError) as error:
        raise ModuleFileError(f"kernel '{prefix}': {error}") from None
    for h in leaf.hyperparameters:
        if tuple(found[h.name].shape) != leaf.value_shape(h):
            raise ModuleFileError(f"kernel '{prefix}': '{h.name}' has shape "
                                  f"{list(found[h.name].shape)}, expected "
                                  f"{list(leaf.value_shape(h))}")
    leaf.given = tuple(h.name for h in leaf.hyperparameters)
    return leaf
