"""Benchmark: the meta-GP of Recyclable / Modular GPs (cost in K, speed, 10⁶ points, accuracy).

Problem (the distributed-GP experiment of Recyclable GPs, Table 3 and App. E.1):
f(x) = 9/2 cos(2πx + 3π/2) − 3 sin(43π/10 x + 3π/10), y = f + ε with noise std 2, x on [0, 5]
cut into 50 segments of width 0.1 with N_k points each; R replicas of the 50 segments give
K = 50 R modules with disjoint data (overlapping regions for R > 1, as in the authors' 10⁵ and
10⁶ scripts). Modules are Gaussian SVGPs with M_k = 3, fitted as one batched model on their
collapsed (Titsias) bound by Adam with their k-means inducing inputs fixed; the meta-GP has M
global inducing inputs and is fitted by ``recycle(..., collapsed=True)`` with L-BFGS (q(u_*) at
its closed-form optimum, ψ_* and Z_* by gradients). Tests are a grid on [−0.5, 5.5]; RMSE/MAE
are against the true f, NLPD (mean per point) against noisy y, and the in-range part [0, 5] and
the extrapolation part are reported separately.

Six measurements:

1. **End to end, 10⁶ points in 5000 partitions** — batched local fits, recycling and prediction
   of 10⁴ test points, wall and CPU seconds per stage; accuracy against a full-data SVGP with the
   same M, fitted on its collapsed bound on all 10⁶ points with the default training (the exact
   SVGP optimum, Z learned).
2. **Cost in K** — one objective + gradient (the bound L_E w.r.t. q, ψ_*, Z_*, and the collapsed
   bound L_E^* w.r.t. ψ_*, Z_*) and one whole fit, for K ∈ {100, 1000, 5000} (subsets of the
   end-to-end modules) and M ∈ {35, 100}; the log–log slope of time against K.
3. **Profile of the largest fit** — stack building, forward and backward of one evaluation, the
   number of evaluations and the heaviest torch operators.
4. **Accuracy at 10⁴ points** (K = 50 × N_k = 200, M = 35), over seeds: the meta-GP (collapsed and
   uncollapsed) against the full-data SVGP and against expert combinations of the *same* modules
   (PoE, gPoE, BCM, rBCM and the healed rules: softmax-variance weights, barycenters).
5. **K = 50 000 modules** (1000 replicas of the 50 segments, N_k = 20; local fits capped at 20
   L-BFGS steps — q(u_k) is at its collapsed optimum at every step, and the cost of the meta-GP
   objective does not depend on the modules' values): one objective + gradient and the memory it
   keeps for the backward pass (bytes of saved tensors), against K = 5000.
6. **Against the authors' EnsembleGP** (only with ``--authors PATH``, a checkout of
   pmorenoz/RecyclableGP; :mod:`_authors_ensemble`): their bound + gradient and ours on the
   same modules, float64, in the same process, interleaved, at K ∈ {100, 1000, 5000}.

Objective times are also given as *figures*: time / the reference operation's time
(:mod:`_reference`) in the same round, which compare across machines and loads (the benchmark
guard, ``bench_check.py``, reads figures).

Usage::

    python benchmarks/meta_gp.py            # full → benchmarks/results/meta_gp.json
    python benchmarks/meta_gp.py --quick    # smoke run → benchmarks/results/meta_gp_quick.json
    python benchmarks/meta_gp.py --authors ~/src/RecyclableGP   # with the authors' code

Timings on a shared machine are noisy: the JSON records the load average, CPU seconds next to
wall seconds, and medians over interleaved repeats.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _common import (  # noqa: E402
    apply_threads,
    benchmark_parser,
    finite_or_none,
    format_seconds,
    interleaved_times,
    load_average,
    machine_info,
    median,
    output_path,
    paired_ratios,
    print_table,
    write_json,
)
from _reference import reference_operation  # noqa: E402
from pyrogp_models.inference import metrics  # noqa: E402
from pyrogp_models.inference.local_fit import LocalFit, LocalFitSpec, default_config, fit_local  # noqa: E402
from pyrogp_models.inference.memory import keep_freed_memory  # noqa: E402
from pyrogp_models.inference.recycling import (  # noqa: E402
    COLLAPSED_CONFIG,
    UNCOLLAPSED_CONFIG,
    Recycled,
    RecycleSpec,
    initial_global_kernel,
    initial_inducing,
    recycle,
)

from pyrogp_models.data.partitioners import Partition  # noqa: E402
from pyrogp_models.gaussian.expectations import PADDED_ROWS_MULTIPLE  # noqa: E402
from pyrogp_models.models.experts import PRESETS, ExpertCombination, ModuleExperts, combine  # noqa: E402
from pyrogp_models.models.meta.meta_gp import MetaGP  # noqa: E402
from pyrogp_models.modules.record import Module  # noqa: E402
from pyrogp_models.modules.stack import SITE_BLOCK_COLUMNS, ModuleStack  # noqa: E402

#: Targets of the brief.
TARGET_FIT_SECONDS = 30.0  # one K = 5000 meta-GP fit
TARGET_END_TO_END_SECONDS = 300.0  # 10⁶ points: local fits + recycling + prediction
TARGET_RMSE_RATIO = 1.5  # meta in-range RMSE ≤ 1.5 × the full-data SVGP's (10⁶ points)
TARGET_RMSE_10K = 0.3  # meta in-range RMSE at 10⁴ points
TARGET_NLPD_GAP = 0.1  # |meta NLPD − full-data SVGP NLPD| at 10⁴ points (in range)
TARGET_SLOPE = 1.15  # log–log slope of time against K: "linear (or better)"
TARGET_OBJECTIVE_K5000 = 0.030  # seconds of one bound + gradient at K = 5000, M = 35
TARGET_OBJECTIVE_K50000 = 0.150  # seconds of one bound + gradient at K = 50 000, M = 35
TARGET_AUTHORS_SPEEDUP = 1000.0  # against the authors' EnsembleGP at K = 5000, same process

#: Expert combinations of the same modules: the paper's baselines, then the healed rules
#: (Cohen et al. 2020) with the paper's regression temperature.
BASELINES = ("PoE", "gPoE_unif", "BCM", "rBCM_entr")
HEALED = ("gPoE_var", "rBCM_var_u", "BAR_var", "BAR_var_w2")
TEMPERATURE = 100.0



@dataclass(frozen=True)
class Settings:
    e2e_replicas: int = 100  # K = 50 R
    e2e_points: int = 200  # N_k
    e2e_test: int = 10_000
    local_steps: int | None = None  # step cap of the batched local fits (None: the default)
    ks: tuple[int, ...] = (100, 1000, 5000)
    ms: tuple[int, ...] = (35, 100)
    objective_repeats: int = 5
    accuracy_seeds: tuple[int, ...] = (0, 1, 2)
    accuracy_points: int = 200
    accuracy_local_steps: int | None = None
    accuracy_test: int = 1000
    accuracy_uncollapsed: bool = True
    inducing: int = 35  # M of the end-to-end and accuracy runs
    meta_steps: int | None = None  # step cap of every meta-GP fit (None: the library default)
    fit_repeats: int = 3  # whole fits per (K, M), while their total stays within the budget
    fit_repeat_budget: float = 240.0
    large_replicas: int = 1000  # K = 50 R modules of large_points points each
    large_points: int = 20
    large_local_steps: int | None = 20  # step cap of their local fits (timing only)
    authors_ks: tuple[int, ...] = (100, 1000, 5000)
    authors_repeats: int = 3


FULL = Settings()
QUICK = Settings(e2e_replicas=2, e2e_points=40, e2e_test=1000, local_steps=40,
                 ks=(25, 50, 100),
                 ms=(15, 35), objective_repeats=2, accuracy_seeds=(0,), accuracy_points=60,
                 accuracy_local_steps=100, accuracy_test=300, accuracy_uncollapsed=False,
                 meta_steps=3, fit_repeats=1, large_replicas=10, authors_ks=(10, 50),
                 authors_repeats=2)


# Data ---------------------------------------------------------------------------------------
def smooth_function(x: np.ndarray) -> np.ndarray:
    """f(x) = 9/2 cos(2πx + 3π/2) − 3 sin(43π/10 x + 3π/10) (the authors' ``smooth_function``)."""
    return 4.5 * np.cos(2 * np.pi * x + 1.5 * np.pi) - 3.0 * np.sin(4.3 * np.pi * x + 0.3 * np.pi)


@dataclass(frozen=True, eq=False)
class Problem:
    X: np.ndarray  # [N, 1]
    y: np.ndarray  # [N]
    partition: Partition


@dataclass(frozen=True, eq=False)
class TestSet:
    X: np.ndarray  # [T, 1]
    f: np.ndarray  # true f
    y: np.ndarray  # noisy y
    inside: np.ndarray  # bool, x within the training range


def distributed_problem(replicas: int, points: int, seed: int, segments: int = 50,
                        width: float = 0.1, noise_std: float = 2.0,
                        function=smooth_function) -> Problem:
    """``replicas`` × ``segments`` tasks of ``points`` uniform x each on consecutive segments of
    ``width`` from 0; task r·segments + s holds replica r of segment s."""
    rng = np.random.default_rng(seed)
    tasks = replicas * segments
    segment = np.tile(np.arange(segments), replicas).repeat(points)
    x = (segment + rng.uniform(0.0, 1.0, tasks * points)) * width
    y = function(x) + noise_std * rng.standard_normal(x.size)
    labels = np.arange(tasks).repeat(points)
    rule = {"kind": "label", "num_partitions": tasks, "column": "task",
            "values": list(range(tasks))}
    return Problem(x[:, None], y, Partition(labels, rule))


def test_grid(count: int, seed: int, low: float = -0.5, high: float = 5.5,
              inside: tuple[float, float] = (0.0, 5.0), noise_std: float = 2.0,
              function=smooth_function) -> TestSet:
    x = np.linspace(low, high, count)
    f = function(x)
    y = f + noise_std * np.random.default_rng(10_000 + seed).standard_normal(count)
    return TestSet(x[:, None], f, y, (x >= inside[0]) & (x <= inside[1]))


# Fits -----------------------------------------------------------------------------------------
class Stopwatch:
    """Wall and CPU seconds of a ``with`` block (CPU < wall when the machine is shared)."""

    def __enter__(self) -> Stopwatch:
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *_) -> None:
        self.wall = time.perf_counter() - self._wall
        self.cpu = time.process_time() - self._cpu

    def record(self) -> dict:
        return {"wall_seconds": self.wall, "cpu_seconds": self.cpu}


