"""Benchmark: composable kernels in K local sparse GPs, against GPyTorch's batched kernels.

1. **ELBO + gradient per evaluation** — K partitions of a 1-D series (full mode: K = 1000,
   N_k = 200, M = 8, float64), one SVGP per partition as one batched model: the uncollapsed
   SVGP ELBO (Hensman et al. 2015, eq. 4) and its gradient for every kernel kind and for the
   composite ``rbf + periodic * rbf + rq``, against GPyTorch's batch-mode SVGP
   (``VariationalStrategy`` + ``CholeskyVariationalDistribution(batch_shape=[K])`` +
   ``VariationalELBO``) with the same kernel structure built from its batched kernels
   (``ScaleKernel``, ``RBFKernel``, ``MaternKernel``, ``RQKernel``, ``PeriodicKernel``,
   ``LinearKernel``), interleaved round by round, medians over rounds. Our collapsed bound (what
   ``fit_local`` trains by default) is timed too.
2. **Time to converge with restarts on and off** — ``fit_local`` with its defaults and
   ``restarts=1`` on the same partitions (K = ``converge_k``): wall time, steps, and how many
   partitions end with a higher bound with restarts.

Usage::

    python benchmarks/kernels.py            # full mode → benchmarks/results/kernels.json
    python benchmarks/kernels.py --quick    # seconds; → benchmarks/results/kernels_quick.json
"""

from __future__ import annotations

import sys
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    apply_threads,
    benchmark_parser,
    format_seconds,
    interleaved_times,
    load_average,
    machine_info,
    median,
    output_path,
    paired_ratios,
    print_table,
    source_version,
    write_json,
)
from local_fit import make_problem  # noqa: E402
from pyrogp_models.inference.local_fit import LocalFitSpec, fit_local, model_inputs  # noqa: E402

from pyrogp_models.errors import NotConvergedWarning  # noqa: E402
from pyrogp_models.models.local.local_gps import LocalGPs  # noqa: E402

#: The kernels timed, by expression.
KERNELS = ("rbf", "matern12", "matern32", "matern52", "rq", "periodic", "linear",
           "rbf + periodic * rbf + rq")
TARGET_SPEEDUP = 1.5


@dataclass(frozen=True)
class Settings:
    partitions: int = 1000
    points: int = 200
    inducing: int = 8
    rounds: int = 7
    converge_k: int = 100


FULL = Settings()
QUICK = Settings(partitions=8, points=30, inducing=4, rounds=2, converge_k=4)


def gpytorch_kernel(expression: str, batch: torch.Size):
    """GPyTorch's batched kernel of the same structure as ``expression``."""
    import gpytorch.kernels as gk

    def leaf(name: str):
        base = {"rbf": lambda: gk.RBFKernel(batch_shape=batch),
                "matern12": lambda: gk.MaternKernel(0.5, batch_shape=batch),
                "matern32": lambda: gk.MaternKernel(1.5, batch_shape=batch),
                "matern52": lambda: gk.MaternKernel(2.5, batch_shape=batch),
                "rq": lambda: gk.RQKernel(batch_shape=batch),
                "periodic": lambda: gk.PeriodicKernel(batch_shape=batch)}
        if name == "linear":
            return gk.LinearKernel(batch_shape=batch)
        return gk.ScaleKernel(base[name](), batch_shape=batch)

    terms = []
    for term in expression.split("+"):
        factors = [leaf(name.strip()) for name in term.split("*")]
        product = factors[0]
        for factor in factors[1:]:
            product = product * factor
        terms.append(product)
    total = terms[0]
    for term in terms[1:]:
        total = total + term
    return total


def gpytorch_objective(expression: str, X: torch.Tensor, y: torch.Tensor, Z: torch.Tensor):
    """−ELBO + gradient of GPyTorch's batch SVGP with the kernel of ``expression``."""
    import gpytorch

    K, M, _ = Z.shape
    batch = torch.Size([K])

    class BatchSVGP(gpytorch.models.ApproximateGP):
        def __init__(self):
            strategy = gpytorch.variational.VariationalStrategy(
                self, Z.clone(), gpytorch.variational.CholeskyVariationalDistribution(
                    M, batch_shape=batch), learn_inducing_locations=True)
            super().__init__(strategy)
            self.mean_module = gpytorch.means.ZeroMean(batch_shape=batch)
            self.covar_module = gpytorch_kernel(expression, batch)

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x),
                                                             self.covar_module(x))

    model = BatchSVGP().to(X.dtype)
    likelihood = gpytorch.likelihoods.GaussianLikelihood(batch_shape=batch).to(X.dtype)
    mll = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=X.shape[-2])
    parameters = list(model.parameters()) + list(likelihood.parameters())

    def evaluate():
        for p in parameters:
            p.grad = None
        loss = -mll(model(X), y).sum() * X.shape[-2]
        loss.backward()
        return loss.detach()

    return evaluate


