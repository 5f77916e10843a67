"""``pyrogp fit-multitask``: fit a multitask (deep) GP on a table of several tasks and save it as
one file (:mod:`pyrogp_models.models.multitask.files`).

The table is in long form (a task column and one target) or wide form (one target per task,
NaN cells unobserved): :mod:`pyrogp_models.inference.commands.multitask_inputs`. The fit itself is
:func:`pyrogp_models.inference.multitask_fit.fit_multitask_dgp` (Boustati et al.'s doubly-stochastic
ELBO, eq. 9: L-BFGS for the single-layer models; a deep model starts from the fitted shallow
model it contains, trains by Adam and keeps the better ELBO). The file records the final ELBO and
every phase of the fit (``pyrogp info`` shows them).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pyrogp_models.inference.commands.arguments import (
    LibraryNames,
    RawDescriptionHelpFormatter,
    add_data,
    add_features,
    add_float32,
    add_seed,
)
from pyrogp_models.inference.train_config import (
    COLLAPSED_CONFIG,
    MAX_DEFAULT_TASK_INDUCING,
    MULTITASK_DEEP_CONFIG,
    MULTITASK_SHALLOW_CONFIG,
)

NAME = "fit-multitask"
HELP = "fit a multitask (deep) GP on several tasks and save it as one file"

LIKELIHOOD_NAMES = ("gaussian", "bernoulli", "categorical")
#: The architecture flags: which kinds take each, and the option it sets for each.
MODEL_OPTIONS = {"--shared": {"smdgp": "shared_width", "mmdgp": "shared_width",
                              "cmdgp": "inner_width"},
                 "--private": {"mmdgp": "private_width", "idgp": "private_width"},
                 "--coregionalisation": dict.fromkeys(("cgp", "cmdgp"), "coregionalisation"),
                 "--rank": dict.fromkeys(("cgp", "cmdgp"), "coregional_rank"),
                 "--noise": {"cgp": "noise"},
                 "--top-mean": dict.fromkeys(("smdgp", "mmdgp", "idgp"), "top_mean")}



def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = RawDescriptionHelpFormatter
    add_data(parser)
    parser.add_argument("--target", required=True, metavar="COL[,COL...]",
                        help="the target column (long form, with --task-column), or one column "
                             "per task, comma-separated (wide form: a NaN cell is an unobserved "
                             "output)")
    parser.add_argument("--task-column", metavar="T",
                        help="the column naming each row's task (long form)")
    add_features(parser, "the target(s) and the task column")
    parser.add_argument("--model", default="cgp", metavar="MODEL",
                        choices=LibraryNames("pyrogp_models.models.multitask.families:SUMMARIES"),
                        help="the model: cgp (coregionalised GP), smdgp, mmdgp or cmdgp "
                             "(multitask deep GPs), idgp or igp (independent); the "
                             "documentation describes each (default: cgp, the one that "
                             "transferred best on real data)")
    parser.add_argument("--likelihood", default="gaussian", choices=LIKELIHOOD_NAMES,
                        help="observation model of every task (default: gaussian)")
    parser.add_argument("--classes", type=int, metavar="C",
                        help="number of classes for categorical (default: largest label + 1)")
    parser.add_argument("--link", help="bernoulli: logit|probit; categorical: softmax|robustmax")
    parser.add_argument("--shared", type=int, metavar="W",
                        help="width of the shared latent processes (smdgp, mmdgp) or of the "
                             "coregionalised latent space (cmdgp) (default: the number of "
                             "inputs clipped to [2, 10]; mmdgp starts with one task's latent "
                             "in a shared column beyond the inputs, so a --shared above the "
                             "number of inputs gives it one)")
    parser.add_argument("--private", type=int, metavar="W",
                        help="width of every task's private latent process (mmdgp, idgp) "
                             "(default: as for --shared)")
    parser.add_argument("--coregionalisation", metavar="icm|lmc", choices=LibraryNames(
                            "pyrogp_models.models.multitask.options:COREGIONALISATIONS"),
                        help="cgp, cmdgp: the mixed latent GPs share one kernel (icm) or each "
                             "has its own (lmc: slow and fast co-variation together) "
                             "(default: lmc)")
    parser.add_argument("--rank", type=int, metavar="R",
                        help="cgp, cmdgp: latent GPs mixed into every output (default: 2; "
                             "with more than 2 tasks cgp also fits one per task, with 2M/T "
                             "inducing inputs each at fixed k-means centres, and keeps the "
                             "rank that predicts stretches of the outputs with gaps best, "
                             "refitted without them, given the other outputs)")
    parser.add_argument("--noise", metavar="correlated|independent", choices=LibraryNames(
                            "pyrogp_models.models.multitask.options:NOISES"),
                        help="cgp: the noise of the outputs observed at one input is correlated "
                             "(learned; a hidden output's prediction then uses the outputs "
                             "observed next to it) or independent (default: with the gaussian "
                             "likelihood cgp fits both and keeps the one that predicts held-out "
                             "stretches best, as for --rank)")
    parser.add_argument("--top-mean", metavar="linear|zero", choices=LibraryNames(
                            "pyrogp_models.models.multitask.options:TOP_MEANS"),
                        help="smdgp, mmdgp, idgp: every task's top GP has a learned linear "
                             "mean on the latent space, without a prior (linear: the tasks' "
                             "linear coregionalisation inside the deep model) or none, the "
                             "paper's (zero) (default: linear with the gaussian likelihood, "
                             "zero for a classifier, whose linear mean of the logits "
                             "diverges where the classes are linearly separable)")
    parser.add_argument("--inducing", type=int, metavar="M",
                        help="inducing inputs of every process (each task's top GP, private "
                             "and shared processes, each latent GP of cgp): the same budget in "
                             "every model (default: the rows of the largest task, all of them "
                             f"up to {MAX_DEFAULT_TASK_INDUCING}); where igp or cgp then has "
                             "every input as an inducing input it is the exact GP, and they "
                             "stay fixed")
    parser.add_argument("--steps", type=int, metavar="N",
                        help="maximum optimiser steps of the model; the fit stops earlier once "
                             f"converged (default: {COLLAPSED_CONFIG.steps} L-BFGS iterations "
                             "for a gaussian igp, one evaluation each, "
                             f"{MULTITASK_SHALLOW_CONFIG.steps} L-BFGS steps of up to 20 "
                             f"iterations for cgp, {MULTITASK_DEEP_CONFIG.steps} Adam steps for "
                             "the deep models, which first fit the shallow model they contain — "
                             "igp, cgp for cmdgp — start from it and keep the better ELBO)")
    parser.add_argument("--lr", type=float, metavar="LR",
                        help=f"learning rate (default: {MULTITASK_DEEP_CONFIG.lr:g} for Adam, "
                             f"{MULTITASK_SHALLOW_CONFIG.lr:g} for L-BFGS)")
    add_seed(parser, "the initialisation and training draws", MULTITASK_DEEP_CONFIG.seed)
    add_float32(parser)
    parser.add_argument("--out", required=True, type=Path, metavar="FILE",
                        help="the file to write (e.g. model.safetensors)")


def epilog() -> str:
    """One line per model, from the library (for the documentation: importing the models
    would slow the help down)."""
    from pyrogp_models.models.multitask.families import SUMMARIES

    return "models:\n" + "\n".join(f"  {kind:<6}  {summary}" for kind, summary in
                                   SUMMARIES.items())


def run(args: argparse.Namespace) -> int:
    import sys
    from dataclasses import replace

    import numpy as np
    import torch
    from pyrogp_models.inference.commands.common import (
        check_output,
        column_list,
        likelihood_options,
        one_line_warnings,
    )
    from pyrogp_models.inference.commands.multitask_inputs import TaskColumns
    from pyrogp_models.inference.multitask_fit import (
        MultitaskSpec,
        default_config,
        fit_multitask_dgp,
    )

    from pyrogp_models.data import load_table
    from pyrogp_models.errors import DataError
    from pyrogp_models.models.multitask.files import MULTITASK_FILE, save_multitask
    from pyrogp_models.text import format_table

    options = _model_options(args)
    check_output(args.out, MULTITASK_FILE.name)
    table = load_table(args.data)
    features = None if args.features is None else column_list(args.features, "--features")
    columns = TaskColumns.of_table(table, column_list(args.target, "--target"),
                                   args.task_column, features)
    rows = columns.observations(table)
    counts = np.bincount(rows.task, minlength=len(columns.tasks)).tolist()
    empty = [name for name, count in zip(columns.tasks, counts, strict=True) if count == 0]
    if empty:
        raise DataError(f"task {', '.join(empty)} has no rows: its target column holds no value")
    options["likelihood_options"] = likelihood_options(args, rows.y)
    _check_labels(args.likelihood, options["likelihood_options"], rows, columns)
    spec = MultitaskSpec(model=args.model, likelihood=args.likelihood,
                         dtype=torch.float32 if args.float32 else torch.float64, **options)
    config = default_config(spec)
    config = replace(config, steps=config.steps if args.steps is None else args.steps,
                     lr=config.lr if args.lr is None else args.lr, seed=args.seed,
                     progress=sys.stderr.isatty())
    with one_line_warnings("raise --steps"):
        fit = fit_multitask_dgp((rows.X, rows.task, rows.y), spec, config)
    fit.predictor.info = {**columns.to_info(), "num_data": counts, **fit.summary()}
    path = save_multitask(fit.predictor, args.out)
    print(format_table(["task", "N"], list(zip(columns.tasks, counts, strict=True))))
    held_out = ["held-out MSE"] if any(phase.held_out is not None for phase in fit.phases) else []
    print("\n" + format_table(
        ["phase", "steps", "seconds", "converged", "ELBO", *held_out],
        [(phase.model, *((phase.steps, f"{phase.seconds:.1f}", _converged(phase),
                          f"{phase.elbo:.6g}") if phase.elbo is not None else ["—"] * 4),
          *([_held_out(phase)] if held_out else []))
         for phase in fit.phases]))
    kept = "" if fit.kept == args.model else f" (kept at the {fit.kept} it contains)"
    rank = (f", R = {fit.model.options.coregional_rank}"
            if args.model in ("cgp", "cmdgp") else "")
    if args.model == "cgp":
        rank += f", {fit.model.options.noise} noise"
    print(f"\n{args.model}, {len(columns.tasks)} tasks, M = {fit.spec.num_inducing}{rank}: ELBO "
          f"{fit.elbo:.6g}{kept}, {fit.steps} steps, "
          f"{'converged' if fit.converged else 'not converged'}, {fit.training_seconds:.1f} s of "
          f"training, {fit.seconds:.1f} s in all; "
          f"written to {path}")
    return 0


def _held_out(phase) -> str:
    """A candidate's held-out MSE; "dropped" where a fit to its folds failed."""
    from pyrogp_models.models.multitask.description import dropped

    if phase.held_out is not None:
        return f"{phase.held_out:.4g}"
    return "dropped" if dropped(phase.elbo, phase.held_out) else "—"