def local_spec(num_inducing: int = 3, learn_inducing: bool = False) -> LocalFitSpec:
    """Gaussian modules on the collapsed bound (the default), with fixed k-means inducing inputs
    as in the paper's experiment unless ``learn_inducing``."""
    return LocalFitSpec(num_inducing=num_inducing, learn_inducing=learn_inducing)


def fit_modules(problem: Problem, steps: int | None, seed: int = 0, num_inducing: int = 3,
                learn_inducing: bool = False) -> LocalFit:
    """The local fits with the library's default training (``steps`` caps it in quick runs)."""
    spec = local_spec(num_inducing, learn_inducing)
    config = replace(default_config(spec), seed=seed)
    if steps is not None:
        config = replace(config, steps=steps)
    return fit_local((problem.X, problem.y, problem.partition), spec, config)


def fit_meta(modules: dict[str, Module], num_inducing: int, collapsed: bool = True,
             steps: int | None = None) -> Recycled:
    """The meta-GP with the library's default training (``steps`` caps it in quick runs)."""
    config = COLLAPSED_CONFIG if collapsed else UNCOLLAPSED_CONFIG
    return recycle(modules, RecycleSpec(num_inducing=num_inducing, collapsed=collapsed),
                   config if steps is None else replace(config, steps=steps))


