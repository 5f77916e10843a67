"""Benchmark of the distributed-kernel sparse GP: cost versus J, and a race at equal time.

1. Cost. n = 10⁵ points in 1-D, m inducing inputs per region, J = 1 … 256 regions: the wall and
   CPU time of one objective + gradient (halo rebuilt, ELBO, backward) are medians of
   ``--repeats`` rounds that interleave the J values. With the halo every point touches ~1–2
   regions, so the cost is O(n m²) and flat in J; the same objective with every (point, region)
   pair kept (no halo) costs O(n J m²) and is timed for the smaller J where it fits in memory.
2. Defaults on the command line. A series whose detail grows along x (a chirp), n = 5·10⁴ noisy
   training points and 10⁴ test points in CSV files: ``pyrogp fit-distkernel`` with its default
   layout (J regions × m, :func:`~pyrogp_models.inference.distributed_kernel_fit.default_layout`:
   16 × 16 here) against ``pyrogp fit-local --partitions 1 --inducing J·m`` (one SVGP with the
   same total M on the collapsed bound), both with every training default, one
   torch thread each (the command line's default), run side by side as two processes so that
   the machine's load hits both alike; each one's wall and CPU seconds, then test NLPD (noise
   included) and RMSE from ``pyrogp evaluate``. The load average is sampled during the run.

The equal-time race of :func:`race` (every model stopped after the same wall-clock budget) serves
the experiments (``distributed_kernel_experiments.py``).

Prints markdown tables and writes ``distributed_kernel.json`` and ``.md`` (``--out``; default
``benchmarks/results/``); ``--only-defaults`` runs part 2 alone into
``distributed_kernel_defaults.json``. Run: ``python benchmarks/distributed_kernel.py [--quick]``.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _common import (  # noqa: E402
    apply_threads,
    benchmark_parser,
    load_average,
    machine_info,
    markdown_table,
    median,
    output_path,
    write_json,
)
from pyrogp_models.inference.distributed_kernel_fit import (  # noqa: E402
    DistributedKernelSpec,
    default_layout,
    fit_distributed_kernel,
)
from pyrogp_models.inference.fit_result import Fit  # noqa: E402
from pyrogp_models.inference.local_fit import LocalFitSpec, default_config, fit_local  # noqa: E402
from pyrogp_models.inference.metrics import nlpd, rmse  # noqa: E402
from pyrogp_models.inference.train_config import (  # noqa: E402
    DISTRIBUTED_KERNEL_COLLAPSED_CONFIG as COLLAPSED_CONFIG,
)

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


# the chirp, and the equal-time race of the experiments ------------------------------------
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


# 2. defaults on the command line ----------------------------------------------------------------
def write_chirp_csv(folder: Path, n: int, n_test: int, noise: float) -> tuple[Path, Path]:
    """train.csv and test.csv (columns x, y) of the chirp."""
    X, y, Xs, ys = chirp_data(n, n_test, noise)
    paths = folder / "train.csv", folder / "test.csv"
    for path, inputs, targets in zip(paths, (X, Xs), (y, ys), strict=True):
        np.savetxt(path, np.column_stack([inputs[:, 0].numpy(), targets.numpy()]), delimiter=",",
                   header="x,y", comments="", fmt="%.12g")
    return paths


def pyrogp_command(*args) -> list[str]:
    return [sys.executable, "-m", "pyrogp_models.inference.cli", *map(str, args)]


def side_by_side(commands: dict[str, list[str]], sample_every: float = 5.0) -> dict[str, dict]:
    """Run the commands as concurrent processes; each one's wall and CPU seconds (its own and
    its children's, from ``wait4``), stdout and stderr, and the load average sampled every
    ``sample_every`` seconds while any runs."""
    start = time.perf_counter()
    running, outputs = {}, {}
    for name, command in commands.items():
        stdout, stderr = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        running[name] = subprocess.Popen(command, cwd=ROOT, stdout=stdout, stderr=stderr,
                                         text=True)
        outputs[name] = (stdout, stderr)
    results, loads = {}, []
    while len(results) < len(commands):
        for name, process in running.items():
            if name in results:
                continue
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                stdout, stderr = outputs[name]
                stdout.seek(0)
                stderr.seek(0)
                results[name] = {"wall_seconds": time.perf_counter() - start,
                                 "cpu_seconds": usage.ru_utime + usage.ru_stime,
                                 "returncode": os.waitstatus_to_exitcode(status),
                                 "stdout": stdout.read(), "stderr": stderr.read()}
        loads.append(load_average())
        time.sleep(sample_every)
    for name, result in results.items():
        if result["returncode"] != 0:
            raise SystemExit(f"{name} failed:\n{result['stderr']}")
        result["load_samples"] = loads
    return results


def evaluate_file(model: Path, test: Path) -> dict:
    """Test NLPD and RMSE of a saved model from ``pyrogp evaluate --json``."""
    done = subprocess.run(pyrogp_command("evaluate", model, "--data", test, "--target", "y",
                                         "--json"), cwd=ROOT, capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def defaults_on_the_command_line(n: int, n_test: int, noise: float) -> dict:
    """Part 2 (module docstring): both fits with their defaults, side by side."""
    J, m = default_layout(n)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        train, test = write_chirp_csv(folder, n, n_test, noise)
        names = {"distributed": f"fit-distkernel (defaults: {J} regions × {m})",
                 "svgp": f"fit-local --partitions 1 --inducing {J * m}"}
        commands = {
            "distributed": pyrogp_command("fit-distkernel", train, "--target", "y", "--out",
                                          folder / "dk.safetensors"),
            "svgp": pyrogp_command("fit-local", train, "--target", "y", "--partitions", 1,
                                   "--inducing", J * m, "--out", folder / "svgp")}
        load_start = load_average()
        runs = side_by_side(commands)
        load_end = load_average()
        scores = {"distributed": evaluate_file(folder / "dk.safetensors", test),
                  "svgp": evaluate_file(folder / "svgp", test)}
    rows = []
    for key, run in runs.items():
        rows.append({"model": names[key], "M": J * m, "wall_seconds": run["wall_seconds"],
                     "cpu_seconds": run["cpu_seconds"], "nlpd": scores[key]["nlpd"],
                     "rmse": scores[key]["rmse"], "summary": fit_summary(run["stdout"]),
                     "warnings": [line for line in run["stderr"].splitlines()
                                  if "warning" in line.lower()]})
        print(f"  {names[key]}: {run['wall_seconds']:.1f} s wall, {run['cpu_seconds']:.1f} s "
              f"CPU, test NLPD {scores[key]['nlpd']:.4f}", flush=True)
    distributed, svgp = rows
    samples = [load[0] for load in runs["svgp"]["load_samples"] if load]
    return {"n_train": n, "n_test": n_test, "noise": noise, "J": J, "m": m, "results": rows,
            "wall_ratio": distributed["wall_seconds"] / svgp["wall_seconds"],
            "cpu_ratio": distributed["cpu_seconds"] / svgp["cpu_seconds"],
            "nlpd_difference": distributed["nlpd"] - svgp["nlpd"],
            "load_average_start": load_start, "load_average_end": load_end,
            "load_1min_median": median(samples) if samples else None}


def fit_summary(stdout: str) -> str:
    """Steps and convergence as the fit command reports them (e.g. "80 steps, converged")."""
    match = re.search(r"(\d+) steps(?: \(\w+\))?, (not converged|converged)", stdout)
    return f"{match.group(1)} steps, {match.group(2)}" if match else ""


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
    cost, defaults = report["cost_versus_regions"], report["defaults"]
    lines = ["# Distributed-kernel GP benchmark", "",
             f"Commit {machine['commit']} (uncommitted changes: {machine['dirty']}; "
             f"pyrogp_models {machine['pyrogp_models']}); torch {machine['torch']}, "
             f"{machine['torch_threads']} thread(s), float64; load average "
             f"{machine['load_average']} at the start, {machine['load_average_end']} at the end. "
             "A shared 2-core machine: part 1 reports medians over rounds that interleave the J "
             "values; part 2 runs both fits side by side, with their CPU seconds next to their "
             "wall seconds (the share of the machine each got).", "",
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
              "", f"## 2. Defaults on the command line: the chirp, n = {defaults['n_train']} "
              f"({defaults['n_test']} test points, noise variance {defaults['noise']}), "
              f"M = {defaults['J'] * defaults['m']} each", ""]
    lines += markdown_table(
        ["command", "wall s", "CPU s", "test NLPD", "test RMSE", "fit"],
        [[f"`pyrogp {r['model']}`", f"{r['wall_seconds']:.1f}", f"{r['cpu_seconds']:.1f}",
          f"{r['nlpd']:.4f}", f"{r['rmse']:.4f}", r["summary"]] for r in defaults["results"]])
    lines += ["", f"Both commands with every training default, one torch thread each, run at the "
              f"same time (load average {defaults['load_average_start']} at the start, "
              f"{defaults['load_average_end']} at the end, median 1-minute load "
              f"{defaults['load_1min_median']} during the run). The distributed kernel took "
              f"{defaults['wall_ratio']:.2f}× the SVGP's wall time ({defaults['cpu_ratio']:.2f}× "
              f"its CPU time); its test NLPD differs by {defaults['nlpd_difference']:+.4f}.", ""]
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = benchmark_parser(__doc__.splitlines()[0], "distributed_kernel",
                              out_help="JSON output (default: {default}); the report is written "
                                       "next to it as .md")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--noise", type=float, default=0.04,
                        help="noise variance of the chirp of part 2")
    parser.add_argument("--only-defaults", action="store_true",
                        help="run part 2 alone and write distributed_kernel_defaults.json")
    args = parser.parse_args(argv)
    apply_threads(args)
    torch.set_default_dtype(torch.float64)
    if args.only_defaults:
        return defaults_alone(args)
    out = output_path(args, "distributed_kernel")
    n = 20000 if args.quick else 100000
    m = 10
    regions = [1, 4, 16, 64] if args.quick else [1, 4, 16, 64, 256]
    full_regions = [2, 4] if args.quick else [2, 4, 8]    # J = 1 has no window to evaluate
    regions = sorted(set(regions) | set(full_regions))
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

    print("## 2. Defaults on the command line, side by side", flush=True)
    report["defaults"] = defaults_part(args)
    report["machine"]["load_average_end"] = load_average()
    text = markdown(report)
    print(text)
    write_json(out, report)
    out.with_suffix(".md").write_text(text, encoding="utf-8")
    print(f"\nwrote {out}")
    return report


def defaults_part(args) -> dict:
    """Part 2 at the quick or full sizes."""
    n_cli = 4000 if args.quick else 50000
    return defaults_on_the_command_line(n_cli, 10000 if not args.quick else 2000, args.noise)


def defaults_alone(args) -> dict:
    """Part 2 alone, written with its own machine record (``--only-defaults``)."""
    out = output_path(args, "distributed_kernel_defaults")
    print("## 2. Defaults on the command line, side by side", flush=True)
    report = {"machine": machine_info(), "settings": vars(args) | {"out": str(out)},
              "defaults": defaults_part(args)}
    report["machine"]["load_average_end"] = load_average()
    write_json(out, report)
    print(f"\nwrote {out}")
    return report


if __name__ == "__main__":
    main()
