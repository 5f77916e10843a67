"""``pyrogp fit-multitask``: fit a multitask (deep) GP on a table of several tasks and save it as
one file (:mod:`pyrogp_models.models.multitask.files`).

The table is in long form (a task column and one target) or wide form (one target per task,
NaN cells unobserved): :mod:`pyrogp_models.inference.commands.multitask_inputs`. The fit itself is
:func:`pyrogp_models.inference.multitask_fit.fit_multitask_dgp` (Boustati et al.'s doubly-stochastic
ELBO, eq. 9, trained by Adam).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from pyrogp_models.inference.commands.common import check_output_file, one_line_warnings
from pyrogp_models.inference.commands.fit_local import _likelihood_options
from pyrogp_models.inference.commands.multitask_inputs import TaskColumns, TaskRows
from pyrogp_models.inference.multitask_fit import MultitaskSpec, default_config, fit_multitask_dgp
from pyrogp_models.inference.tables import format_table
from pyrogp_models.inference.trainer import TrainConfig, TrainResult

from pyrogp_models.data import load_table
from pyrogp_models.errors import DataError
from pyrogp_models.likelihoods import make_likelihood
from pyrogp_models.models.multitask import MultitaskOptions
from pyrogp_models.models.multitask.families import SUMMARIES
from pyrogp_models.models.multitask.files import FORMAT, save_multitask

NAME = "fit-multitask"
HELP = "fit a multitask (deep) GP on several tasks and save it as one file"

LIKELIHOOD_NAMES = ("gaussian", "bernoulli", "categorical")
#: Which kinds take --shared and --private, and the option each sets.
WIDTH_OPTIONS = {"--shared": {"smdgp": "shared_width", "mmdgp": "shared_width",
                              "cmdgp": "inner_width"},
                 "--private": {"mmdgp": "private_width", "idgp": "private_width"}}
DEFAULT_OPTIONS = MultitaskOptions()
DEFAULT_TRAINING = TrainConfig()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "models:\n" + "\n".join(f"  {kind:<6}  {summary}"
                                            for kind, summary in SUMMARIES.items())
    parser.add_argument("data", metavar="DATA", type=Path, help="CSV (with header) or .npz")
    parser.add_argument("--target", required=True, nargs="+", metavar="COL",
                        help="the target column (long form, with --task-column), or one column "
                             "per task (wide form: a NaN cell is an unobserved output)")
    parser.add_argument("--task-column", metavar="T",
                        help="the column naming each row's task (long form)")
    parser.add_argument("--features", help="comma-separated feature columns (default: every "
                                           "column but the target(s) and the task column)")
    parser.add_argument("--model", default="smdgp", choices=list(SUMMARIES),
                        help="the model, see below (default: smdgp)")
    parser.add_argument("--likelihood", default="gaussian", choices=LIKELIHOOD_NAMES,
                        help="observation model of every task (default: gaussian)")
    parser.add_argument("--classes", type=int, metavar="C",
                        help="number of classes for categorical (default: largest label + 1)")
    parser.add_argument("--link", help="bernoulli: logit|probit; categorical: softmax|robustmax")
    parser.add_argument("--shared", type=int, metavar="W",
                        help="width of the shared latent processes (smdgp, mmdgp) or of the "
                             "coregionalised latent space (cmdgp) (default: the number of "
                             "inputs clipped to [2, 10]; half of it for mmdgp)")
    parser.add_argument("--private", type=int, metavar="W",
                        help="width of every task's private latent process (mmdgp, idgp) "
                             "(default: as for --shared, the other half for mmdgp)")
    parser.add_argument("--inducing", type=int, default=DEFAULT_OPTIONS.num_inducing,
                        metavar="M", help="inducing inputs per task "
                                          f"(default: {DEFAULT_OPTIONS.num_inducing})")
    parser.add_argument("--steps", type=int, default=DEFAULT_TRAINING.steps, metavar="N",
                        help=f"maximum Adam steps; the fit stops earlier once converged "
                             f"(default: {DEFAULT_TRAINING.steps}; igp and cgp add a unit "
                             "natural-gradient step on q(u) before each)")
    parser.add_argument("--lr", type=float, default=DEFAULT_TRAINING.lr,
                        help=f"Adam learning rate (default: {DEFAULT_TRAINING.lr:g})")
    parser.add_argument("--seed", type=int, default=DEFAULT_TRAINING.seed,
                        help=f"seed of the initialisation and training draws "
                             f"(default: {DEFAULT_TRAINING.seed})")
    parser.add_argument("--out", required=True, type=Path, metavar="FILE",
                        help="the file to write (e.g. model.safetensors)")


def run(args: argparse.Namespace) -> int:
    options = _model_options(args)
    check_output_file(args.out, FORMAT)
    table = load_table(args.data)
    features = None if args.features is None else _feature_list(args.features)
    columns = TaskColumns.of_table(table, args.target, args.task_column, features)
    rows = columns.observations(table)
    counts = np.bincount(rows.task, minlength=len(columns.tasks)).tolist()
    empty = [name for name, count in zip(columns.tasks, counts, strict=True) if count == 0]
    if empty:
        raise DataError(f"task {', '.join(empty)} has no rows: its target column holds no value")
    options["likelihood_options"] = _likelihood_options(args, rows.y)
    _check_labels(args.likelihood, options["likelihood_options"], rows, columns)
    spec = MultitaskSpec(model=args.model, likelihood=args.likelihood, **options)
    config = replace(default_config(spec), steps=args.steps, lr=args.lr, seed=args.seed,
                     progress=sys.stderr.isatty())
    start = time.perf_counter()
    with one_line_warnings("raise --steps"):
        fit = fit_multitask_dgp((rows.X, rows.task, rows.y), spec, config)
    seconds = time.perf_counter() - start
    elbo = final_elbo(fit.result, config.window)
    fit.predictor.info = {**columns.to_info(), "num_data": counts, "elbo": elbo,
                          "steps": fit.result.steps, "converged": fit.result.converged}
    path = save_multitask(fit.predictor, args.out)
    print(format_table(["task", "N"], list(zip(columns.tasks, counts, strict=True))))
    status = "converged" if fit.result.converged else "not converged"
    print(f"\n{args.model}, {len(columns.tasks)} tasks: ELBO {elbo:.6g} (mean of the last "
          f"{min(config.window, fit.result.steps)} steps), {fit.result.steps} steps, {status}, "
          f"{seconds:.1f} s; written to {path}")
    return 0


def final_elbo(result: TrainResult, window: int) -> float:
    """The ELBO at the end of training: minus the mean loss of the last ``window`` steps (one
    step's doubly-stochastic estimate is noisy)."""
    return -float(np.mean(result.losses[-window:]))


def _model_options(args: argparse.Namespace) -> dict:
    """The architecture the flags ask for (as :class:`MultitaskSpec` keywords), checked."""
    positive = {"--inducing": args.inducing, "--steps": args.steps, "--lr": args.lr,
                "--shared": args.shared, "--private": args.private, "--classes": args.classes}
    for flag, value in positive.items():
        if value is not None and not value > 0:
            raise DataError(f"{flag} must be positive, got {value:g}")
    options = {"num_inducing": args.inducing}
    for flag, value in (("--shared", args.shared), ("--private", args.private)):
        targets = WIDTH_OPTIONS[flag]
        if value is not None:
            if args.model not in targets:
                raise DataError(f"{flag} applies to {', '.join(targets)}, not {args.model}")
            options[targets[args.model]] = value
    return options


def _feature_list(text: str) -> list[str]:
    features = [name.strip() for name in text.split(",")]
    if not all(features):
        raise DataError(f"--features has an empty column name: '{text}'")
    return features


def _check_labels(likelihood: str, options: dict, rows: TaskRows, columns: TaskColumns) -> None:
    """Every task's targets fit the likelihood; the error names the column and task."""
    check = make_likelihood(likelihood, (), torch.float64, None, **options).validate_targets
    for t, name in enumerate(columns.tasks):
        try:
            check(torch.as_tensor(rows.y[rows.task == t]))
        except DataError as error:
            where = (f"column '{columns.targets[0]}', task {name}" if columns.is_long
                     else f"column '{name}'")
            raise DataError(f"{where}: {error}") from None