def evaluations(recycled: Recycled) -> int:
    """Evaluations of the bound with its gradient: the batched L-BFGS makes one per step after
    the one at the start."""
    return recycled.result.steps + 1


def single_partition(size: int) -> Partition:
    return Partition(np.zeros(size, dtype=np.int64), {"kind": "random", "num_partitions": 1})


def full_svgp(X: np.ndarray, y: np.ndarray, num_inducing: int) -> Module:
    """Full-data SVGP on its collapsed bound (L-BFGS, Z learned): the exact SVGP optimum."""
    return fit_local((X, y, single_partition(len(y))), LocalFitSpec(num_inducing, collapsed=True),
                     None).modules["part000"]


# Metrics --------------------------------------------------------------------------------------
def evaluate(predictor, test: TestSet) -> dict:
    """RMSE/MAE against f, mean NLPD and 95% coverage against y; in range, extrapolation, all."""
    mean, var = predictor.predict_y(test.X)
    log_density = predictor.log_predictive(test.X, test.y)
    mean, var = mean.detach().numpy(), var.detach().numpy()
    log_density = log_density.detach().numpy()
    out = {}
    for region, mask in (("in_range", test.inside), ("extrapolation", ~test.inside),
                         ("all", np.ones_like(test.inside))):
        if not mask.any():
            continue
        lower, upper = metrics.gaussian_interval(mean[mask], var[mask])
        out[region] = {"rmse_f": metrics.rmse(test.f[mask], mean[mask]),
                       "mae_f": metrics.mae(test.f[mask], mean[mask]),
                       "nlpd": metrics.nlpd(log_density[mask]),
                       "coverage95": metrics.coverage(test.y[mask], lower, upper)}
    return out


class PresetCombination:
    """A named rule of :data:`PRESETS` on the experts' latent moments, with the likelihood applied
    by :class:`ExpertCombination` (which cannot take a preset's ``normalise``)."""

    def __init__(self, experts: ModuleExperts, name: str, temperature: float = TEMPERATURE):
        self.preset = dict(PRESETS[name])
        self.temperature = temperature
        self.experts = experts
        weights = self.preset.get("weights")
        self.likelihood = ExpertCombination(experts, self.preset["rule"], weights,
                                            temperature if weights else None)

    def predict_f(self, X):
        X = torch.as_tensor(X, dtype=self.experts.dtype)
        mean, var = self.experts.predict_f(X)
        return combine(self.preset["rule"], mean, var, prior_var=self.experts.prior_var(X),
                       weights=self.preset.get("weights"), temperature=self.temperature,
                       normalise=self.preset.get("normalise"))

    def predict_y(self, X):
        return self.likelihood.y_moments(*self.predict_f(X))

    def log_predictive(self, X, y):
        return self.likelihood.y_log_density(y, *self.predict_f(X))


# 1. End to end --------------------------------------------------------------------------------
def bench_end_to_end(s: Settings, seed: int) -> tuple[dict, dict[str, Module], Problem]:
    with Stopwatch() as data_clock:
        problem = distributed_problem(s.e2e_replicas, s.e2e_points, seed)
        test = test_grid(s.e2e_test, seed)
    K, N = problem.partition.num_partitions, len(problem.y)
    print(f"  {N} points in {K} partitions of {s.e2e_points}", flush=True)
    with Stopwatch() as local_clock:
        local = fit_modules(problem, s.local_steps, seed)
    print(f"  local fits: {format_seconds(local_clock.wall)}", flush=True)
    with Stopwatch() as meta_clock:
        recycled = fit_meta(local.modules, s.inducing, steps=s.meta_steps)
    print(f"  recycling: {format_seconds(meta_clock.wall)} ({recycled.result.steps} L-BFGS steps, "
          f"{evaluations(recycled)} evaluations)", flush=True)
    with Stopwatch() as predict_clock:
        mean, var = recycled.module.predict_y(test.X)
        recycled.module.log_predictive(test.X, test.y)
    stages = {"data": data_clock.record(), "local_fits": local_clock.record(),
              "recycle": meta_clock.record(), "predict": predict_clock.record()}
    total = sum(stages[k]["wall_seconds"] for k in ("local_fits", "recycle", "predict"))
    total_cpu = sum(stages[k]["cpu_seconds"] for k in ("local_fits", "recycle", "predict"))
    print(f"  total (local + recycle + predict): {format_seconds(total)} wall, "
          f"{format_seconds(total_cpu)} CPU", flush=True)
    meta_scores = evaluate(recycled.module, test)
    print("  full-data SVGP reference (collapsed bound on all points)", flush=True)
    with Stopwatch() as reference_clock:
        reference = full_svgp(problem.X, problem.y, s.inducing)
    reference_record = reference_clock.record()
    record = {
        "N": N, "K": K, "points_per_partition": s.e2e_points, "M_k": 3, "M": s.inducing,
        "test_points": s.e2e_test, "stages": stages, "total_seconds": total,
        "total_cpu_seconds": total_cpu, "meta_steps": recycled.result.steps,
        "meta_evaluations": evaluations(recycled),
        "meta_converged": recycled.result.converged,
        "meta_min_precision_eigenvalue": recycled.model.min_precision_eigenvalue(),
        "meta_hyperparameters": _hyper(recycled.module),
        "local_final_loss": local.result.final_loss,
        "meta": meta_scores, "full_svgp": evaluate(reference, test),
        "full_svgp_fit": reference_record, "full_svgp_hyperparameters": _hyper(reference),
        "load_average": load_average(),
    }
    return record, local.modules, problem


