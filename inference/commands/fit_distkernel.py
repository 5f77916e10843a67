"""``pyrogp fit-distkernel``: fit one distributed-kernel sparse GP and save it as one file.

The SE kernel is split into J local kernels along one input (``--dim``, by default the one with the
largest range), cut at data quantiles; each local GP gets m inducing inputs. Inputs (and Gaussian
targets) are standardised first. The initial lengthscale is min(1, range / 4J) in standardised
units, so that every region starts at least 2ℓ wide (narrower regions are not local). A Gaussian
mean-field fit solves q in closed form at every step; other settings run Pyro SVI.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from inference.commands.fit_local import _feature_names
from inference.distributed_kernel_fit import DistributedKernelFitConfig, fit_distributed_kernel
from pyrogp_models.data import Standardisation, load_table, split_features_target
from pyrogp_models.errors import DataError
from pyrogp_models.likelihoods import LIKELIHOODS
from pyrogp_models.models.distributed_kernel.construct import build_distributed_kernel_gp
from pyrogp_models.models.distributed_kernel.files import (
    DistributedKernelPredictor,
    is_distributed_kernel_file,
    save_distributed_kernel,
)
from pyrogp_models.models.distributed_kernel.model import VARIATIONAL, DistributedKernelGP
from pyrogp_models.models.distributed_kernel.regions import Regions, quantile_cuts, split_dimension

NAME = "fit-distkernel"
HELP = "fit a distributed-kernel sparse GP (a sum of local GPs) and save it as one file"

#: Likelihoods with one latent function (the distributed kernel models one function).
SINGLE_LATENT_LIKELIHOODS = ("gaussian", "bernoulli", "poisson")
#: Each region starts at least this many initial lengthscales wide.
MIN_WIDTH = 2.0


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
    parser.add_argument("--steps", type=int, default=300, help="maximum optimiser steps")
    parser.add_argument("--lr", type=float, default=0.05, help="Adam learning rate")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-budget", type=float, metavar="S",
                        help="stop after S seconds of optimisation")
    parser.add_argument("--out", required=True, type=Path, metavar="FILE",
                        help="the file to write (e.g. model.safetensors)")


def run(args: argparse.Namespace) -> int:
    _check_settings(args)
    _check_output(args.out)
    table = load_table(args.data)
    features = _feature_names(table, args.target, args.features, None)
    X, y = split_features_target(table, args.target, features)
    if args.regions > len(y):
        raise DataError(f"--regions {args.regions} is more than the {len(y)} data points")
    standardisation = Standardisation.fit(X, y, LIKELIHOODS[args.likelihood].standardise_targets)
    Xs = torch.as_tensor(standardisation.transform_x(X))
    ys = torch.as_tensor(standardisation.transform_y(y))
    model = _build_model(args, Xs, features)
    model.likelihood.validate_targets(ys)

    gaussian_meanfield = args.likelihood == "gaussian" and args.variational == "meanfield"
    config = DistributedKernelFitConfig(method="solve" if gaussian_meanfield else "svi",
                                        steps=args.steps, lr=args.lr, seed=args.seed,
                                        time_budget=args.time_budget)
    start = time.perf_counter()
    result = fit_distributed_kernel(model, Xs, ys, config)
    seconds = time.perf_counter() - start
    with torch.no_grad():
        elbo = float(model.elbo(Xs, ys))
    model.requires_grad_(False)
    predictor = DistributedKernelPredictor(model, standardisation, len(y), elbo,
                                           {"features": features, "target": args.target})
    path = save_distributed_kernel(predictor, args.out)
    print(predictor.describe())
    print(f"\n{result.steps} steps ({config.method}) in {seconds:.1f} s; written to {path}")
    return 0


def _build_model(args: argparse.Namespace, Xs: torch.Tensor,
                 features: list[str]) -> DistributedKernelGP:
    """The unfitted model on standardised inputs: J regions cut at quantiles along one input."""
    num_regions, input_dim = args.regions, Xs.shape[1]
    if args.dim is not None and not 0 <= args.dim < input_dim:
        raise DataError(f"--dim {args.dim} is not an input dimension (0 to {input_dim - 1})")
    dim = split_dimension(Xs, Xs.new_ones(1)) if args.dim is None else args.dim
    span = float(Xs[:, dim].max() - Xs[:, dim].min())
    if num_regions > 1 and span == 0:
        raise DataError(f"column '{features[dim]}' is constant and cannot be cut into regions")
    lengthscale = min(1.0, span / (2 * MIN_WIDTH * num_regions)) if num_regions > 1 else 1.0
    regions = Regions.from_cuts(quantile_cuts(Xs[:, dim], num_regions, MIN_WIDTH * lengthscale),
                                input_dim=input_dim, dim=dim, dtype=Xs.dtype)
    options = {} if args.link is None else {"link": args.link}
    return build_distributed_kernel_gp(
        Xs, num_regions, args.inducing_per_region, lengthscale=lengthscale,
        likelihood=args.likelihood, variational=args.variational, ard=args.ard,
        regions=regions, **options)


def _check_settings(args: argparse.Namespace) -> None:
    positive = {"--regions": args.regions, "--inducing-per-region": args.inducing_per_region,
                "--steps": args.steps, "--lr": args.lr, "--time-budget": args.time_budget}
    for flag, value in positive.items():
        if value is not None and not value > 0:
            raise DataError(f"{flag} must be positive, got {value}")
    if args.link is not None and args.likelihood != "bernoulli":
        raise DataError(f"--link applies to the bernoulli likelihood, not {args.likelihood}")


def _check_output(path: Path) -> None:
    """A new file in an existing folder, or an old distributed-kernel file to replace."""
    if not path.parent.is_dir():
        raise DataError(f"{path}: the output folder {path.parent} does not exist")
    if path.is_dir():
        raise DataError(f"{path} is a folder; --out needs a file name")
    if path.exists() and not is_distributed_kernel_file(path):
        raise DataError(f"output {path} exists and is not a distributed-kernel file; refusing "
                        "to overwrite it (choose another --out)")
