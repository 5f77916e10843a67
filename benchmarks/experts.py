"""Benchmark: products of GP experts at scale (exact experts, batched predictions, all rules).

Data: y = sin(x₁) cos(x₂) + 0.1 x₃ + noise on n = 10⁵ points in [0, 10]³, random partition into
J = 1000 experts of 100 points (float64). Four measurements, medians over repeats:

1. **Training** exact experts with shared hyperparameters, eq. (2): ``fit_exact_experts`` with
   its default L-BFGS (construction, training and export of the J modules included).
   Target: under 2 minutes.
2. **Combination** of expert moments [J, N] for N = 10⁵ test points and J ∈ {10, 100, 1000}
   (the first J experts), every rule with its own weights plus the softmax-variance variants,
   through ``ExpertCombination.combine_moments``. The moments are synthetic (means ~ N(0, 1),
   variances ~ U(0.01, 1)·σ*²): the cost of a rule does not depend on their values, and exact
   moments for 10⁸ expert–point pairs cost far more than combining them (see 3). Target: all
   rules for J = 1000 in under 10 s.
3. **Expert moments**: ``ModuleExperts.predict_f`` (one batched Gaussian conditional per group of
   modules sharing M) for N test points and each J; its cost is O(J·N·M²), so it is reported per
   expert–point pair and extrapolated to N = 10⁵.
4. **End to end**: ``ExpertCombination.predict_f`` for N = 10⁵ points with J = 10 experts.

Usage::

    python benchmarks/experts.py            # → benchmarks/results/experts.json and .md
    python benchmarks/experts.py --quick    # n = 10⁴, N = 10⁴; → experts_quick.json and .md
    python benchmarks/experts.py --out PATH.json

Timings on a shared machine are noisy: every figure is a median over repeats, and the report
gives the load average at the start and the end.

The script pins torch to ``--threads`` threads (default 1; on this two-core machine batched
LAPACK calls with two OpenMP threads were up to 50× slower than with one under load).
"""

from __future__ import annotations

import sys
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
    format_seconds,
    load_average,
    machine_info,
    median,
    median_time,
    output_path,
    print_table,
    write_json,
)
from pyrogp_models.inference.experts_fit import fit_exact_experts  # noqa: E402

from pyrogp_models.data.partitioners import partition_random  # noqa: E402
from pyrogp_models.models.experts import ExpertCombination, ModuleExperts  # noqa: E402

SETTINGS = {
    "full": dict(n=100_000, per_expert=100, test=100_000, experts=(10, 100, 1000),
                 moment_points=1000, end_to_end_experts=10, train_repeats=2, repeats=3),
    "quick": dict(n=10_000, per_expert=100, test=10_000, experts=(10, 100),
                  moment_points=200, end_to_end_experts=10, train_repeats=1, repeats=2),
}
#: (rule, weights) timed: every rule with its own weights, and the paper's softmax variants.
RULES = [("poe", None), ("gpoe", None), ("bcm", None), ("rbcm", None), ("grbcm", None),
         ("barycenter", None), ("barycenter-paper", None), ("gpoe", "softmax-var"),
         ("rbcm", "softmax-var"), ("barycenter-paper", "softmax-var")]
TEMPERATURE = 100.0


def make_data(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 10, (n, 3))
    y = np.sin(X[:, 0]) * np.cos(X[:, 1]) + 0.1 * X[:, 2] + 0.1 * rng.standard_normal(n)
    return X, y


def train(settings) -> tuple[dict, dict]:
    X, y = make_data(settings["n"])
    J = settings["n"] // settings["per_expert"]
    partition = partition_random(len(y), J, 0)
    times, fit = [], None
    for _ in range(settings["train_repeats"]):
        start = time.perf_counter()
        fit = fit_exact_experts((X, y, partition))
        times.append(time.perf_counter() - start)
    model = fit.model
    record = {"n": len(y), "experts": J, "seconds": times, "median_seconds": median(times),
              "optimizer_steps": fit.result.steps, "converged": fit.result.converged,
              "final_loss": fit.result.final_loss,
              "lengthscale": model.kernel.lengthscale.detach().tolist(),
              "kernel_variance": model.kernel.variance.item(),
              "noise": model.likelihood.variance.item()}
    record["table"] = print_table(
        [[len(y), J, format_seconds(record["median_seconds"]), fit.result.steps]],
        ["n", "J", "median time", "L-BFGS steps"], "1. training exact experts (eq. 2)")
    return record, fit.modules