def _hyper(module: Module) -> dict:
    return {key: float(value.reshape(-1)[0]) for key, value in module.hyperparameters().items()}


# 2. Cost in K -----------------------------------------------------------------------------------
def _meta_for_timing(stack: ModuleStack, num_inducing: int, collapsed: bool) -> MetaGP:
    """A meta-GP initialised exactly as :func:`recycle` does (k-means Z_*, median ψ)."""
    inducing = initial_inducing(stack.inducing_points, num_inducing, "kmeans", 0)
    kernel = initial_global_kernel(stack, RecycleSpec(num_inducing=num_inducing),
                                   inducing.shape[-1], stack.standardisation, True)
    meta = MetaGP(stack, inducing, kernel, collapsed=collapsed)
    if not collapsed:
        meta.set_optimal_posterior()
    return meta


def _objective_calls(meta_bound: MetaGP, meta_collapsed: MetaGP) -> dict:
    def bound():
        meta_bound.zero_grad(set_to_none=True)
        meta_bound.bound().backward()

    def collapsed():
        meta_collapsed.zero_grad(set_to_none=True)
        meta_collapsed.collapsed_bound().backward()

    return {"bound": bound, "collapsed": collapsed}


def bench_scaling(s: Settings, modules: dict[str, Module]) -> list[dict]:
    names = list(modules)
    reference = reference_operation()
    rows = []
    for M in s.ms:
        for K in s.ks:
            subset = {name: modules[name] for name in names[:K]}
            with Stopwatch() as stack_clock:
                stack = ModuleStack.from_modules(subset)
            calls = _objective_calls(_meta_for_timing(stack, M, False),
                                     _meta_for_timing(stack, M, True))
            calls["reference"] = reference
            times = interleaved_times(calls, repeats=s.objective_repeats)
            fit_walls, fit_cpus = [], []
            while True:  # repeat fits that are quick enough; report medians
                with Stopwatch() as fit_clock:
                    recycled = fit_meta(subset, M, steps=s.meta_steps)
                fit_walls.append(fit_clock.wall)
                fit_cpus.append(fit_clock.cpu)
                if (len(fit_walls) >= s.fit_repeats
                        or sum(fit_walls) + fit_walls[0] > s.fit_repeat_budget):
                    break
            row = {"K": K, "M": M, "stack_seconds": stack_clock.wall,
                   "bound_grad_seconds": median(times["bound"]),
                   "collapsed_grad_seconds": median(times["collapsed"]),
                   "bound_grad_seconds_all": times["bound"],
                   "collapsed_grad_seconds_all": times["collapsed"],
                   "reference_seconds": median(times["reference"]),
                   "bound_grad_figure": median(paired_ratios(times["bound"],
                                                             times["reference"])),
                   "collapsed_grad_figure": median(paired_ratios(times["collapsed"],
                                                                 times["reference"])),
                   "fit_seconds": median(fit_walls), "fit_cpu_seconds": median(fit_cpus),
                   "fit_seconds_all": fit_walls,
                   "fit_steps": recycled.result.steps,
                   "fit_evaluations": evaluations(recycled),
                   "fit_converged": recycled.result.converged,
                   "load_average": load_average()}
            row["bound_us_per_module"] = 1e6 * row["bound_grad_seconds"] / K
            row["collapsed_us_per_module"] = 1e6 * row["collapsed_grad_seconds"] / K
            rows.append(row)
            print(f"  K={K:5d} M={M:3d}: L_E+grad {format_seconds(row['bound_grad_seconds'])}, "
                  f"L_E*+grad {format_seconds(row['collapsed_grad_seconds'])}, fit "
                  f"{format_seconds(row['fit_seconds'])} ({evaluations(recycled)} "
                  f"evaluations, median of {len(fit_walls)})",
                  flush=True)
    return rows


def scaling_slopes(rows: list[dict]) -> list[dict]:
    """Least-squares slope of log(time) against log(K), per M and measured quantity."""
    out = []
    for M in sorted({row["M"] for row in rows}):
        part = [row for row in rows if row["M"] == M]
        logk = np.log([row["K"] for row in part])
        for key in ("bound_grad_seconds", "collapsed_grad_seconds", "fit_seconds"):
            slope = float(np.polyfit(logk, np.log([row[key] for row in part]), 1)[0])
            out.append({"M": M, "quantity": key, "slope": slope})
    return out


# 3. Profile of the largest fit -----------------------------------------------------------------
def bench_profile(s: Settings, modules: dict[str, Module], scaling: list[dict]) -> dict:
    K, M = max(s.ks), min(s.ms)
    subset = {name: modules[name] for name in list(modules)[:K]}
    stack = ModuleStack.from_modules(subset)
    meta = _meta_for_timing(stack, M, True)

    def forward():
        with torch.no_grad():
            meta.collapsed_bound()

    forward_seconds = median(interleaved_times({"f": forward}, repeats=s.objective_repeats)["f"])
    row = next(r for r in scaling if r["K"] == K and r["M"] == M)
    backward_seconds = row["collapsed_grad_seconds"] - forward_seconds
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        meta.zero_grad(set_to_none=True)
        meta.collapsed_bound().backward()
    ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:8]
    total = sum(e.self_cpu_time_total for e in prof.key_averages())
    return {"K": K, "M": M, "stack_seconds": row["stack_seconds"],
            "forward_seconds": forward_seconds, "backward_seconds": backward_seconds,
            "evaluations": row["fit_evaluations"],
            "evaluations_times_grad_seconds": row["fit_evaluations"] * row[
                "collapsed_grad_seconds"],
            "fit_seconds": row["fit_seconds"],
            "top_ops": [{"op": e.key, "calls": e.count,
                         "self_cpu_share": e.self_cpu_time_total / total} for e in ops]}


