"""The benchmark guard: a quick subset of every benchmark, compared with its committed figures.

Each check times one operation of a benchmark — the meta-GP objective at K = 1000 and 5000, one
objective of the batched local fits at K = 1000, one distributed-kernel objective, one multitask
ELBO, one multitask classifier's ELBO, one coregionalised GP's collapsed bound, the command-line
pipeline at 10⁵ points — in rounds, each bracketed by the reference operation (:mod:`_reference`)
timed just before and just after it. Its *figure* is the median over rounds of (operation time /
reference time), so a slower or busier machine does not read as a regression; times are CPU
seconds of this process and its finished children (one torch thread: CPU time is what the work
cost, whatever else the machine runs). The figures are compared with
``benchmarks/results/bench_check.json``: a check whose figure grew beyond ``--tolerance`` (1.5×)
fails the run (exit status 1).

Usage::

    python benchmarks/bench_check.py                # check (make bench-check), ~3 minutes
    python benchmarks/bench_check.py --update       # measure and write the committed figures
    python benchmarks/bench_check.py --only meta_gp_k5000_bound local_fit_k1000

Run it before every commit that touches a model; after an intended change of cost, rerun with
``--update`` and commit the JSON with the change.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _common import (  # noqa: E402
    RESULTS_DIR,
    format_seconds,
    load_average,
    machine_info,
    median,
    print_table,
    write_json,
)
from _reference import reference_operation  # noqa: E402

BASELINE = RESULTS_DIR / "bench_check.json"
#: A check fails when its figure exceeds the committed one by more than this factor.
TOLERANCE = 1.5
#: Each timed stretch repeats its operation until it lasts about this long (CPU seconds).
STRETCH_SECONDS = 0.1


def cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and of its finished child processes."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


@dataclass(frozen=True)
class Check:
    """One guarded operation: ``setup`` builds its problem (not timed) and returns the
    operation; ``rounds`` alternations with the reference."""

    name: str
    benchmark: str  # the benchmark script the operation samples
    description: str
    setup: Callable[[], Callable[[], object]]
    rounds: int = 7


@dataclass(frozen=True)
class Measurement:
    seconds: float  # median per operation
    reference_seconds: float  # median per reference operation
    figure: float  # median over rounds of the per-round ratio
    figures: list[float]


def _timed(operation: Callable[[], object], number: int, clock: Callable[[], float]) -> float:
    start = clock()
    for _ in range(number):
        operation()
    return (clock() - start) / number


def measure(operation: Callable[[], object], reference: Callable[[], object], rounds: int,
            clock: Callable[[], float] = cpu_seconds) -> Measurement:
    """Time ``operation`` against ``reference`` in ``rounds`` rounds, each timing repeated to
    about :data:`STRETCH_SECONDS`. A round times the reference just before and just after the
    operation and takes the mean of the two, so that a load that changes while a long operation
    runs (the command-line pipeline takes half a minute) bears on both sides of its ratio."""
    numbers = [max(1, round(STRETCH_SECONDS / max(_timed(fn, 1, clock), 1e-9)))
               for fn in (operation, reference)]  # also the warm-up
    seconds, reference_seconds = [], []
    for _ in range(rounds):
        before = _timed(reference, numbers[1], clock)
        seconds.append(_timed(operation, numbers[0], clock))
        reference_seconds.append(0.5 * (before + _timed(reference, numbers[1], clock)))
    figures = [a / b for a, b in zip(seconds, reference_seconds, strict=True)]
    return Measurement(median(seconds), median(reference_seconds), median(figures), figures)


@dataclass(frozen=True)
class Verdict:
    name: str
    figure: float
    baseline: float | None
    ratio: float | None
    status: str  # "ok", "SLOWER", "faster" or "new"


def compare(figures: dict[str, float], baseline: dict[str, float], tolerance: float = TOLERANCE
            ) -> list[Verdict]:
    """Each measured figure against its committed one: SLOWER beyond ``tolerance``, faster
    below 1/``tolerance`` (time to update the baseline), new without a committed figure."""
    verdicts = []
    for name, figure in figures.items():
        committed = baseline.get(name)
        if committed is None:
            verdicts.append(Verdict(name, figure, None, None, "new"))
            continue
        ratio = figure / committed
        status = "SLOWER" if ratio > tolerance else "faster" if ratio < 1.0 / tolerance else "ok"
        verdicts.append(Verdict(name, figure, committed, ratio, status))
    return verdicts


# The checks ---------------------------------------------------------------------------------
@functools.cache
def _meta_modules():
    """5000 modules (M_k = 3) of the meta-GP benchmark's 10⁶-point problem, from one step of
    the local fits (q(u) at the collapsed optimum of those hyperparameters)."""
    import meta_gp

    problem = meta_gp.distributed_problem(100, 200, seed=0)
    return meta_gp.fit_modules(problem, steps=1, seed=0).modules


def _meta_objective(K: int, collapsed: bool) -> Callable[[], object]:
    import meta_gp

    from pyrogp_models.modules.stack import ModuleStack

    modules = _meta_modules()
    stack = ModuleStack.from_modules({name: modules[name] for name in list(modules)[:K]})
    meta = meta_gp._meta_for_timing(stack, 35, collapsed)
    return meta_gp._objective_calls(meta, meta)["collapsed" if collapsed else "bound"]


def _local_fit_objective(precise: bool) -> Callable[[], object]:
    import local_fit
    from pyrogp_models.inference.local_fit import LocalFitSpec

    X, y, partition = local_fit.make_problem(1000, 200, "contiguous", 0.1, seed=0)
    model = local_fit.build_model(X, y, partition, LocalFitSpec(num_inducing=8), seed=0)
    blocks = model.member_objectives(precise=precise)

    def run():
        model.zero_grad(set_to_none=True)
        sum(objective().sum() for _, objective in blocks).backward()

    return run


def _distributed_kernel_objective() -> Callable[[], object]:
    from pyrogp_models.models.distributed_kernel.construct import build_distributed_kernel_gp

    generator = torch.Generator().manual_seed(0)
    X = (torch.rand(100_000, 1, generator=generator, dtype=torch.float64) * 2000.0).sort(0).values
    y = torch.sin(X[:, 0]) + 0.1 * torch.randn(100_000, generator=generator,
                                               dtype=torch.float64)
    model = build_distributed_kernel_gp(X, 64, 10, lengthscale=1.0, noise=0.01)

    def run():
        model.zero_grad()
        (-model.elbo(X, y)).backward()

    return run


def _multitask_elbo() -> Callable[[], object]:
    import multitask_dgp

    s = multitask_dgp.FULL
    X, task, Y = multitask_dgp.make_data(s.num_points, s.input_dim, s.num_tasks)
    y = Y.gather(1, task[:, None]).squeeze(1)
    model = multitask_dgp.our_model("smdgp", X.double(), task, y.double(), s.num_tasks, s,
                                    s.batch_size)
    return multitask_dgp.elbo_and_gradient(model)


def _multitask_classifier_elbo() -> Callable[[], object]:
    """The Bernoulli cGP (R = 2, the default M) of ``multitask_classifier``, untrained: one
    evaluation of its uncollapsed ELBO (Gauss–Hermite) and the gradient, what each L-BFGS
    iteration of the classifier's default fit costs."""
    import warnings
    from dataclasses import replace

    import multitask_classifier
    from pyrogp_models.inference.multitask_fit import (
        MultitaskSpec,
        default_config,
        fit_multitask_dgp,
    )

    pairs, *_ = multitask_classifier.breast_cancer_tasks(multitask_classifier.FULL)
    spec = MultitaskSpec(model="cgp", likelihood="bernoulli", coregional_rank=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no steps: "not converged"
        model = fit_multitask_dgp(pairs, spec, replace(default_config(spec), steps=0)).model

    def run():
        model.zero_grad(set_to_none=True)
        (-model.elbo()).backward()

    return run


def _multitask_cgp_collapsed() -> Callable[[], object]:
    """The Gaussian cGP (R = 2, noise correlated across the outputs at one input) of
    ``multitask_dgp``'s gilgai table with every row an inducing input (R·M = 730), untrained:
    one evaluation of its collapsed bound and the gradient, what each L-BFGS iteration of a
    default cGP fit and of every fold of its candidates' comparison costs."""
    import warnings
    from dataclasses import replace

    import multitask_dgp
    from pyrogp_models.inference.multitask_fit import (
        MultitaskSpec,
        default_config,
        fit_multitask_dgp,
    )

    X, _, Y = multitask_dgp.gilgai_table()
    pairs = [(X, Y[:, task]) for task in range(Y.shape[1])]
    spec = MultitaskSpec(model="cgp", coregional_rank=2, noise="correlated")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no steps: "not converged"
        model = fit_multitask_dgp(pairs, spec, replace(default_config(spec), steps=0)).model

    def run():
        model.zero_grad(set_to_none=True)
        with model.collapsed_objective():
            (-model.collapsed_bound()).backward()

    return run


def _cli_pipeline() -> Callable[[], object]:
    """fit-local, recycle and evaluate as the user runs them, on 10⁵ points in 500 partitions
    (the 10⁶-point benchmark at a tenth of its size)."""
    import cli_end_to_end as cli

    folder = Path(tempfile.mkdtemp(prefix="bench_check_"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    settings = cli.Settings(points=100_000, partitions=500, test_points=2000)
    train, test = cli.write_data(folder, settings)
    runs = iter(range(1_000_000))

    def run():
        out = folder / f"run{next(runs)}"
        out.mkdir()
        cli.pyrogp("fit-local", train, "--target", "y", "--partition-by", "contiguous",
                   "--partitions", settings.partitions, "--inducing", settings.local_inducing,
                   "--out", out / "modules")
        cli.pyrogp("recycle", out / "modules", "--inducing", settings.global_inducing,
                   "--out", out / "meta")
        cli.pyrogp("evaluate", out / "meta", "--data", test, "--target", "f", "--json")
        shutil.rmtree(out)

    return run


CHECKS: tuple[Check, ...] = (
    Check("meta_gp_k1000_bound", "meta_gp", "meta-GP L_E + gradient, K = 1000, M = 35",
          lambda: _meta_objective(1000, collapsed=False)),
    Check("meta_gp_k1000_collapsed", "meta_gp", "meta-GP L_E* + gradient, K = 1000, M = 35",
          lambda: _meta_objective(1000, collapsed=True)),
    Check("meta_gp_k5000_bound", "meta_gp", "meta-GP L_E + gradient, K = 5000, M = 35",
          lambda: _meta_objective(5000, collapsed=False)),
    Check("meta_gp_k5000_collapsed", "meta_gp", "meta-GP L_E* + gradient, K = 5000, M = 35",
          lambda: _meta_objective(5000, collapsed=True)),
    Check("local_fit_k1000", "local_fit",
          "local fits: objective + gradient, K = 1000, N_k = 200, M_k = 8",
          lambda: _local_fit_objective(precise=False)),
    Check("local_fit_k1000_precise", "local_fit",
          "local fits: precise objective (refine phase) + gradient, K = 1000",
          lambda: _local_fit_objective(precise=True)),
    Check("distributed_kernel_j64", "distributed_kernel",
          "distributed kernel: objective + gradient, n = 10⁵, J = 64, m = 10",
          _distributed_kernel_objective),
    Check("multitask_smdgp", "multitask_dgp", "multitask sMDGP: ELBO + gradient, batch 500",
          _multitask_elbo),
    Check("multitask_classifier_cgp", "multitask_classifier",
          "multitask classifier: Bernoulli cGP ELBO + gradient, 399 rows, R = 2",
          _multitask_classifier_elbo),
    Check("multitask_cgp_collapsed", "multitask_dgp",
          "multitask cGP: collapsed bound + gradient, 4 × 365 rows, every row inducing, R = 2",
          _multitask_cgp_collapsed),
    Check("cli_pipeline_1e5", "cli_end_to_end",
          "command line: fit-local + recycle + evaluate, 10⁵ points, 500 partitions",
          _cli_pipeline, rounds=1),
)


# Main ---------------------------------------------------------------------------------------
def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--update", action="store_true",
                        help="write the measured figures as the committed baseline")
    parser.add_argument("--only", nargs="+", metavar="CHECK", help="run only these checks")
    parser.add_argument("--baseline", type=Path, default=BASELINE, help="JSON of figures")
    parser.add_argument("--tolerance", type=float, default=TOLERANCE,
                        help="largest accepted ratio of figure to committed figure")
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds per check (default: the check's own)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None, checks: Sequence[Check] = CHECKS,
         reference: Callable[[], object] | None = None,
         clock: Callable[[], float] = cpu_seconds) -> int:
    """Measure the checks, print the table and compare (or ``--update``); the exit status."""
    args = parse_args(argv)
    torch.set_num_threads(1)
    known = {check.name: check for check in checks}
    unknown = sorted(set(args.only or ()) - set(known))
    if unknown:
        print(f"bench_check: error: unknown checks {', '.join(unknown)}; choose from "
              f"{', '.join(known)}", file=sys.stderr)
        return 2
    selected = [known[name] for name in args.only] if args.only else list(checks)
    reference = reference or reference_operation()
    measured: dict[str, tuple[Check, Measurement]] = {}
    for check in selected:
        operation = check.setup()
        measured[check.name] = (check, measure(operation, reference, args.rounds or check.rounds,
                                               clock))
        print(f"  {check.name}: {measured[check.name][1].figure:.3f} × reference", flush=True)
    committed = _read_baseline(args.baseline)
    verdicts = compare({name: m.figure for name, (_, m) in measured.items()}, committed,
                       args.tolerance)
    _print_verdicts(measured, verdicts, args)
    if args.update:
        path = _write_baseline(args.baseline, measured, args.tolerance)
        print(f"\nbaseline written to {path}")
        return 0
    slower = [v.name for v in verdicts if v.status == "SLOWER"]
    if slower:
        print(f"\nslower than committed by more than {args.tolerance}×: {', '.join(slower)}")
        return 1
    return 0


def _read_baseline(path: Path) -> dict[str, float]:
    import json

    if not path.exists():
        return {}
    checks = json.loads(path.read_text(encoding="utf-8"))["checks"]
    return {name: entry["figure"] for name, entry in checks.items()}


def _write_baseline(path: Path, measured: dict, tolerance: float) -> Path:
    import json

    previous = (json.loads(path.read_text(encoding="utf-8"))["checks"]
                if path.exists() else {})
    checks = dict(previous)
    for name, (check, m) in measured.items():
        checks[name] = {"benchmark": check.benchmark, "description": check.description,
                        "figure": m.figure, "figures_all": m.figures, "seconds": m.seconds,
                        "reference_seconds": m.reference_seconds, "rounds": len(m.figures)}
    return write_json(path, {
        "benchmark": "bench_check", "machine": machine_info(), "tolerance": tolerance,
        "clock": "CPU seconds of the process and its finished children, one torch thread",
        "notes": ["figure = median over rounds of (operation time / reference time), the "
                  "reference operation of benchmarks/_reference.py timed in the same round"],
        "load_average_end": load_average(), "checks": checks})


def _print_verdicts(measured: dict, verdicts: list[Verdict], args) -> None:
    rows = []
    for verdict in verdicts:
        check, m = measured[verdict.name]
        rows.append([verdict.name, format_seconds(m.seconds),
                     format_seconds(m.reference_seconds), f"{verdict.figure:.3f}",
                     "–" if verdict.baseline is None else f"{verdict.baseline:.3f}",
                     "–" if verdict.ratio is None else f"{verdict.ratio:.2f}",
                     verdict.status])
    print()
    print_table(rows, ["check", "CPU time", "reference", "figure", "committed", "ratio",
                       "status"],
                f"Benchmark guard (figure = time / reference; fails beyond {args.tolerance}×)")


if __name__ == "__main__":
    sys.exit(main())
