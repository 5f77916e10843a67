"""``pyrogp fit-experts``: exact GP experts with shared hyperparameters as a module folder."""

from __future__ import annotations

import argparse
from pathlib import Path

from pyrogp_models.inference.commands.arguments import (
    add_data,
    add_features,
    add_float32,
    add_kernel,
    add_restarts,
    add_seed,
    add_units,
)
from pyrogp_models.inference.train_config import DEFAULT_EXPERT_POINTS, EXPERTS_CONFIG

from pyrogp_models.text import count_of

NAME = "fit-experts"
HELP = ("fit exact GP experts with shared hyperparameters on partitions of the data and save "
        "them as a module folder")

PARTITION_KINDS = ("random", "kmeans")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_data(parser)
    parser.add_argument("--target", required=True, help="the column to predict")
    add_features(parser)
    add_units(parser)
    count = parser.add_mutually_exclusive_group()
    count.add_argument("--experts", type=int, metavar="J", help="number of experts")
    count.add_argument("--points-per-expert", type=int, metavar="P",
                       help="about P points per expert: J = ceil(N / P) experts (default: "
                            f"{DEFAULT_EXPERT_POINTS})")
    parser.add_argument("--partition-by", default="kmeans", choices=PARTITION_KINDS,
                        help="how to split the data (default: kmeans)")
    add_kernel(parser)
    add_restarts(parser, exact=True)
    parser.add_argument("--ard", action="store_true", help="one lengthscale per input")
    parser.add_argument("--steps", type=int, metavar="N",
                        help=f"maximum L-BFGS steps on the summed log marginal likelihood "
                             f"(default: {EXPERTS_CONFIG.steps}; 0 keeps the initial "
                             f"hyperparameters)")
    add_seed(parser, "the partition")
    add_float32(parser)
    parser.add_argument("--out", required=True, type=Path, metavar="DIR",
                        help="module folder to write (an existing module folder is replaced)")


def run(args: argparse.Namespace) -> int:
    import sys
    from dataclasses import replace

    import torch
    from pyrogp_models.inference.commands.common import (
        check_output,
        data_columns,
        feature_columns,
        one_line_warnings,
        write_module_folder,
    )
    from pyrogp_models.inference.experts_fit import ExpertsSpec, fit_exact_experts

    from pyrogp_models.data import load_table, split_features_target
    from pyrogp_models.data.partitioners import partition_kmeans, partition_random
    from pyrogp_models.errors import DataError
    from pyrogp_models.io import describe_rule
    from pyrogp_models.io.formats import MODULE_FOLDER
    from pyrogp_models.text import format_table

    if args.steps is not None and args.steps < 0:
        raise DataError(f"--steps must be at least 0, got {args.steps}")
    check_output(args.out, MODULE_FOLDER)
    table = load_table(args.data)
    features = feature_columns(table, [args.target], args.features)
    X, y = split_features_target(table, args.target, features)
    num_experts = _num_experts(args, len(X))
    if args.partition_by == "random":
        partition = partition_random(len(X), num_experts, args.seed)
    else:
        partition = partition_kmeans(X, num_experts, args.seed)
    config = replace(EXPERTS_CONFIG, seed=args.seed, progress=sys.stderr.isatty())
    if args.steps is not None:
        config = replace(config, steps=args.steps)
    spec = ExpertsSpec(kernel=args.kernel, ard=args.ard, restarts=args.restarts,
                       columns=data_columns(features, args.target, args.units),
                       dtype=torch.float32 if args.float32 else torch.float64)
    with one_line_warnings("raise --steps"):
        fit = fit_exact_experts((X, y, partition), spec, config)
    write_module_folder(fit.modules, args.out, partition.rule)
    rows = [(name, module.num_data, module.elbo) for name, module in fit.modules.items()]
    print(format_table(["expert", "N", "log marginal"], rows))
    status = "converged" if fit.result.converged else "step limit reached"
    print(f"\n{count_of(len(fit.modules), 'exact expert')} ({describe_rule(partition.rule)}) "
          "written to "
          f"{args.out}; {fit.result.steps} steps, {status}")
    return 0


def _num_experts(args: argparse.Namespace, num_points: int) -> int:
    import math

    from pyrogp_models.errors import DataError

    if args.experts is not None:
        if args.experts < 1:
            raise DataError(f"--experts must be at least 1, got {args.experts}")
        return args.experts
    points = DEFAULT_EXPERT_POINTS if args.points_per_expert is None else args.points_per_expert
    if points < 1:
        raise DataError(f"--points-per-expert must be at least 1, got {points}")
    return max(1, math.ceil(num_points / points))