# 4. Accuracy at 10⁴ points ---------------------------------------------------------------------
def bench_accuracy(s: Settings) -> dict:
    runs: dict[str, list[dict]] = {}
    extra: list[dict] = []
    for seed in s.accuracy_seeds:
        problem = distributed_problem(1, s.accuracy_points, seed)
        test = test_grid(s.accuracy_test, seed)
        local = fit_modules(problem, s.accuracy_local_steps, seed)
        scores = {}
        with Stopwatch() as clock:
            collapsed = fit_meta(local.modules, s.inducing, steps=s.meta_steps)
        scores["meta (collapsed)"] = evaluate(collapsed.module, test)
        seed_extra = {"seed": seed, "meta_collapsed_seconds": clock.wall}
        if s.accuracy_uncollapsed:
            with Stopwatch() as clock:
                uncollapsed = fit_meta(local.modules, s.inducing, False, s.meta_steps)
            scores["meta (uncollapsed)"] = evaluate(uncollapsed.module, test)
            seed_extra["meta_uncollapsed_seconds"] = clock.wall
        scores["full-data SVGP"] = evaluate(full_svgp(problem.X, problem.y, s.inducing), test)
        experts = ModuleExperts(local.modules)
        for name in BASELINES + HEALED:
            scores[name] = evaluate(PresetCombination(experts, name), test)
        if seed == s.accuracy_seeds[0]:
            ablation = learned_inducing_ablation(problem, test, s, seed, local)
        for name, value in scores.items():
            runs.setdefault(name, []).append(value)
        extra.append(seed_extra)
        print(f"  seed {seed}: meta in-range RMSE "
              f"{scores['meta (collapsed)']['in_range']['rmse_f']:.3f}, NLPD "
              f"{scores['meta (collapsed)']['in_range']['nlpd']:.3f}; full SVGP "
              f"{scores['full-data SVGP']['in_range']['rmse_f']:.3f}, "
              f"{scores['full-data SVGP']['in_range']['nlpd']:.3f}", flush=True)
    return {"K": 50, "points_per_partition": s.accuracy_points, "M_k": 3, "M": s.inducing,
            "seeds": list(s.accuracy_seeds), "test_points": s.accuracy_test,
            "temperature": TEMPERATURE, "methods": summarise(runs), "per_seed": runs,
            "fits": extra, "ablation_learned_inducing": ablation}


def learned_inducing_ablation(problem: Problem, test: TestSet, s: Settings, seed: int,
                              fixed: LocalFit) -> dict:
    """The same local fit with Z_k learned (the LocalFitSpec default), then the same meta-GP."""
    learned = fit_modules(problem, s.accuracy_local_steps, seed, learn_inducing=True)
    out = {}
    for name, local in (("fixed Z_k", fixed), ("learned Z_k", learned)):
        meta = fit_meta(local.modules, s.inducing, steps=s.meta_steps)
        scores = evaluate(meta.module, test)["in_range"]
        out[name] = {"summed_local_bound": -local.result.final_loss,
                     "summed_local_elbo": float(sum(m.elbo for m in local.modules.values())),
                     "meta_rmse_in_range": scores["rmse_f"], "meta_nlpd_in_range": scores["nlpd"]}
    return out


def summarise(runs: dict[str, list[dict]]) -> dict:
    """Mean and sd over seeds of every method × region × metric."""
    out = {}
    for name, values in runs.items():
        out[name] = {}
        for region in values[0]:
            out[name][region] = {}
            for metric in values[0][region]:
                series = np.array([v[region][metric] for v in values])
                out[name][region][metric] = {
                    "mean": float(series.mean()),
                    "sd": float(series.std(ddof=1)) if len(series) > 1 else 0.0}
    return out


# 5. K = 50 000 modules --------------------------------------------------------------------------
def saved_bytes(run) -> int:
    """Bytes of the tensors one call of ``run`` (an objective and its backward pass) keeps for
    the backward pass, counted as autograd saves them."""
    total = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    return total


def bench_large(s: Settings, modules: dict[str, Module], seed: int) -> dict:
    """One objective + gradient at K = 50 R modules of ``large_points`` points each (R replicas
    of the segments, fitted with the default training), and the saved-tensor bytes per module
    against the end-to-end modules."""
    problem = distributed_problem(s.large_replicas, s.large_points, seed)
    with Stopwatch() as local_clock:
        local = fit_modules(problem, s.large_local_steps, seed)
    K = len(local.modules)
    print(f"  {K} modules of {s.large_points} points: local fits "
          f"{format_seconds(local_clock.wall)}", flush=True)
    with Stopwatch() as stack_clock:
        stack = ModuleStack.from_modules(local.modules)
    calls = _objective_calls(_meta_for_timing(stack, s.inducing, False),
                             _meta_for_timing(stack, s.inducing, True))
    calls["reference"] = reference_operation()
    times = interleaved_times(calls, repeats=s.objective_repeats)
    small = ModuleStack.from_modules(modules)
    small_calls = _objective_calls(_meta_for_timing(small, s.inducing, False),
                                   _meta_for_timing(small, s.inducing, True))
    memory = {f"{kind}_saved_bytes_per_module": {
        str(small.num_modules): saved_bytes(small_calls[kind]) / small.num_modules,
        str(K): saved_bytes(calls[kind]) / K} for kind in ("bound", "collapsed")}
    row = {"K": K, "M": s.inducing, "points_per_module": s.large_points,
           "local_fits": local_clock.record(), "stack_seconds": stack_clock.wall,
           "bound_grad_seconds": median(times["bound"]),
           "collapsed_grad_seconds": median(times["collapsed"]),
           "bound_grad_seconds_all": times["bound"],
           "collapsed_grad_seconds_all": times["collapsed"],
           "reference_seconds": median(times["reference"]),
           "bound_grad_figure": median(paired_ratios(times["bound"], times["reference"])),
           "collapsed_grad_figure": median(paired_ratios(times["collapsed"],
                                                         times["reference"])),
           **memory, "load_average": load_average()}
    print(f"  K={K}: L_E+grad {format_seconds(row['bound_grad_seconds'])}, L_E*+grad "
          f"{format_seconds(row['collapsed_grad_seconds'])}; saved bytes per module "
          f"{memory['bound_saved_bytes_per_module']}", flush=True)
    return row


