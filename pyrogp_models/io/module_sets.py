"""Modules as read from a module file or folder, and their description as text.

A :class:`ModuleSet` is what a module file (one module, named by the file) or a module folder
(its modules and the partition rule stored with them) holds. :func:`module_table` is the table
of a set that ``pyrogp info`` and the fit commands print: one row per module with flags naming
outliers and unconverged fits (:mod:`pyrogp_models.modules.health`), or a summary for large
sets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pyrogp_models.kernels import kernel_text
from pyrogp_models.modules.files import load_modules, partition_rule
from pyrogp_models.modules.health import elbo_per_point, module_flags
from pyrogp_models.modules.predictor import Predictor
from pyrogp_models.modules.record import Module
from pyrogp_models.modules.routing import as_predictor
from pyrogp_models.text import format_number, format_table

#: Module sets up to this size are described row by row; larger ones by a summary.
MAX_ROWS = 20
#: Likelihood options shown in a module's row.
_SHOWN_OPTIONS = ("num_classes", "link")


@dataclass(frozen=True)
class ModuleSet:
    """Modules by name, in file order, and the rule that partitioned their data (None for a
    module file or a folder of modules collected without an index)."""

    modules: dict[str, Module]
    rule: dict[str, Any] | None = None

    @property
    def first(self) -> Module:
        return next(iter(self.modules.values()))

    def predictor(self) -> Predictor:
        """One module itself, or several routed to the module of each point's partition
        (:func:`~pyrogp_models.modules.routing.as_predictor`)."""
        return as_predictor(self.modules, self.rule)

    def describe(self, verbose: bool = False) -> str:
        """The table of the modules (kernel, hyperparameters, likelihood, ELBO, flags), the
        partition rule and the data columns."""
        table = module_table(self.modules, {
            "N": lambda m: m.num_data, "M": lambda m: m.num_inducing,
            "kernel (data units)": lambda m: kernel_text(m.data_unit_kernel(), 3),
            "likelihood": _likelihood, "ELBO": lambda m: m.elbo}, verbose)
        first = self.first
        rule = describe_rule(self.rule) if self.rule else first.info.get("partition_rule", "none")
        lines = [table, "", f"partition rule: {rule}"]
        if first.columns.describe():
            lines.append(first.columns.describe())
        lines.append("the kernel and the Gaussian noise are in data units; flags: ELBO per point "
                     "far below the siblings' (outlier), a fit that stopped unconverged")
        return "\n".join(lines)

    def summary(self) -> dict[str, Any]:
        """The modules (size, kernel and Gaussian noise in data units, likelihood, ELBO, flags),
        the partition rule and the data columns as JSON-able values (``pyrogp info --json``)."""
        flags = module_flags(self.modules)
        rows = [{"name": name, "num_data": module.num_data,
                 "num_inducing": module.num_inducing,
                 "kernel": kernel_text(module.data_unit_kernel()),
                 "likelihood": {"name": module.likelihood_name, **module.likelihood_options,
                                **{key: value.tolist() for key, value
                                   in _data_unit_likelihood_params(module).items()}},
                 "elbo": module.elbo, "flags": flags.get(name, [])}
                for name, module in self.modules.items()]
        return {"modules": rows, "partition_rule": self.rule,
                "columns": self.first.columns.to_dict()}


def load_module_set(path: str | Path) -> ModuleSet:
    """The modules of a module file or folder and the partition rule stored with them."""
    return ModuleSet(load_modules(path), partition_rule(path))


def module_table(modules: dict[str, Module], columns: dict[str, Callable[[Module], object]],
                 verbose: bool = False) -> str:
    """A table of the modules (``columns``: header → function of a module), with a "flags"
    column naming outliers and unconverged fits; beyond :data:`MAX_ROWS` modules (unless
    ``verbose``) a summary instead: the count, quantiles of the ELBO per point, the five worst
    modules and the flagged ones."""
    flags = module_flags(modules)
    if verbose or len(modules) <= MAX_ROWS:
        rows = [(name, *(value(module) for value in columns.values()),
                 ", ".join(flags.get(name, [])) or "-") for name, module in modules.items()]
        return format_table(["module", *columns, "flags"], rows)
    per_point = elbo_per_point(modules)
    quantiles = np.quantile(per_point, [0.0, 0.05, 0.5, 0.95, 1.0])
    names = list(modules)
    worst = [f"{names[k]} ({per_point[k]:.3g})" for k in np.argsort(per_point)[:5]]
    lines = [f"{len(modules)} modules; ELBO per point: min {quantiles[0]:.4g}, 5% "
             f"{quantiles[1]:.4g}, median {quantiles[2]:.4g}, 95% {quantiles[3]:.4g}, max "
             f"{quantiles[4]:.4g}", f"lowest ELBO per point: {', '.join(worst)}"]
    for flag in ("outlier", "not converged"):
        flagged = [name for name, found in flags.items() if flag in found]
        if flagged:
            shown = ", ".join(flagged[:10]) + (" and more" if len(flagged) > 10 else "")
            lines.append(f"{len(flagged)} {'outliers' if flag == 'outlier' else flag}: {shown}")
    lines.append("(a verbose description lists every module)")
    return "\n".join(lines)


def describe_rule(rule: dict[str, Any] | None) -> str:
    """One phrase naming a partition rule, e.g. ``contiguous along input 0, 4 partitions``."""
    if not rule:
        return "none"
    kind, count = rule["kind"], rule["num_partitions"]
    detail = {"contiguous": f" along input {rule.get('dim')}",
              "label": f" by column '{rule.get('column')}'"}.get(kind, "")
    return f"{kind}{detail}, {count} partition{'s' if count != 1 else ''}"


def _values(tensor: torch.Tensor) -> str:
    """Values of a per-latent tensor [L] or [L, D]: latents split by ' | ', dims by ','."""
    per_latent = tensor.reshape(tensor.shape[0], -1).tolist()
    return " | ".join(",".join(format_number(value, 3) for value in row) for row in per_latent)


def _data_unit_likelihood_params(module: Module) -> dict[str, torch.Tensor]:
    """The likelihood's parameters per latent, a Gaussian noise variance in data units (s_y²σ²)."""
    scale = module.output_scale() ** 2 if module.likelihood_name == "gaussian" else 1.0
    return {key: value * scale if key == "variance" else value
            for key, value in module.likelihood_params.items()}


def _likelihood(module: Module) -> str:
    options = [f"{key}={module.likelihood_options[key]}" for key in _SHOWN_OPTIONS
               if key in module.likelihood_options]
    params = [f"{key}={_values(value.reshape(1, -1))}"
              for key, value in _data_unit_likelihood_params(module).items()]
    settings = ", ".join(options + params)
    return f"{module.likelihood_name}({settings})" if settings else module.likelihood_name
