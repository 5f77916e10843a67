"""``pyrogp fit-distkernel``: fit one distributed-kernel sparse GP and save it as one file.

The SE kernel is split into J local kernels along one input (``--dim``, by default the one with the
largest range), cut at data quantiles; each local GP gets m inducing inputs. The fit itself
(standardisation, initial lengthscale, cuts, training) is
:func:`pyrogp_models.inference.distributed_kernel_fit.fit_distributed_kernel`: a Gaussian mean-field
fit runs L-BFGS on the collapsed bound (q solved at every step); other settings run Pyro SVI.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import torch
from pyrogp_models.inference.commands.common import check_output_file, one_line_warnings
from pyrogp_models.inference.commands.fit_local import _feature_names
from pyrogp_models.inference.distributed_kernel_fit import (
    COLLAPSED_CONFIG,
    SVI_CONFIG,
    DistributedKernelSpec,
    default_config,
    fit_distributed_kernel,
)

from pyrogp_models.data import load_table, split_features_target
from pyrogp_models.errors import DataError
from pyrogp_models.models.distributed_kernel.files import FORMAT, save_distributed_kernel
from pyrogp_models.models.distributed_kernel.model import VARIATIONAL

NAME = "fit-distkernel"
HELP = "fit a distributed-kernel sparse GP (a sum of local GPs) and save it as one file"

#: Likelihoods with one latent function (the distributed kernel models one function).
SINGLE_LATENT_LIKELIHOODS = ("gaussian", "bernoulli", "poisson")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("data", metavar="DATA", type=Path, help="CSV (with header) or .npz")
    parser.add_argument("--target", required=True, help="the column to predict")
    parser.add_argument("--features", help="comma-separated feature columns (default: every "
                                           "column but the target)")
    parser.add_argument("--regions", type=int, required=True, metavar="J",
                        help="number of regions (local GPs)")
    parser.add_argument("--inducing-per-region", type=int, required=True, metavar="M",
                        help="inducing inputs per region")
    parser.add_argument("--dim", type=int, help="input dimension to cut into regions (default: "
                                                "the one with the largest range)")
    parser.add_argument("--variational", default="meanfield", choices=VARIATIONAL,
                        help="q factorised over regions, or one joint q (default: meanfield)")
    parser.add_argument("--likelihood", default="gaussian", choices=SINGLE_LATENT_LIKELIHOODS,
                        help="observation model (default: gaussian)")
    parser.add_argument("--link", help="bernoulli: logit|probit")
    parser.add_argument("--ard", action="store_true", help="one lengthscale per input")
    parser.add_argument("--steps", type=int, metavar="N",
                        help="maximum optimiser steps; the fit stops earlier once converged "
                             f"(default: {COLLAPSED_CONFIG.steps} L-BFGS steps on the collapsed "
                             f"bound for gaussian meanfield, {SVI_CONFIG.steps} Adam steps "
                             "otherwise)")
    parser.add_argument("--lr", type=float, metavar="LR",
                        help="Adam learning rate where the fit runs Adam (default: "
                             f"{SVI_CONFIG.lr:g})")
    parser.add_argument("--seed", type=int, default=SVI_CONFIG.seed)
    parser.add_argument("--float32", action="store_true", help="fit in single precision")
    parser.add_argument("--time-budget", type=float, metavar="S",
                        help="stop after S seconds of optimisation")
    parser.add_argument("--out", required=True, type=Path, metavar="FILE",
                        help="the file to write (e.g. model.safetensors)")


def run(args: argparse.Namespace) -> int:
    _check_settings(args)
    check_output_file(args.out, FORMAT)
    table = load_table(args.data)
    features = _feature_names(table, args.target, args.features, None)
    X, y = split_features_target(table, args.target, features)
    spec = DistributedKernelSpec(
        args.regions, args.inducing_per_region, dim=args.dim, variational=args.variational,
        likelihood=args.likelihood,
        likelihood_options={} if args.link is None else {"link": args.link}, ard=args.ard,
        info={"features": features, "target": args.target},
        dtype=torch.float32 if args.float32 else torch.float64)
    config = default_config(spec.method)
    config = replace(config, steps=args.steps or config.steps, lr=args.lr or config.lr,
                     seed=args.seed, time_budget=args.time_budget)
    with one_line_warnings("raise --steps"):
        fit = fit_distributed_kernel((X, y), spec, config)
    path = save_distributed_kernel(fit.predictor, args.out)
    print(fit.predictor.describe())
    status = "converged" if fit.result.converged else "not converged"
    print(f"\n{fit.result.steps} steps ({spec.method}), {status}, in {fit.result.seconds:.1f} s; "
          f"written to {path}")
    return 0


def _check_settings(args: argparse.Namespace) -> None:
    positive = {"--regions": args.regions, "--inducing-per-region": args.inducing_per_region,
                "--steps": args.steps, "--lr": args.lr, "--time-budget": args.time_budget}
    for flag, value in positive.items():
        if value is not None and not value > 0:
            raise DataError(f"{flag} must be positive, got {value}")
    if args.link is not None and args.likelihood != "bernoulli":
        raise DataError(f"--link applies to the bernoulli likelihood, not {args.likelihood}")