# 6. Against the authors' EnsembleGP -----------------------------------------------------------
def bench_authors(s: Settings, modules: dict[str, Module], checkout: Path) -> list[dict]:
    """Their bound + gradient (EnsembleGP, float64) and ours (L_E + gradient) on the same modules
    and starting point, in this process: rounds of one evaluation of theirs and as many of ours
    as take about as long, in CPU and wall seconds."""
    import _authors_ensemble

    authors = _authors_ensemble.load(checkout)
    names = list(modules)
    rows = []
    for K in s.authors_ks:
        stack = ModuleStack.from_modules({name: modules[name] for name in names[:K]})
        ours_meta = _meta_for_timing(stack, s.inducing, False)
        ours = _objective_calls(ours_meta, ours_meta)["bound"]
        theirs = _authors_ensemble.evaluation(
            _authors_ensemble.ensemble_like(authors, ours_meta, stack))
        theirs_value = -theirs()  # warm-up; their forward returns −bound
        ours()
        clocks = {"ours": [], "theirs": []}
        for _ in range(s.authors_repeats):
            with Stopwatch() as clock:
                theirs()
            clocks["theirs"].append(clock.record())
            number = max(1, round(clock.cpu / max(clocks["ours"][-1]["cpu_seconds"], 1e-4))
                         if clocks["ours"] else 10)
            with Stopwatch() as clock:
                for _ in range(number):
                    ours()
            clocks["ours"].append({key: value / number for key, value in clock.record().items()})
        row = {"K": K, "M": s.inducing, "repeats": s.authors_repeats,
               "ours_bound": float(ours_meta.bound()), "theirs_bound": theirs_value}
        for who in ("ours", "theirs"):
            for key in ("wall_seconds", "cpu_seconds"):
                row[f"{who}_{key}"] = median([c[key] for c in clocks[who]])
        row["speedup_cpu"] = row["theirs_cpu_seconds"] / row["ours_cpu_seconds"]
        row["speedup_wall"] = row["theirs_wall_seconds"] / row["ours_wall_seconds"]
        rows.append(row)
        print(f"  K={K}: theirs {format_seconds(row['theirs_cpu_seconds'])} CPU, ours "
              f"{format_seconds(row['ours_cpu_seconds'])} CPU: {row['speedup_cpu']:.0f}×",
              flush=True)
    return rows


# Targets and tables -------------------------------------------------------------------------------
def targets(payload: dict) -> dict:
    out = {}
    rows = payload["scaling"]
    K_max = max(row["K"] for row in rows)
    fit = next(row for row in rows if row["K"] == K_max and row["M"] == min(payload["settings"][
        "ms"]))
    out["fit_k5000_under_30s"] = {
        "met": bool(fit["fit_seconds"] < TARGET_FIT_SECONDS), "value": fit["fit_seconds"],
        "threshold": TARGET_FIT_SECONDS, "K": K_max, "M": fit["M"],
        "cpu_seconds": fit["fit_cpu_seconds"]}
    slopes = payload["scaling_slopes"]
    objective = [row for row in slopes if row["quantity"] != "fit_seconds"]
    worst = max(row["slope"] for row in objective)
    out["objective_linear_in_K"] = {"met": bool(worst <= TARGET_SLOPE), "value": worst,
                                    "threshold": TARGET_SLOPE, "slopes": objective}
    k5000 = next((row for row in rows if row["K"] == 5000 and row["M"] == 35), None)
    if k5000 is not None:
        out["k5000_objective_under_30ms"] = {
            "met": bool(k5000["bound_grad_seconds"] <= TARGET_OBJECTIVE_K5000),
            "value": k5000["bound_grad_seconds"], "threshold": TARGET_OBJECTIVE_K5000,
            "collapsed_seconds": k5000["collapsed_grad_seconds"]}
    large = payload["large"]
    out["large_k_objective_under_150ms"] = {
        "met": bool(large["bound_grad_seconds"] <= TARGET_OBJECTIVE_K50000),
        "value": large["bound_grad_seconds"], "threshold": TARGET_OBJECTIVE_K50000,
        "K": large["K"], "collapsed_seconds": large["collapsed_grad_seconds"]}
    authors = [row for row in payload.get("authors") or [] if row["K"] == 5000]
    if authors:
        out["k5000_1000x_the_authors"] = {
            "met": bool(authors[0]["speedup_cpu"] >= TARGET_AUTHORS_SPEEDUP),
            "value": authors[0]["speedup_cpu"], "threshold": TARGET_AUTHORS_SPEEDUP,
            "wall_speedup": authors[0]["speedup_wall"]}
    e2e = payload["end_to_end"]
    out["end_to_end_under_5_minutes"] = {
        "met": bool(e2e["total_seconds"] < TARGET_END_TO_END_SECONDS),
        "value": e2e["total_seconds"], "threshold": TARGET_END_TO_END_SECONDS, "N": e2e["N"],
        "K": e2e["K"], "cpu_seconds": e2e["total_cpu_seconds"]}
    ratio = e2e["meta"]["in_range"]["rmse_f"] / e2e["full_svgp"]["in_range"]["rmse_f"]
    out["end_to_end_rmse_within_1.5x_full_svgp"] = {
        "met": bool(ratio <= TARGET_RMSE_RATIO), "value": ratio, "threshold": TARGET_RMSE_RATIO,
        "meta_rmse": e2e["meta"]["in_range"]["rmse_f"],
        "full_svgp_rmse": e2e["full_svgp"]["in_range"]["rmse_f"]}
    methods = payload["accuracy"]["methods"]
    meta = methods["meta (collapsed)"]["in_range"]
    full = methods["full-data SVGP"]["in_range"]
    out["accuracy_10k_rmse_le_0.3"] = {"met": bool(meta["rmse_f"]["mean"] <= TARGET_RMSE_10K),
                                       "value": meta["rmse_f"]["mean"],
                                       "threshold": TARGET_RMSE_10K}
    gap = meta["nlpd"]["mean"] - full["nlpd"]["mean"]
    out["accuracy_10k_nlpd_within_0.1_of_full_svgp"] = {
        "met": bool(abs(gap) <= TARGET_NLPD_GAP), "value": gap, "threshold": TARGET_NLPD_GAP}
    margins = {name: methods[name]["in_range"]["nlpd"]["mean"] - meta["nlpd"]["mean"]
               for name in BASELINES}
    out["accuracy_10k_nlpd_better_than_poe_family"] = {
        "met": bool(min(margins.values()) > 0), "value": min(margins.values()),
        "threshold": 0.0, "margins": margins}
    return out