def our_objective(model: LocalGPs, collapsed: bool):
    group = model.groups[0]
    group.collapsed = collapsed
    parameters = [p for p in group.parameters() if p.requires_grad]

    def evaluate():
        loss = -group.objective().sum()
        torch.autograd.grad(loss, parameters, allow_unused=True)
        return loss.detach()

    return evaluate


def bench_evaluations(s: Settings) -> list[dict]:
    X, y, partition = make_problem(s.partitions, s.points, "contiguous", 0.1, 0)
    rows = []
    for expression in KERNELS:
        spec = LocalFitSpec(num_inducing=s.inducing, kernel=expression)
        X_model, y_model, _ = model_inputs(X, y, spec)
        model = LocalGPs(X_model, y_model, partition, s.inducing, kernel=expression,
                         collapsed=False)
        group = model.groups[0]
        theirs = gpytorch_objective(expression, group.data_X, group.data_y,
                                    group.inducing.detach())
        times = interleaved_times({"ours": our_objective(model, False),
                                   "ours_collapsed": our_objective(model, True),
                                   "gpytorch": theirs}, repeats=s.rounds, warmup=1)
        ratios = paired_ratios(times["gpytorch"], times["ours"])
        row = {"kernel": expression, "ours_seconds": median(times["ours"]),
               "ours_collapsed_seconds": median(times["ours_collapsed"]),
               "gpytorch_seconds": median(times["gpytorch"]),
               "speedup": median(times["gpytorch"]) / median(times["ours"]),
               "speedup_paired_min": min(ratios), "speedup_paired_max": max(ratios)}
        rows.append(row)
        print(f"  {expression}: ours {format_seconds(row['ours_seconds'])}, GPyTorch "
              f"{format_seconds(row['gpytorch_seconds'])} ({row['speedup']:.2f}×)", flush=True)
    return rows


def bench_restarts(s: Settings) -> dict:
    X, y, partition = make_problem(s.converge_k, s.points, "contiguous", 0.1, 1)
    out = {}
    for name, restarts in (("restarts_off", 1), ("restarts_on", None)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NotConvergedWarning)
            start = time.perf_counter()
            fit = fit_local((X, y, partition), replace(LocalFitSpec(num_inducing=s.inducing),
                                                       restarts=restarts))
            seconds = time.perf_counter() - start
        out[name] = {"seconds": seconds, "steps": fit.result.steps,
                     "converged": fit.result.converged,
                     "elbos": [m.elbo for m in fit.modules.values()]}
    better = sum(a > b + 1e-6 for a, b in zip(out["restarts_on"]["elbos"],
                                              out["restarts_off"]["elbos"], strict=True))
    out["partitions_better_with_restarts"] = better
    out["time_ratio"] = out["restarts_on"]["seconds"] / out["restarts_off"]["seconds"]
    return out


def main(argv=None) -> dict:
    args = benchmark_parser(__doc__.splitlines()[0], "kernels").parse_args(argv)
    apply_threads(args)
    s = QUICK if args.quick else FULL
    load_before = load_average()
    evaluations = bench_evaluations(s)
    restarts = bench_restarts(s)
    payload = {"settings": s.__dict__, "machine": machine_info(), "source": source_version(),
               "load_before": load_before, "load_after": load_average(),
               "evaluations": evaluations, "restarts": restarts,
               "targets": {"speedup_each": TARGET_SPEEDUP,
                           "met": all(r["speedup"] >= TARGET_SPEEDUP for r in evaluations)}}
    print_table([(r["kernel"], format_seconds(r["ours_seconds"]),
                  format_seconds(r["ours_collapsed_seconds"]),
                  format_seconds(r["gpytorch_seconds"]), f"{r['speedup']:.2f}")
                 for r in evaluations],
                ["kernel", "ours (ELBO)", "ours (collapsed)", "GPyTorch", "speedup"],
                f"ELBO + gradient, K = {s.partitions}, N_k = {s.points}, M = {s.inducing}")
    print(f"restarts: {restarts['time_ratio']:.2f}× the time without, "
          f"{restarts['partitions_better_with_restarts']} of {s.converge_k} partitions better")
    path = write_json(output_path(args, "kernels"), payload)
    print(f"JSON written to {path}")
    return payload


if __name__ == "__main__":
    main()