def synthetic_moments(J: int, N: int, prior: float, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    mean = torch.randn(J, N, generator=generator, dtype=torch.float64)
    var = (0.01 + 0.99 * torch.rand(J, N, generator=generator, dtype=torch.float64)) * prior
    return mean, var


def combination(settings, modules: dict) -> tuple[list[dict], str]:
    names = list(modules)
    N, rows, records = settings["test"], [], []
    for J in settings["experts"]:
        members = {name: modules[name] for name in names[:J]}  # the first taken as grBCM's
        members[names[0]] = replace(members[names[0]],  # communication expert (timing only)
                                    info={**members[names[0]].info, "role": "communication"})
        experts = ModuleExperts(members)
        prior = experts.prior_var(torch.empty(N, 1))
        mean, var = synthetic_moments(J, N, float(prior[0]))
        total = 0.0
        for rule, weights in RULES:
            c = ExpertCombination(experts, rule, weights, TEMPERATURE)
            seconds = median_time(lambda c=c, m=mean, v=var, p=prior: c.combine_moments(m, v, p),
                                  repeats=settings["repeats"])
            total += seconds
            records.append({"experts": J, "points": N, "rule": rule, "weights": weights,
                            "seconds": seconds})
            rows.append([J, rule, weights or "(own)", format_seconds(seconds),
                         f"{seconds / (J * N) * 1e9:.1f}"])
        records.append({"experts": J, "points": N, "rule": "all", "seconds": total})
        rows.append([J, "all rules", "", format_seconds(total), f"{total / (J * N) * 1e9:.1f}"])
    return records, print_table(rows, ["J", "rule", "weights", "median time",
                                       "ns per expert·point"],
                                f"2. combining expert moments [J, {N}]")


def moments(settings, modules: dict) -> tuple[list[dict], str]:
    names = list(modules)
    X, _ = make_data(settings["moment_points"], seed=1)
    rows, records = [], []
    for J in settings["experts"]:
        members = {name: modules[name] for name in names[:J]}  # the first taken as grBCM's
        members[names[0]] = replace(members[names[0]],  # communication expert (timing only)
                                    info={**members[names[0]].info, "role": "communication"})
        experts = ModuleExperts(members)
        seconds = median_time(lambda e=experts: e.predict_f(X), repeats=settings["repeats"])
        per_pair = seconds / (J * len(X))
        records.append({"experts": J, "points": len(X), "seconds": seconds,
                        "seconds_per_pair": per_pair,
                        "extrapolated_seconds_for_test": per_pair * J * settings["test"]})
        rows.append([J, len(X), format_seconds(seconds), f"{per_pair * 1e6:.2f}",
                     format_seconds(per_pair * J * settings["test"])])
    return records, print_table(rows, ["J", "N", "median time", "µs per expert·point",
                                       f"extrapolated to N = {settings['test']}"],
                                "3. expert moments (batched conditionals, M = 100)")


def end_to_end(settings, modules: dict) -> tuple[dict, str]:
    J = settings["end_to_end_experts"]
    c = ExpertCombination({name: modules[name] for name in list(modules)[:J]}, "gpoe",
                          "softmax-var", TEMPERATURE)
    X, _ = make_data(settings["test"], seed=2)
    seconds = median_time(lambda: c.predict_f(X), repeats=settings["repeats"], warmup=0)
    text = print_table([[J, len(X), format_seconds(seconds)]], ["J", "N", "median time"],
                       "4. end to end: ExpertCombination.predict_f (gPoE, softmax-var)")
    return {"experts": J, "points": len(X), "seconds": seconds}, text


def main(argv=None) -> None:
    parser = benchmark_parser(__doc__.split("\n")[0], "experts",
                              out_help="JSON output (default: {default}); the report is written "
                                       "next to it as .md")
    args = parser.parse_args(argv)
    apply_threads(args)
    mode = "quick" if args.quick else "full"
    settings = SETTINGS[mode]
    start = time.perf_counter()
    out = {"mode": mode, "settings": settings, "machine": machine_info()}
    out["training"], modules = train(settings)
    texts = [out["training"].pop("table")]
    for key, measure in [("combination", combination), ("moments", moments),
                         ("end_to_end", end_to_end)]:
        out[key], text = measure(settings, modules)
        texts.append(text)
    out["total_seconds"] = time.perf_counter() - start
    machine = out["machine"]
    machine["load_average_end"] = load_average()
    path = write_json(output_path(args, "experts"), out)
    header = (f"# Products of experts benchmark ({mode} mode)\n\nCommit {machine['commit']} "
              f"(uncommitted changes: {machine['dirty']}; pyrogp_models "
              f"{machine['pyrogp_models']}); torch threads {machine['torch_threads']}; load "
              f"average {machine['load_average']} at the start, {machine['load_average_end']} at "
              f"the end (a shared 2-core machine: times are medians over repeats and noisy); "
              f"total {out['total_seconds']:.0f} s. Training: `fit_exact_experts` with its "
              f"default L-BFGS.\n")
    blocks = "\n".join(f"```\n{text}\n```\n" for text in texts)
    path.with_suffix(".md").write_text(header + "\n" + blocks, encoding="utf-8")
    print(f"wrote {path} in {out['total_seconds']:.0f} s")


if __name__ == "__main__":
    main()