def print_tables(payload: dict) -> None:
    e2e = payload["end_to_end"]
    print()
    print_table([[stage, format_seconds(v["wall_seconds"]), format_seconds(v["cpu_seconds"])]
                 for stage, v in e2e["stages"].items()]
                + [["total (fits + recycle + predict)", format_seconds(e2e["total_seconds"]),
                    format_seconds(e2e["total_cpu_seconds"])]],
                ["stage", "wall", "CPU"],
                f"End to end: N = {e2e['N']} in K = {e2e['K']} partitions, M_k = 3, M = "
                f"{e2e['M']}, {e2e['test_points']} test points")
    rows = []
    for name, key in (("meta-GP", "meta"), ("full-data SVGP", "full_svgp")):
        for region in ("in_range", "extrapolation"):
            r = e2e[key][region]
            rows.append([name, region, f"{r['rmse_f']:.4f}", f"{r['mae_f']:.4f}",
                         f"{r['nlpd']:.4f}", f"{r['coverage95']:.3f}"])
    print()
    print_table(rows, ["model", "region", "RMSE(f)", "MAE(f)", "NLPD", "cover95"],
                "End to end: accuracy")
    print()
    print_table([[r["K"], r["M"], format_seconds(r["bound_grad_seconds"]),
                  f"{r['bound_us_per_module']:.1f}", format_seconds(r["collapsed_grad_seconds"]),
                  f"{r['collapsed_us_per_module']:.1f}", format_seconds(r["stack_seconds"]),
                  format_seconds(r["fit_seconds"]), format_seconds(r["fit_cpu_seconds"]),
                  r["fit_evaluations"]] for r in payload["scaling"]],
                ["K", "M", "L_E+grad", "µs/module", "L_E*+grad", "µs/module", "stack",
                 "fit wall", "fit CPU", "evals"],
                "Cost in K (medians; fit = recycle(collapsed=True), L-BFGS)")
    print("figures (time / reference): " + ", ".join(
        f"K={r['K']} M={r['M']} {r['bound_grad_figure']:.2f}/{r['collapsed_grad_figure']:.2f}"
        for r in payload["scaling"]))
    large = payload["large"]
    print(f"K={large['K']}: L_E+grad {format_seconds(large['bound_grad_seconds'])}, L_E*+grad "
          f"{format_seconds(large['collapsed_grad_seconds'])}; saved bytes per module "
          f"{large['bound_saved_bytes_per_module']}")
    if payload.get("authors"):
        print()
        print_table([[r["K"], format_seconds(r["theirs_cpu_seconds"]),
                      format_seconds(r["ours_cpu_seconds"]), f"{r['speedup_cpu']:.0f}×",
                      f"{r['speedup_wall']:.0f}×"] for r in payload["authors"]],
                    ["K", "EnsembleGP (CPU)", "ours (CPU)", "speed-up (CPU)", "speed-up (wall)"],
                    "Against the authors' EnsembleGP: bound + gradient, float64, same process")
    print("log-log slopes: " + ", ".join(
        f"M={r['M']} {r['quantity'].replace('_seconds', '')} {r['slope']:.2f}"
        for r in payload["scaling_slopes"]))
    profile = payload["profile"]
    print(f"\nProfile K={profile['K']} M={profile['M']}: stack "
          f"{format_seconds(profile['stack_seconds'])}, forward "
          f"{format_seconds(profile['forward_seconds'])}, backward "
          f"{format_seconds(profile['backward_seconds'])}, {profile['evaluations']} evaluations "
          f"(≈ {format_seconds(profile['evaluations_times_grad_seconds'])}); top ops: "
          + ", ".join(f"{op['op']} {100 * op['self_cpu_share']:.0f}%"
                      for op in profile["top_ops"][:5]))
    accuracy = payload["accuracy"]
    rows = []
    for name, regions in accuracy["methods"].items():
        cells = [name]
        for region in ("in_range", "extrapolation"):
            for metric in ("rmse_f", "nlpd"):
                value = regions[region][metric]
                cells.append(f"{value['mean']:.3f} ± {value['sd']:.3f}")
        rows.append(cells)
    print()
    print_table(rows, ["method", "RMSE(f) in", "NLPD in", "RMSE(f) extrap", "NLPD extrap"],
                f"Accuracy at 10⁴ points (K = 50 × N_k = {accuracy['points_per_partition']}, "
                f"M_k = 3, M = {accuracy['M']}; mean ± sd over seeds {accuracy['seeds']})")
    ablation = accuracy["ablation_learned_inducing"]
    print("\nLocal inducing inputs fixed vs learned (first seed): " + "; ".join(
        f"{name}: summed ELBO {v['summed_local_elbo']:.1f}, meta RMSE "
        f"{v['meta_rmse_in_range']:.3f}, NLPD {v['meta_nlpd_in_range']:.3f}"
        for name, v in ablation.items()))
    print()
    print_table([[name, "met" if t["met"] else "MISSED", f"{t['value']:.4g}",
                  f"{t['threshold']:.4g}"] for name, t in payload["targets"].items()],
                ["target", "status", "value", "threshold"], "Targets")


