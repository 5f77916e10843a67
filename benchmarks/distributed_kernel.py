"""Benchmark of the distributed-kernel sparse GP: cost versus J, and a race at equal time.

1. Cost. n = 10⁵ points in 1-D, m inducing inputs per region, J = 1 … 256 regions: the wall and
   CPU time of one objective + gradient (halo rebuilt, ELBO, backward) are medians of
   ``--repeats`` rounds that interleave the J values. With the halo every point touches ~1–2
   regions, so the cost is O(n m²) and flat in J; the same objective with every (point, region)
   pair kept (no halo) costs O(n J m²) and is timed for the smaller J where it fits in memory.
2. Equal wall time. A function whose detail grows along x (a chirp), n = 10⁵ noisy training
   points, 10⁴ test points: the distributed-kernel GP (J regions × m, ``fit_distributed_kernel``
   with its default training: Adam on θ, Z and the cuts, q solved by conjugate gradients before
   each step) against one SVGP with the same total M = J·m inducing inputs on its best recipe —
   the library's default, the collapsed bound by L-BFGS on all n points (q(u) at its optimum) —
   and, for the case the collapsed bound does not cover (minibatches), the minibatch SVGP with
   natural-gradient steps on q(u) and Adam on the rest (``fit_local``'s default with
   ``batch_size``). Every model starts from its own default initialisation and trains until its
   convergence test passes or ``--budget`` seconds have passed. Test NLPD (noise included) and
   RMSE; wall and CPU seconds (on a shared machine CPU < wall: the share the fit got).

Prints markdown tables and writes ``distributed_kernel.json`` and ``.md`` (``--out``; default
``benchmarks/results/``). Run: ``python benchmarks/distributed_kernel.py [--quick]``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _common import (  # noqa: E402
    RESULTS_DIR,
    load_average,
    machine_info,
    markdown_table,
    median,
    write_json,
)
from pyrogp_models.inference.distributed_kernel_fit import (  # noqa: E402
    COLLAPSED_CONFIG,
    DistributedKernelSpec,
    fit_distributed_kernel,
)
from pyrogp_models.inference.fit_result import Fit  # noqa: E402
from pyrogp_models.inference.local_fit import LocalFitSpec, default_config, fit_local  # noqa: E402
from pyrogp_models.inference.metrics import nlpd, rmse  # noqa: E402

from pyrogp_models.data.partitioners import partition_random  # noqa: E402
from pyrogp_models.models.distributed_kernel.construct import build_distributed_kernel_gp  # noqa: E402
from pyrogp_models.models.distributed_kernel.halo import full_halo  # noqa: E402


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
                row[f"median_{key}"] = median(row[key])
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


def race(X, y, Xs, ys, J: int, m: int, budget: float, batch_size: int | None = None,
         keep_prediction: bool = False) -> list[dict]:
    """The distributed-kernel GP (J × m) against one SVGP with M = J·m on the collapsed bound
    and, with ``batch_size``, the minibatch SVGP with natural gradients: each with the library's
    default training, stopped after ``budget`` seconds if it has not converged by then."""
    def distributed_kernel() -> Fit:
        return fit_distributed_kernel((X, y), DistributedKernelSpec(J, m),
                                      replace(COLLAPSED_CONFIG, time_budget=budget))

    def svgp(batch: int | None):
        spec = LocalFitSpec(J * m, batch_size=batch)
        return lambda: fit_local((X, y, partition_random(len(y), 1, 0)), spec,
                                 replace(default_config(spec), time_budget=budget))

    contenders = {f"distributed kernel, J={J} × m={m}": distributed_kernel,
                  f"SVGP, M={J * m}, collapsed bound, L-BFGS": svgp(None)}
    if batch_size is not None:
        contenders[f"SVGP, M={J * m}, minibatch {batch_size}, natural gradients + Adam"] = \
            svgp(batch_size)
    return [race_row(name, J * m, fit, Xs, ys, keep_prediction) for name, fit in
            contenders.items()]


def race_row(name: str, M: int, fit_fn, Xs, ys, keep_prediction: bool) -> dict:
    """Fit one contender and score it: steps, wall and CPU seconds, test NLPD and RMSE, the
    ELBO and hyperparameters in data units."""
    wall, cpu = time.perf_counter(), time.process_time()
    fit = fit_fn()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    predictor = fit.predictor
    with torch.no_grad():
        mean, var_y = predictor.predict_y(Xs)
    lengthscale, noise = data_units_hyperparameters(fit)
    row = {"model": name, "M": M, "steps": fit.result.steps, "converged": fit.result.converged,
           "train_seconds": fit.result.seconds, "wall_seconds": wall, "cpu_seconds": cpu,
           "elbo": predictor.elbo - predictor.num_data * math.log(fit.standardisation.y_scale),
           "lengthscale": lengthscale, "noise": noise, **evaluate(mean, var_y, ys)}
    if keep_prediction:
        row["prediction"] = (mean, var_y)
    print(f"  {name}: {row['steps']} steps, {wall:.1f} s wall ({cpu:.1f} s CPU), test NLPD "
          f"{row['nlpd']:.3f}", flush=True)
    return row


def data_units_hyperparameters(fit: Fit) -> tuple[float, float]:
    """Lengthscale and noise variance in data units of a fitted SVGP (its one module) or
    distributed-kernel GP."""
    modules = getattr(fit, "modules", None)
    if modules:
        hyper = next(iter(modules.values())).hyperparameters()
        return float(hyper["lengthscale"].reshape(-1)[0]), float(hyper["noise_variance"])
    scale = fit.standardisation
    return (float(fit.model.kernel.lengthscale.detach()) * float(scale.x_scale[0]),
            float(fit.model.likelihood.variance.detach()) * scale.y_scale**2)


def evaluate(mean, var_y, ys) -> dict:
    log_density = -0.5 * (torch.log(2 * math.pi * var_y) + (ys - mean).square() / var_y)
    return {"nlpd": nlpd(log_density.numpy()), "rmse": rmse(ys.numpy(), mean.numpy())}


def race_table(rows: list[dict]) -> list[str]:
    """Markdown lines: one row per contender of a race (with its data set when given)."""
    data = "data" in rows[0]
    return markdown_table(
        (["data"] if data else []) + ["model", "M", "steps", "converged", "wall s", "CPU s",
                                      "test NLPD", "test RMSE", "ELBO", "ℓ", "σ²"],
        [([r["data"]] if data else []) + [
            r["model"], r["M"], r["steps"], "yes" if r["converged"] else "no (budget)",
            f"{r['wall_seconds']:.1f}", f"{r['cpu_seconds']:.1f}", f"{r['nlpd']:.3f}",
            f"{r['rmse']:.4f}", f"{r['elbo']:.0f}", f"{r['lengthscale']:.3f}",
            f"{r['noise']:.4f}"] for r in rows])


def markdown(report: dict) -> str:
    machine, settings = report["machine"], report["settings"]
    cost, race_record = report["cost_versus_regions"], report["equal_time"]
    rows = race_record["results"]
    lines = ["# Distributed-kernel GP benchmark", "",
             f"Commit {machine['commit']} (uncommitted changes: {machine['dirty']}; "
             f"pyrogp_models {machine['pyrogp_models']}); torch {machine['torch']}, "
             f"{machine['torch_threads']} thread(s), float64; load average "
             f"{machine['load_average']} at the start, {machine['load_average_end']} at the end. "
             "A shared 2-core machine: part 1 reports medians over rounds that interleave the J "
             "values; part 2 is one fit per model, with its CPU seconds next to its wall seconds "
             "(the share of the machine it got).", "",
             f"## 1. One objective + gradient at n = {settings['n']}, m = {settings['m']}", ""]
    lines += markdown_table(
        ["J", "pairs / point", "CPU s, halo", "wall s, halo", "CPU µs per pair",
         "CPU s, every pair", "wall s, every pair"],
        [[r["J"], f"{r['pairs_per_point']:.2f}", f"{r['median_cpu_halo']:.3f}",
          f"{r['median_wall_halo']:.3f}", f"{r['cpu_per_pair_us']:.2f}",
          *((f"{r['median_cpu_no_halo']:.3f}", f"{r['median_wall_no_halo']:.3f}")
            if "median_cpu_no_halo" in r else ("—", "—"))] for r in cost])
    lines += ["", f"Log–log slope of CPU time in J: {report['slope_with_halo']:.2f} with the halo "
              f"(J ≥ 4), {report['slope_every_pair']:.2f} with every pair (O(n J m²) would be 1).",
              "", f"## 2. Equal wall time on the chirp (n = {race_record['n_train']}, "
              f"{race_record['n_test']} test points, noise variance {race_record['noise']}; "
              f"budget {race_record['budget_seconds']:.0f} s of training each)", ""]
    lines += race_table(rows)
    lines += ["", "Each model trains with the library's defaults from its own default "
              "initialisation and stops at its convergence test or at the budget. The SVGP "
              "rows are its best recipe (the collapsed bound by L-BFGS, the library default) "
              "and the minibatch recipe (natural-gradient steps on q(u), Adam on the rest). "
              + race_summary(rows), ""]
    return "\n".join(lines)


def race_summary(rows: list[dict]) -> str:
    """One sentence: the first contender's test NLPD against every other's."""
    first, others = rows[0], rows[1:]
    return (f"Test NLPD of the {first['model']}: {first['nlpd']:.3f}; "
            + "; ".join(f"{r['model']}: {r['nlpd']:.3f} ({r['nlpd'] - first['nlpd']:+.3f}, "
                        f"{r['steps']} steps, "
                        f"{'converged' if r['converged'] else 'stopped by the budget'})"
                        for r in others) + ".")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small settings (smoke test)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (1: stable timings on a shared machine)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--budget", type=float, default=60.0,
                        help="seconds of training per model (part 2)")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON path (the report is written next to it as .md)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.set_default_dtype(torch.float64)
    out = args.out or RESULTS_DIR / f"distributed_kernel{'_quick' if args.quick else ''}.json"
    n = 20000 if args.quick else 100000
    m = 10
    regions = [1, 4, 16, 64] if args.quick else [1, 4, 16, 64, 256]
    full_regions = [2, 4] if args.quick else [2, 4, 8]    # J = 1 has no window to evaluate
    regions = sorted(set(regions) | set(full_regions))
    budget = 10.0 if args.quick else args.budget
    report = {"machine": machine_info(),
              "settings": vars(args) | {"out": str(out), "n": n, "m": m, "dtype": "float64"}}

    print(f"## 1. One objective + gradient at n = {n}, m = {m}", flush=True)
    cost = cost_versus_regions(n, m, regions, full_regions, args.repeats)
    large = [r for r in cost if r["J"] >= 4]
    full = [r for r in cost if "median_cpu_no_halo" in r]
    report |= {"cost_versus_regions": cost,
               "slope_with_halo": log_slope([r["J"] for r in large],
                                            [r["median_cpu_halo"] for r in large]),
               "slope_every_pair": log_slope([r["J"] for r in full],
                                             [r["median_cpu_no_halo"] for r in full])}

    print(f"## 2. Equal wall time ({budget:.0f} s each) on the chirp", flush=True)
    J, m2 = (16, 16) if args.quick else (32, 16)
    X, y, Xs, ys = chirp_data(n, 10000, noise=0.01)
    report["equal_time"] = {"n_train": n, "n_test": 10000, "noise": 0.01,
                            "budget_seconds": budget,
                            "results": race(X, y, Xs, ys, J, m2, budget, batch_size=1000)}
    report["machine"]["load_average_end"] = load_average()
    text = markdown(report)
    print(text)
    write_json(out, report)
    out.with_suffix(".md").write_text(text, encoding="utf-8")
    print(f"\nwrote {out}")
    return report


if __name__ == "__main__":
    main()
