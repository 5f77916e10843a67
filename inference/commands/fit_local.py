"""``pyrogp fit-local``: fit one sparse variational GP per partition of a data file."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from pyrogp_models.inference.commands.arguments import (
    LIKELIHOOD_NAMES,
    add_data,
    add_features,
    add_float32,
    add_kernel,
    add_restarts,
    add_seed,
    add_units,
)
from pyrogp_models.inference.train_config import (
    COLLAPSED_CONFIG,
    DEFAULT_PARTITION_ROWS,
    EXACT_LIKELIHOODS,
    MAX_DEFAULT_INDUCING,
    MINIBATCH_NATURAL_GRADIENT,
    UNCOLLAPSED_CONFIG,
)

from pyrogp_models.text import count_of

NAME = "fit-local"
HELP = "fit one sparse GP per partition of the data and save them as a module folder"

PARTITION_KINDS = ("random", "kmeans", "contiguous")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_data(parser)
    parser.add_argument("--target", required=True, help="the column to predict")
    add_features(parser, "the target and the partition column")
    add_units(parser)
    parser.add_argument("--partitions", type=int, metavar="K",
                        help="number of partitions (default: one per "
                             f"{DEFAULT_PARTITION_ROWS} rows; with --partition-by COLUMN its "
                             "distinct values)")
    parser.add_argument("--partition-by", default="kmeans",
                        metavar="random|kmeans|contiguous|COLUMN",
                        help="how to split the data; a column name gives one partition per "
                             "distinct value (default: kmeans)")
    parser.add_argument("--dim", type=int, default=0,
                        help="input dimension cut into blocks by --partition-by contiguous")
    parser.add_argument("--inducing", type=int, metavar="M",
                        help="inducing inputs per partition (default: half its rows, at most "
                             f"{MAX_DEFAULT_INDUCING})")
    parser.add_argument("--likelihood", default="gaussian", choices=LIKELIHOOD_NAMES,
                        metavar="NAME", help="observation model: a likelihood of the library "
                                             "(default: gaussian)")
    parser.add_argument("--classes", type=int, metavar="C",
                        help="number of classes for categorical (default: largest label + 1)")
    parser.add_argument("--link", help="bernoulli: logit|probit; categorical: softmax|robustmax")
    add_kernel(parser)
    add_restarts(parser)
    parser.add_argument("--ard", action="store_true", help="one lengthscale per input")
    parser.add_argument("--steps", type=int, metavar="N",
                        help=f"maximum optimiser steps (default: {COLLAPSED_CONFIG.steps} "
                             "L-BFGS iterations for the collapsed bound and the "
                             f"{', '.join(EXACT_LIKELIHOODS)} likelihoods, "
                             f"{UNCOLLAPSED_CONFIG.steps} Adam steps for the categorical, "
                             "with --batch-size or --lr/--natural-gradient)")
    parser.add_argument("--lr", type=float, metavar="LR",
                        help=f"Adam learning rate of the uncollapsed bound (default: "
                             f"{UNCOLLAPSED_CONFIG.lr:g}); trains by Adam where L-BFGS is the "
                             "default")
    parser.add_argument("--natural-gradient", type=float, metavar="GAMMA",
                        help="size of the natural-gradient step on every q(u) before each Adam "
                             "step of the uncollapsed bound (implies --uncollapsed and Adam); "
                             "0: Adam moves q(u) too (default where Adam trains: "
                             f"{UNCOLLAPSED_CONFIG.natural_gradient_lr:g}, "
                             f"{MINIBATCH_NATURAL_GRADIENT:g} with --batch-size)")
    parser.add_argument("--batch-size", type=int, metavar="B",
                        help="minibatch size per partition (the uncollapsed bound)")
    bound = parser.add_mutually_exclusive_group()
    bound.add_argument("--collapsed", action="store_true",
                       help="the collapsed (Titsias) bound; the default for gaussian")
    bound.add_argument("--uncollapsed", action="store_true",
                       help="the uncollapsed ELBO with q(u) as a parameter; the default for "
                            "other likelihoods and with --batch-size")
    add_seed(parser, "the partition, the inducing inputs and the training draws")
    add_float32(parser)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--workers", type=int, metavar="N",
                       help="fit on an embedded Dask cluster of N single-threaded workers")
    where.add_argument("--scheduler", metavar="ADDRESS",
                       help="fit on the Dask cluster whose scheduler is at ADDRESS")
    parser.add_argument("--verbose", action="store_true",
                        help="list every module (default: a summary of a large set)")
    parser.add_argument("--out", required=True, type=Path, metavar="DIR",
                        help="module folder to write (an existing module folder is replaced)")


def run(args: argparse.Namespace) -> int:
    import time

    import torch
    from pyrogp_models.inference.commands.common import (
        check_output,
        data_columns,
        feature_columns,
        likelihood_options,
        one_line_warnings,
        write_module_folder,
    )
    from pyrogp_models.inference.executors import fit_local_on
    from pyrogp_models.inference.local_fit import LocalFitSpec, collapsed_bound

    from pyrogp_models.data import load_table, split_features_target
    from pyrogp_models.errors import DataError
    from pyrogp_models.io import describe_rule, module_table
    from pyrogp_models.io.formats import MODULE_FOLDER

    if args.inducing is not None and args.inducing < 1:
        raise DataError(f"--inducing must be at least 1, got {args.inducing}")
    if args.natural_gradient is not None:
        if not 0.0 <= args.natural_gradient <= 1.0:
            raise DataError(f"--natural-gradient must be in [0, 1], got {args.natural_gradient:g}")
        if args.collapsed:
            raise DataError("--natural-gradient moves q(u) of the uncollapsed bound; with "
                            "--collapsed q(u) is optimal already: give one of the two")
    if args.collapsed and args.likelihood != "gaussian":
        raise DataError(f"--collapsed needs the gaussian likelihood, not {args.likelihood}")
    check_output(args.out, MODULE_FOLDER)
    table = load_table(args.data)
    partition_column = None if args.partition_by in PARTITION_KINDS else args.partition_by
    if partition_column is not None and partition_column not in table.columns:
        raise DataError(f"--partition-by '{partition_column}' is neither "
                        f"{', '.join(PARTITION_KINDS)} nor a column of the data "
                        f"({', '.join(table.columns)})")
    features = feature_columns(table, [args.target], args.features,
                               (partition_column,) if partition_column else ())
    X, y = split_features_target(table, args.target, features)
    partition = _make_partition(args, table, X, partition_column)
    spec = LocalFitSpec(
        num_inducing=args.inducing, likelihood=args.likelihood,
        likelihood_options=likelihood_options(args, y), kernel=args.kernel, ard=args.ard,
        restarts=args.restarts,
        collapsed=(True if args.collapsed else
                   False if args.uncollapsed or args.natural_gradient is not None else None),
        batch_size=args.batch_size, dtype=torch.float32 if args.float32 else torch.float64,
        columns=data_columns(features, args.target, args.units),
        info={"partition_column": partition_column} if partition_column else None)
    config = _train_config(args, spec)
    start = time.perf_counter()
    with one_line_warnings("raise --steps"):
        fit = fit_local_on((X, y, partition), spec, config, workers=args.workers,
                           scheduler=args.scheduler)
    seconds = time.perf_counter() - start
    write_module_folder(fit.modules, args.out, partition.rule)
    print(module_table(fit.modules, {"N": lambda m: m.num_data, "M": lambda m: m.num_inducing,
                                     "ELBO": lambda m: m.elbo}, args.verbose))
    status = "converged" if fit.result.converged else "not converged"
    bound = "collapsed" if collapsed_bound(spec) else "uncollapsed"
    print(f"\n{count_of(len(fit.modules), 'module')} ({describe_rule(partition.rule)}, "
          f"{bound} bound) "
          f"written to {args.out}; {fit.result.steps} steps, {status}, {seconds:.1f} s")
    return 0


def _train_config(args: argparse.Namespace, spec):
    """The spec's default configuration with the command line's seed, progress bar and any
    --steps, --lr, --natural-gradient given."""
    import sys
    from dataclasses import replace

    from pyrogp_models.inference.local_fit import collapsed_bound, default_config

    from pyrogp_models.errors import DataError

    adam = args.lr is not None or args.natural_gradient is not None
    if args.lr is not None and collapsed_bound(spec):
        raise DataError("--lr sets Adam's learning rate of the uncollapsed bound; the "
                        "collapsed bound is fitted by L-BFGS")
    base = default_config(spec)
    if adam and base.optimizer == "lbfgs":  # an exact bound's L-BFGS: they ask for Adam
        base = UNCOLLAPSED_CONFIG
    config = replace(base, seed=args.seed, progress=sys.stderr.isatty())
    if args.steps is not None:
        config = replace(config, steps=args.steps)
    if args.lr is not None:
        config = replace(config, lr=args.lr)
    if args.natural_gradient is not None:
        config = replace(config, natural_gradient_lr=args.natural_gradient or None)
    return config


def _make_partition(args: argparse.Namespace, table, X, partition_column: str | None):
    from pyrogp_models.data.partitioners import (
        partition_by_label,
        partition_contiguous,
        partition_kmeans,
        partition_random,
    )
    from pyrogp_models.errors import DataError

    if partition_column is not None:
        partition = partition_by_label(table.column(partition_column), partition_column)
        if args.partitions is not None and args.partitions != partition.num_partitions:
            raise DataError(f"column '{partition_column}' has {partition.num_partitions} "
                            f"distinct values but --partitions is {args.partitions}")
        return partition
    count = (math.ceil(len(X) / DEFAULT_PARTITION_ROWS) if args.partitions is None
             else args.partitions)
    if args.partition_by == "random":
        return partition_random(len(X), count, args.seed)
    if args.partition_by == "contiguous":
        return partition_contiguous(X, count, args.dim)
    return partition_kmeans(X, count, args.seed)