# Main ---------------------------------------------------------------------------------------------
def parse_args(argv=None) -> argparse.Namespace:
    parser = benchmark_parser(__doc__.split("\n\n")[0], "meta_gp")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--authors", type=Path,
                        default=os.environ.get("PYROGP_AUTHORS_CODE") or None,
                        help="a checkout of the authors' code (pmorenoz/RecyclableGP) to time "
                             "their EnsembleGP against (default: $PYROGP_AUTHORS_CODE; skipped "
                             "without one)")
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    settings = QUICK if args.quick else FULL
    if max(settings.ks) > settings.e2e_replicas * 50:
        settings = replace(settings, e2e_replicas=math.ceil(max(settings.ks) / 50))
    apply_threads(args)
    keeps_freed_memory = keep_freed_memory()
    mode = "quick" if args.quick else "full"
    out = output_path(args, "meta_gp")
    started = time.perf_counter()
    payload: dict = {
        "benchmark": "meta_gp", "mode": mode, "machine": machine_info(),
        "settings": asdict(settings),
        "problem": {"function": "9/2 cos(2πx + 3π/2) − 3 sin(43π/10 x + 3π/10)",
                    "noise_std": 2.0, "train_range": [0.0, 5.0], "test_range": [-0.5, 5.5],
                    "segments": 50, "segment_width": 0.1, "dtype": "float64",
                    "likelihood": "gaussian", "kernel": "rbf"},
        "meta_config": asdict(COLLAPSED_CONFIG if settings.meta_steps is None
                              else replace(COLLAPSED_CONFIG, steps=settings.meta_steps)),
        "notes": [
            f"The process keeps freed memory for reuse as the command line does "
            f"(pyrogp_models.inference.memory.keep_freed_memory: {keeps_freed_memory}); the "
            "authors' code runs in the same process.",
            "Modules: fit_local(LocalFitSpec(3, learn_inducing=False)) with the default training "
            "(collapsed bound, batched L-BFGS); k-means inducing inputs kept fixed. "
            "accuracy.ablation_learned_inducing repeats the first 10⁴ seed with Z_k learned (the "
            "LocalFitSpec default).",
            "Meta-GP: recycle(collapsed=True) with the default training (the library's L-BFGS, "
            "one evaluation of the bound with its gradient per step, rejected trial points "
            "included).",
            "Objective: both bounds go through their quadratic form in q(v), from each module's "
            "site parameters (P_k = R_k diag(s_k) R_kᵀ, b_k, constants) cached once per stack in "
            f"blocks of up to {SITE_BLOCK_COLUMNS} module inducing inputs (ModuleStack.sites); "
            "the RBF's exponent factors of all blocks at once (K_*b = exp(PQᵀ)), then per block "
            "one autograd step: K_*b, the block product with the R_k, one product with L_**⁻¹ "
            f"(its rows zero-padded to a multiple of {PADDED_ROWS_MULTIPLE}) and "
            "the Gram Aᵀdiag(s)A, and a hand-written backward (one product, M×M algebra and "
            "the factors' thin products). "
            "λ_min(Λ_w) is checked every 5 evaluations on the Λ_w the evaluation computed. Fit "
            "times include building the stack, k-means initialisation and the export.",
            "Figures are objective times divided by the reference operation "
            "(benchmarks/_reference.py) timed in the same interleaved rounds.",
            "authors: their EnsembleGP from the checkout given by --authors (float64, torch.solve "
            "and torch.cholesky shims, the same relative jitter as ours on K_** and each K_kk), "
            "bound + gradient, one evaluation of theirs per round against as many of ours as "
            "take about as long; CPU and wall seconds, same process.",
            "RMSE/MAE are against the true f; NLPD is the mean per-point −log p(y*) with the "
            "modules' N_k-weighted noise variance; in range = [0, 5], extrapolation = the 0.5 on "
            "each side.",
            "Wall seconds on a shared 2-core machine: CPU seconds show the share this process got.",
        ],
    }
    print(f"meta_gp benchmark ({mode}): torch {torch.__version__}, {torch.get_num_threads()} "
          "thread(s)", flush=True)
    print("[1/6] end to end", flush=True)
    payload["end_to_end"], modules, _ = bench_end_to_end(settings, args.seed)
    print("[2/6] cost in K", flush=True)
    payload["scaling"] = bench_scaling(settings, modules)
    payload["scaling_slopes"] = scaling_slopes(payload["scaling"])
    print("[3/6] profile of the largest fit", flush=True)
    payload["profile"] = bench_profile(settings, modules, payload["scaling"])
    print("[4/6] accuracy at 10⁴ points", flush=True)
    payload["accuracy"] = bench_accuracy(settings)
    print(f"[5/6] K = {50 * settings.large_replicas} modules", flush=True)
    payload["large"] = bench_large(settings, modules, args.seed)
    if args.authors is not None:
        print("[6/6] against the authors' EnsembleGP", flush=True)
        payload["authors"] = bench_authors(settings, modules, args.authors.expanduser())
    else:
        print("[6/6] against the authors' EnsembleGP: skipped (no --authors checkout)",
              flush=True)
        payload["authors"] = None
    payload["targets"] = targets(payload)
    payload["total_seconds"] = time.perf_counter() - started
    payload["machine"]["load_average_end"] = load_average()
    print_tables(payload)
    path = write_json(out, _clean(payload))
    print(f"\nJSON written to {path}", flush=True)
    return payload


def _clean(value):
    """NaN/inf → None, recursively (JSON has neither)."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if isinstance(value, float):
        return finite_or_none(value)
    return value


if __name__ == "__main__":
    main()
