"""``pyrogp fit-distkernel``: fit one distributed-kernel sparse GP and save it as one file.

The SE kernel is split into J local kernels along one input (``--dim``, by default the one with the
largest range, outliers aside), cut at data quantiles; each local GP gets m inducing inputs (by
default one region per 3200 rows,
:func:`~pyrogp_models.inference.distributed_kernel_fit.default_layout`). The fit itself
(standardisation, initial lengthscale, cuts, training) is
:func:`pyrogp_models.inference.distributed_kernel_fit.fit_distributed_kernel`: a Gaussian mean-field
fit runs L-BFGS on the collapsed bound (q solved at every step); other settings run Pyro SVI.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pyrogp_models.inference.commands.arguments import (
    LibraryNames,
    add_data,
    add_features,
    add_float32,
    add_seed,
    add_units,
)
from pyrogp_models.inference.train_config import (
    DEFAULT_REGION_ROWS,
    DISTRIBUTED_KERNEL_COLLAPSED_CONFIG,
    DISTRIBUTED_KERNEL_RESTARTS,
    DISTRIBUTED_KERNEL_SVI_CONFIG,
    MAX_DEFAULT_INDUCING,
    MIN_DEFAULT_INDUCING_PER_REGION,
)

NAME = "fit-distkernel"
HELP = "fit a distributed-kernel sparse GP (a sum of local GPs) and save it as one file"

#: Likelihoods with one latent function (the distributed kernel models one function).
SINGLE_LATENT_LIKELIHOODS = ("gaussian", "bernoulli", "poisson")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_data(parser)
    parser.add_argument("--target", required=True, help="the column to predict")
    add_features(parser)
    add_units(parser)
    parser.add_argument("--regions", type=int, metavar="J",
                        help="number of regions (local GPs) (default: one per "
                             f"{DEFAULT_REGION_ROWS} rows)")
    parser.add_argument("--inducing-per-region", type=int, metavar="M",
                        help="inducing inputs per region (default: a local fit's M, at most "
                             f"{MAX_DEFAULT_INDUCING}, shared among the regions, at least "
                             f"{MIN_DEFAULT_INDUCING_PER_REGION} each and at most half a "
                             "region's rows)")
    parser.add_argument("--dim", type=int,
                        help="input dimension to cut into regions (default: the one with the "
                             "largest range, outliers aside)")
    parser.add_argument("--variational", default="meanfield", metavar="meanfield|joint",
                        choices=LibraryNames(
                            "pyrogp_models.models.distributed_kernel.model:VARIATIONAL"),
                        help="q factorised over regions, or one joint q (default: meanfield)")
    parser.add_argument("--likelihood", default="gaussian", choices=SINGLE_LATENT_LIKELIHOODS,
                        help="observation model (default: gaussian)")
    parser.add_argument("--link", help="bernoulli: logit|probit")
    parser.add_argument("--ard", action=argparse.BooleanOptionalAction,
                        help="one lengthscale per input (default: with more than one input, "
                             "whose cut one needs a lengthscale short enough for its regions "
                             "to be local)")
    parser.add_argument("--steps", type=int, metavar="N",
                        help="maximum optimiser steps; the fit stops earlier once converged "
                             f"(default: {DISTRIBUTED_KERNEL_COLLAPSED_CONFIG.steps} L-BFGS steps "
                             "on the collapsed bound for gaussian meanfield, "
                             f"{DISTRIBUTED_KERNEL_SVI_CONFIG.steps} Adam steps otherwise)")
    parser.add_argument("--restarts", type=int, metavar="R",
                        help="fit from R initial lengthscales (the rule's, then shorter down to "
                             "a quarter of it) and keep the best ELBO (default: "
                             f"{DISTRIBUTED_KERNEL_RESTARTS} on the collapsed bound of a "
                             "gaussian meanfield fit, 1 otherwise and with --time-budget, "
                             "which belongs to one training)")
    parser.add_argument("--lr", type=float, metavar="LR",
                        help="Adam learning rate where the fit runs Adam (default: "
                             f"{DISTRIBUTED_KERNEL_SVI_CONFIG.lr:g})")
    add_seed(parser, "the inducing inputs and the training draws",
             DISTRIBUTED_KERNEL_SVI_CONFIG.seed)
    add_float32(parser)
    parser.add_argument("--time-budget", type=float, metavar="S",
                        help="stop after S seconds of optimisation")
    parser.add_argument("--out", required=True, type=Path, metavar="FILE",
                        help="the file to write (e.g. model.safetensors)")


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    import torch
    from pyrogp_models.inference.commands.common import (
        check_output,
        data_columns,
        feature_columns,
        one_line_warnings,
    )
    from pyrogp_models.inference.distributed_kernel_fit import (
        DistributedKernelSpec,
        default_config,
        fit_distributed_kernel,
    )

    from pyrogp_models.data import load_table, split_features_target
    from pyrogp_models.models.distributed_kernel.files import (
        DISTRIBUTED_KERNEL_FILE,
        save_distributed_kernel,
    )

    _check_settings(args)
    check_output(args.out, DISTRIBUTED_KERNEL_FILE.name)
    table = load_table(args.data)
    features = feature_columns(table, [args.target], args.features)
    X, y = split_features_target(table, args.target, features)
    spec = DistributedKernelSpec(
        args.regions, args.inducing_per_region, dim=args.dim, variational=args.variational,
        likelihood=args.likelihood,
        likelihood_options={} if args.link is None else {"link": args.link}, ard=args.ard,
        restarts=args.restarts, columns=data_columns(features, args.target, args.units),
        dtype=torch.float32 if args.float32 else torch.float64)
    config = default_config(spec.method)
    config = replace(config, steps=args.steps or config.steps, lr=args.lr or config.lr,
                     seed=args.seed, time_budget=args.time_budget)
    with one_line_warnings("raise --steps"):
        fit = fit_distributed_kernel((X, y), spec, config)
    path = save_distributed_kernel(fit.predictor, args.out)
    print(fit.predictor.describe())
    if len(fit.starts) > 1:
        print("starts: " + ", ".join(
            f"lengthscale × {start.factor:.3g} ELBO {start.elbo:.6g}"
            f"{' (kept)' if i == fit.kept_start else ''}" for i, start in enumerate(fit.starts)))
    status = "converged" if fit.result.converged else "not converged"
    seconds = sum(start.seconds for start in fit.starts)
    print(f"\n{fit.result.steps} steps ({spec.method}), {status}, in {seconds:.1f} s"
          f"{f' ({len(fit.starts)} starts)' if len(fit.starts) > 1 else ''}; written to {path}")
    return 0


def _check_settings(args: argparse.Namespace) -> None:
    from pyrogp_models.errors import DataError

    positive = {"--regions": args.regions, "--inducing-per-region": args.inducing_per_region,
                "--steps": args.steps, "--lr": args.lr, "--time-budget": args.time_budget}
    for flag, value in positive.items():
        if value is not None and not value > 0:
            raise DataError(f"{flag} must be positive, got {value}")
    if args.link is not None and args.likelihood != "bernoulli":
        raise DataError(f"--link applies to the bernoulli likelihood, not {args.likelihood}")
