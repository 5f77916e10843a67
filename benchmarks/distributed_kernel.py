"""Benchmark of the distributed-kernel sparse GP: cost versus J, and NLPD at equal time.

1. Cost. n = 10⁵ points in 1-D, m inducing inputs per region, J = 1 … 256 regions: the wall time
   of one objective + gradient (halo rebuilt, ELBO, backward) is the median of ``--repeats``
   runs. With the halo every point touches ~1–2 regions, so the cost is O(n m²) and flat in J;
   the same objective with every (point, region) pair kept (no halo) costs O(n J m²) and is timed
   for the smaller J where it fits in memory.
2. Equal wall time. A function whose detail grows along x (a chirp), n = 10⁵ noisy training
   points, 10⁴ test points: the distributed-kernel GP (J regions × m, q solved by conjugate
   gradients before each step: ``fit_distributed_kernel``) against one SVGP with the same total
   M = J·m inducing inputs (minibatch Adam on Pyro's TraceMeanField_ELBO), both trained by
   ``inference.trainer.train`` for ``--budget`` seconds from the same hyperparameters (ℓ = 0.5,
   noise 0.1, signal variance var(y)). Test NLPD (noise included) and RMSE.

Prints markdown tables and writes ``benchmarks/results/distributed_kernel.json``.
Run: ``python benchmarks/distributed_kernel.py [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from inference.distributed_kernel_fit import (  # noqa: E402
    DEFAULT_TRAIN_CONFIG,
    DistributedKernelSpec,
    fit_distributed_kernel,
)
from inference.metrics import nlpd, rmse  # noqa: E402
from inference.trainer import train  # noqa: E402
from pyrogp_models.data import Standardisation  # noqa: E402
from pyrogp_models.kernels import RBF  # noqa: E402
from pyrogp_models.likelihoods import make_likelihood  # noqa: E402
from pyrogp_models.models.distributed_kernel.construct import build_distributed_kernel_gp  # noqa: E402
from pyrogp_models.models.distributed_kernel.halo import full_halo  # noqa: E402
from pyrogp_models.models.local.svgp import BatchedSVGP  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def machine() -> dict:
    return {"platform": platform.platform(), "processor": platform.processor() or "unknown",
            "cpu_count": os.cpu_count(), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "dtype": "float64",
            "load_average_1min": os.getloadavg()[0]}


# 1. cost versus J -----------------------------------------------------------------------------
def objective_and_gradient(model, X, y, halo=None) -> tuple[float, float]:
    """Wall and CPU seconds of one objective + gradient (halo rebuilt unless given)."""
    wall, cpu = time.perf_counter(), time.process_time()
    model.zero_grad()
    loss = -model.elbo(X, y, halo)
    loss.backward()
    return time.perf_counter() - wall, time.process_time() - cpu


def cost_versus_regions(n: int, m: int, regions: list[int], full_regions: list[int],
                        repeats: int, seed: int = 0) -> list[dict]:
    """Median wall and CPU time per J; repeats interleave the J values so that changes in the
    load of a shared machine hit every J alike."""
    generator = torch.Generator().manual_seed(seed)
    span = 2000.0
    X = (torch.rand(n, 1, generator=generator) * span).sort(0).values
    y = torch.sin(X[:, 0]) + 0.1 * torch.randn(n, generator=generator)
    models = {J: build_distributed_kernel_gp(X, J, m, lengthscale=1.0, noise=0.01)
              for J in regions}
    rows = {J: {"J": J, "m": m, "n": n, "pairs_per_point": models[J].halo(X).num_pairs / n,
                "wall_halo": [], "cpu_halo": [], "wall_no_halo": [], "cpu_no_halo": []}
            for J in regions}
    for J in regions:                                                  # warm-up
        objective_and_gradient(models[J], X, y)
    for repeat in range(repeats):
        for J in regions:
            wall, cpu = objective_and_gradient(models[J], X, y)
            rows[J]["wall_halo"].append(wall)
            rows[J]["cpu_halo"].append(cpu)
            if J in full_regions:
                wall, cpu = objective_and_gradient(models[J], X, y, full_halo(n, J))
                rows[J]["wall_no_halo"].append(wall)
                rows[J]["cpu_no_halo"].append(cpu)
        print(f"  repeat {repeat + 1}/{repeats} done", flush=True)
    for row in rows.values():
        for key in ("wall_halo", "cpu_halo", "wall_no_halo", "cpu_no_halo"):
            if row[key]:
                row[f"median_{key}"] = statistics.median(row[key])
        row["cpu_per_pair_us"] = 1e6 * row["median_cpu_halo"] / (row["pairs_per_point"] * n)
    return [rows[J] for J in regions]


def log_slope(xs, ys) -> float:
    lx = [math.log(x) for x in xs]
    ly = [math.log(y) for y in ys]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum(
        (a - mx) ** 2 for a in lx)


# 2. equal wall time ---------------------------------------------------------------------------
def chirp(x: torch.Tensor) -> torch.Tensor:
    """Detail grows along x: local frequency 0.2 + 0.03x rad per unit on [0, 100]."""
    return torch.sin(0.2 * x + 0.015 * x.square())


def chirp_data(n: int, n_test: int, noise: float, seed: int = 1):
    generator = torch.Generator().manual_seed(seed)
    X = (torch.rand(n, 1, generator=generator) * 100).sort(0).values
    Xs = (torch.rand(n_test, 1, generator=generator) * 100).sort(0).values
    y = chirp(X[:, 0]) + math.sqrt(noise) * torch.randn(n, generator=generator)
    ys = chirp(Xs[:, 0]) + math.sqrt(noise) * torch.randn(n_test, generator=generator)
    return X, y, Xs, ys


def evaluate(mean, var_y, ys) -> dict:
    log_density = -0.5 * (torch.log(2 * math.pi * var_y) + (ys - mean).square() / var_y)
    return {"nlpd": nlpd(log_density.numpy()), "rmse": rmse(ys.numpy(), mean.numpy())}


#: Optimiser steps allowed in part 2: the budget stops both fits first.
MAX_STEPS = 100_000


def run_distributed_kernel(X, y, Xs, ys, J, m, init, budget, keep_prediction=False) -> dict:
    """The distributed-kernel fit (standardised data) from ``init`` in data units."""
    scale = Standardisation.fit(X, y)
    spec = DistributedKernelSpec(
        J, m, lengthscale=init["lengthscale"] / float(scale.x_scale[0]),
        likelihood_options={"variance": init["noise"] / scale.y_scale**2})
    fit = fit_distributed_kernel((X, y), spec, replace(DEFAULT_TRAIN_CONFIG, steps=MAX_STEPS,
                                                       lr=0.1, time_budget=budget))
    mean, var_y = fit.predictor.predict_y(Xs)
    row = {"model": f"distributed kernel, J={J} x m={m}", "M": J * m, "steps": fit.result.steps,
           "seconds": fit.result.seconds,
           "final_elbo": -fit.result.final_loss - len(y) * math.log(scale.y_scale),
           "lengthscale": float(fit.model.kernel.lengthscale.detach()) * float(scale.x_scale[0]),
           "noise": float(fit.model.likelihood.variance.detach()) * scale.y_scale**2,
           **evaluate(mean, var_y, ys)}
    if keep_prediction:
        row["prediction"] = (mean, var_y)
    return row


def run_svgp(X, y, Xs, ys, M, init, budget, batch_size, seed=0, keep_prediction=False) -> dict:
    """One SVGP with M inducing inputs on a grid, from ``init`` (signal variance var(y))."""
    Z = torch.linspace(float(X.min()), float(X.max()), M).reshape(1, M, 1)
    kernel = RBF(1, batch_shape=(1, 1), lengthscale=init["lengthscale"],
                 variance=float(y.var(unbiased=False)))
    svgp = BatchedSVGP(Z, kernel, make_likelihood("gaussian", batch_shape=(1,),
                                                  variance=init["noise"]),
                       X.unsqueeze(0), y.unsqueeze(0), torch.ones(1, X.shape[0], dtype=torch.bool),
                       batch_size=batch_size)
    result = train(svgp, config=replace(DEFAULT_TRAIN_CONFIG, steps=MAX_STEPS, lr=0.01,
                                        seed=seed, time_budget=budget))
    with torch.no_grad():
        mean, var = svgp.latent(Xs.unsqueeze(0))
        mean, var_y = svgp.likelihood.predictive_moments(mean, var)
    row = {"model": f"SVGP, M={M}, minibatch {batch_size}", "M": M, "steps": result.steps,
           "seconds": result.seconds,
           "lengthscale": float(svgp.kernel.lengthscale.detach().reshape(-1)[0]),
           "noise": float(svgp.likelihood.variance.detach().reshape(-1)[0]),
           **evaluate(mean[0], var_y[0], ys)}
    if keep_prediction:
        row["prediction"] = (mean[0], var_y[0])
    return row


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small settings (smoke test)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (1: stable timings on a shared machine)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--budget", type=float, default=60.0, help="seconds per model (part 2)")
    parser.add_argument("--out", type=Path, default=RESULTS / "distributed_kernel.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.set_default_dtype(torch.float64)
    n = 20000 if args.quick else 100000
    m = 10
    regions = [1, 4, 16, 64] if args.quick else [1, 4, 16, 64, 256]
    full_regions = [2, 4] if args.quick else [2, 4, 8]    # J = 1 has no window to evaluate
    regions = sorted(set(regions) | set(full_regions))
    budget = 10.0 if args.quick else args.budget

    print(f"# Distributed-kernel benchmark ({machine()['processor']}, "
          f"{os.cpu_count()} cores, {args.threads} torch thread(s), float64)\n", flush=True)
    print(f"## 1. One objective + gradient at n = {n}, m = {m}", flush=True)
    cost = cost_versus_regions(n, m, regions, full_regions, args.repeats)
    large = [r for r in cost if r["J"] >= 4]
    halo_slope = log_slope([r["J"] for r in large], [r["median_cpu_halo"] for r in large])
    full = [r for r in cost if "median_cpu_no_halo" in r]
    full_slope = log_slope([r["J"] for r in full], [r["median_cpu_no_halo"] for r in full])
    print("\n| J | pairs / point | CPU s, halo | wall s, halo | CPU µs per pair | "
          "CPU s, every pair | wall s, every pair |\n|---|---|---|---|---|---|---|")
    for r in cost:
        every = (f"{r['median_cpu_no_halo']:.3f} | {r['median_wall_no_halo']:.3f}"
                 if "median_cpu_no_halo" in r else "— | —")
        print(f"| {r['J']} | {r['pairs_per_point']:.2f} | {r['median_cpu_halo']:.3f} | "
              f"{r['median_wall_halo']:.3f} | {r['cpu_per_pair_us']:.2f} | {every} |")
    print(f"\nlog-log slope of CPU time in J: {halo_slope:.2f} with the halo (J ≥ 4), "
          f"{full_slope:.2f} with every pair (O(n J m²) would be 1)\n", flush=True)

    print(f"## 2. Equal wall time ({budget:.0f} s each) on the chirp", flush=True)
    n_train = 20000 if args.quick else 100000
    J, m2 = (16, 16) if args.quick else (32, 16)
    X, y, Xs, ys = chirp_data(n_train, 10000, noise=0.01)
    init = {"lengthscale": 0.5, "noise": 0.1}
    comparison = [run_distributed_kernel(X, y, Xs, ys, J, m2, init, budget),
                  run_svgp(X, y, Xs, ys, J * m2, init, budget, batch_size=1000)]
    print("\n| model | M | steps | seconds | test NLPD | test RMSE | ℓ | σ² |")
    print("|---|---|---|---|---|---|---|---|")
    for r in comparison:
        print(f"| {r['model']} | {r['M']} | {r['steps']} | {r['seconds']:.1f} | "
              f"{r['nlpd']:.3f} | {r['rmse']:.4f} | {r['lengthscale']:.3f} | {r['noise']:.4f} |")
    report = {"machine": machine(), "settings": vars(args) | {"out": str(args.out)},
              "cost_versus_regions": cost, "slope_with_halo": halo_slope,
              "slope_every_pair": full_slope,
              "equal_time": {"n_train": n_train, "n_test": 10000, "noise": 0.01,
                             "budget_seconds": budget, "initial": init, "results": comparison}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"\nwrote {args.out}")
    return report


if __name__ == "__main__":
    main()
