"""``pyrogp fit-experts``: exact GP experts with shared hyperparameters as a module folder."""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from pathlib import Path

from pyrogp_models.inference.commands.common import (
    check_output_folder,
    describe_rule,
    one_line_warnings,
    write_module_folder,
)
from pyrogp_models.inference.commands.fit_local import _feature_names
from pyrogp_models.inference.commands.kernel_option import add_kernel_argument
from pyrogp_models.inference.experts_fit import DEFAULT_TRAIN_CONFIG, ExpertsSpec, fit_exact_experts
from pyrogp_models.inference.tables import format_table

from pyrogp_models.data import load_table, split_features_target
from pyrogp_models.data.partitioners import partition_kmeans, partition_random
from pyrogp_models.errors import DataError

NAME = "fit-experts"
HELP = ("fit exact GP experts with shared hyperparameters on partitions of the data and save "
        "them as a module folder")

PARTITION_KINDS = ("random", "kmeans")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("data", metavar="DATA", type=Path, help="CSV (with header) or .npz")
    parser.add_argument("--target", required=True, help="the column to predict")
    parser.add_argument("--features", help="comma-separated feature columns (default: every "
                                           "column but the target)")
    count = parser.add_mutually_exclusive_group(required=True)
    count.add_argument("--experts", type=int, metavar="J", help="number of experts")
    count.add_argument("--points-per-expert", type=int, metavar="P",
                       help="about P points per expert: J = ceil(N / P) experts")
    parser.add_argument("--partition-by", default="kmeans", choices=PARTITION_KINDS,
                        help="how to split the data (default: kmeans)")
    add_kernel_argument(parser)
    parser.add_argument("--ard", action="store_true", help="one lengthscale per input")
    parser.add_argument("--steps", type=int, metavar="N",
                        help=f"maximum L-BFGS steps on the summed log marginal likelihood "
                             f"(default: {DEFAULT_TRAIN_CONFIG.steps}; 0 keeps the initial "
                             f"hyperparameters)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, type=Path, metavar="DIR",
                        help="module folder to write (an existing module folder is replaced)")


def run(args: argparse.Namespace) -> int:
    if args.steps is not None and args.steps < 0:
        raise DataError(f"--steps must be at least 0, got {args.steps}")
    check_output_folder(args.out)
    table = load_table(args.data)
    features = _feature_names(table, args.target, args.features, None)
    X, y = split_features_target(table, args.target, features)
    num_experts = _num_experts(args, len(X))
    if args.partition_by == "random":
        partition = partition_random(len(X), num_experts, args.seed)
    else:
        partition = partition_kmeans(X, num_experts, args.seed)
    config = replace(DEFAULT_TRAIN_CONFIG, seed=args.seed, progress=sys.stderr.isatty())
    if args.steps is not None:
        config = replace(config, steps=args.steps)
    spec = ExpertsSpec(kernel=args.kernel, ard=args.ard,
                       info={"features": features, "target": args.target})
    with one_line_warnings("raise --steps"):
        fit = fit_exact_experts((X, y, partition), spec, config)
    write_module_folder(fit.modules, args.out, partition.rule)
    rows = [(name, module.num_data, module.elbo) for name, module in fit.modules.items()]
    print(format_table(["expert", "N", "log marginal"], rows))
    status = "converged" if fit.result.converged else "step limit reached"
    print(f"\n{len(fit.modules)} exact experts ({describe_rule(partition.rule)}) written to "
          f"{args.out}; {fit.result.steps} steps, {status}")
    return 0


def _num_experts(args: argparse.Namespace, num_points: int) -> int:
    if args.experts is not None:
        if args.experts < 1:
            raise DataError(f"--experts must be at least 1, got {args.experts}")
        return args.experts
    if args.points_per_expert < 1:
        raise DataError(f"--points-per-expert must be at least 1, got {args.points_per_expert}")
    return max(1, math.ceil(num_points / args.points_per_expert))
