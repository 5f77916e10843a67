"""``pyrogp info``: a table describing a module file, a folder of modules or a model file."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from pyrogp_models.inference.commands.common import MAX_ROWS, describe_rule, report_modules
from pyrogp_models.inference.tables import format_number, format_table

from pyrogp_models.kernels import kernel_text
from pyrogp_models.models.distributed_kernel.files import is_distributed_kernel_file
from pyrogp_models.models.multitask import MultitaskPredictor
from pyrogp_models.models.multitask.families import SUMMARIES
from pyrogp_models.models.multitask.files import is_multitask_file, load_multitask
from pyrogp_models.models.multitask.outputs import CoregionalisedGP
from pyrogp_models.modules.files import load_modules_from, partition_rule, resolve_path
from pyrogp_models.modules.record import Module
from pyrogp_models.modules.routing import load_predictor

NAME = "info"
HELP = "describe a module file, a module folder, a distributed-kernel or a multitask file"

_SHOWN_OPTIONS = ("num_classes", "link")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", metavar="DIR_OR_FILE", type=Path,
                        help="a module file, a folder of modules or a model file")
    parser.add_argument("--verbose", action="store_true",
                        help=f"list every module (default: a summary beyond {MAX_ROWS})")


def run(args: argparse.Namespace) -> int:
    path = resolve_path(args.path)
    if is_distributed_kernel_file(path):
        print(load_predictor(path).describe())
        return 0
    if is_multitask_file(path):
        print(describe_multitask(load_multitask(path)))
        return 0
    modules = load_modules_from(path)
    rule = partition_rule(path)
    print(report_modules(modules, {
        "N": lambda m: m.num_data, "M": lambda m: m.num_inducing,
        "kernel (data units)": lambda m: kernel_text(m.data_unit_kernel(), 3),
        "likelihood": _likelihood,
        "ELBO": lambda m: m.elbo}, args.verbose))
    first = next(iter(modules.values()))
    rule_text = describe_rule(rule) if rule else first.info.get("partition_rule", "none")
    print(f"\npartition rule: {rule_text}")
    if "features" in first.info:
        print(f"features: {', '.join(first.info['features'])}; target: {first.info.get('target')}")
    print("the kernel is in data units, Gaussian noise in standardised units; flags: ELBO per "
          "point far below the siblings' (outlier), a fit that stopped unconverged")
    return 0


def _values(tensor: torch.Tensor) -> str:
    """Values of a per-latent tensor [L] or [L, D]: latents split by ' | ', dims by ','."""
    per_latent = tensor.reshape(tensor.shape[0], -1).tolist()
    return " | ".join(",".join(format_number(value, 3) for value in row) for row in per_latent)


def _likelihood(module: Module) -> str:
    options = [f"{key}={module.likelihood_options[key]}" for key in _SHOWN_OPTIONS
               if key in module.likelihood_options]
    params = [f"{key}={_values(value.reshape(1, -1))}"
              for key, value in module.likelihood_params.items()]
    settings = ", ".join(options + params)
    return f"{module.likelihood_name}({settings})" if settings else module.likelihood_name


def describe_multitask(predictor: MultitaskPredictor) -> str:
    """The kind, tasks, layer sizes, per-task likelihood parameters and top-layer ARD weights
    ω = 1/ℓ² (Boustati et al. eq. 10) of a multitask model, and its fit."""
    model, info = predictor.model, predictor.info
    tasks = info.get("tasks") or [str(t) for t in range(model.num_tasks)]
    likelihood = model.likelihood
    options = ", ".join(f"{key}={value}" for key, value in likelihood.options().items())
    features = info.get("features") or [f"x{d}" for d in range(model.input_dim)]
    lines = [f"multitask model: {model.kind} ({SUMMARIES[model.kind]})",
             f"{model.num_tasks} tasks, {model.input_dim} input{'s' * (model.input_dim > 1)} "
             f"({', '.join(features)}); "
             f"likelihood {likelihood.name}" + (f" ({options})" if options else ""),
             f"M = {model.options.num_inducing} inducing inputs per task; q(u) shapes: "
             + ", ".join(f"{name} {list(layer.q_mean.shape)}"
                         for name, layer in model.variational_sites())]
    weights = model.ard_weights().detach()
    per_task = not isinstance(model.top, CoregionalisedGP)
    parameters = {key: value.detach() for key, value in likelihood.parameter_values().items()}
    counts = info.get("num_data")
    rows = [(name, counts[t] if counts else "-",
             *(format_number(float(value[t]), 4) for value in parameters.values()),
             *([_weights(weights[t])] if per_task else []))
            for t, name in enumerate(tasks)]
    lines += ["", format_table(["task", "N", *parameters, *(["ARD weights"] if per_task else [])],
                               rows), ""]
    if not per_task:
        lines.append("ARD weights of the shared top-layer kernel(s): "
                     + " | ".join(_weights(row) for row in weights))
    if model.is_deep:
        lines.append(f"ARD weights are over the {weights.shape[-1]} columns of the latent space "
                     f"λ, the first {model.latent.shared_width} from shared processes")
    if "elbo" in info:
        status = "converged" if info.get("converged") else "not converged"
        lines.append(f"fit: ELBO {info['elbo']:.6g}, {info.get('steps')} steps, {status}")
    if "targets" in info:
        lines.append(f"table: task column '{info['task_column']}', target '{info['targets'][0]}'"
                     if info.get("task_column") else "table: one target column per task")
    if model.is_deep:
        lines.append(f"predictions: a mixture of S = {predictor.num_samples} draws of λ")
    lines.append("kernel hyperparameters and Gaussian noise refer to the standardised data")
    return "\n".join(lines)


def _weights(row: torch.Tensor) -> str:
    return ", ".join(format_number(value, 3) for value in row.tolist())