def _converged(phase) -> str:
    """"yes", "no", or where the loss rose "yes (back to step N)" (``TrainConfig.patience``)."""
    if not phase.converged:
        return "no"
    return "yes" if phase.returned_to is None else f"yes (back to step {phase.returned_to})"


def _model_options(args: argparse.Namespace) -> dict:
    """The architecture the flags ask for (as :class:`MultitaskSpec` keywords), checked."""
    from pyrogp_models.errors import DataError

    positive = {"--inducing": args.inducing, "--steps": args.steps, "--lr": args.lr,
                "--shared": args.shared, "--private": args.private, "--classes": args.classes,
                "--rank": args.rank}
    for flag, value in positive.items():
        if value is not None and not value > 0:
            raise DataError(f"{flag} must be positive, got {value:g}")
    options = {} if args.inducing is None else {"num_inducing": args.inducing}
    for flag, targets in MODEL_OPTIONS.items():
        value = getattr(args, flag.removeprefix("--").replace("-", "_"))
        if value is not None:
            if args.model not in targets:
                raise DataError(f"{flag} applies to {', '.join(targets)}, not {args.model}")
            options[targets[args.model]] = value
    return options


def _check_labels(likelihood: str, options: dict, rows, columns) -> None:
    """Every task's targets fit the likelihood (``rows``, ``columns``: the table's
    :class:`~pyrogp_models.inference.commands.multitask_inputs.TaskRows` and ``TaskColumns``);
    the error names the column and task."""
    import torch

    from pyrogp_models.errors import DataError
    from pyrogp_models.likelihoods import make_likelihood

    check = make_likelihood(likelihood, (), torch.float64, None, **options).validate_targets
    for t, name in enumerate(columns.tasks):
        try:
            check(torch.as_tensor(rows.y[rows.task == t]))
        except DataError as error:
            where = (f"column '{columns.targets[0]}', task {name}" if columns.is_long
                     else f"column '{name}'")
            raise DataError(f"{where}: {error}") from None
