"""``pyrogp info``: a table describing a module file, a folder of modules or a model file."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from pyrogp_models.inference.commands.common import MAX_ROWS, describe_rule, report_modules
from pyrogp_models.inference.tables import format_number

from pyrogp_models.errors import DataError
from pyrogp_models.models.distributed_kernel.files import is_distributed_kernel_file
from pyrogp_models.models.multitask.description import describe_multitask, multitask_summary
from pyrogp_models.models.multitask.files import is_multitask_file, load_multitask
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
    parser.add_argument("--json", action="store_true",
                        help="a multitask file: print its summary (model, tasks, final ELBO, "
                             "fit phases) as JSON")


def run(args: argparse.Namespace) -> int:
    path = resolve_path(args.path)
    if is_distributed_kernel_file(path):
        print(load_predictor(path).describe())
        return 0
    if is_multitask_file(path):
        predictor = load_multitask(path)
        print(json.dumps(multitask_summary(predictor), indent=1) if args.json
              else describe_multitask(predictor))
        return 0
    if args.json:
        raise DataError(f"--json describes multitask files; {path} is not one")
    modules = load_modules_from(path)
    rule = partition_rule(path)
    print(report_modules(modules, {
        "N": lambda m: m.num_data, "M": lambda m: m.num_inducing, "kernel": _kernel,
        "lengthscale": lambda m: _values(m.lengthscale),
        "variance": lambda m: _values(m.variance), "likelihood": _likelihood,
        "ELBO": lambda m: m.elbo}, args.verbose))
    first = next(iter(modules.values()))
    rule_text = describe_rule(rule) if rule else first.info.get("partition_rule", "none")
    print(f"\npartition rule: {rule_text}")
    if "features" in first.info:
        print(f"features: {', '.join(first.info['features'])}; target: {first.info.get('target')}")
    print("kernel and Gaussian noise parameters are in standardised units; flags: ELBO per point "
          "far below the siblings' (outlier), a fit that stopped unconverged")
    return 0


def _kernel(module: Module) -> str:
    return f"{module.kernel_family}{' (ARD)' if module.ard else ''}"


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
