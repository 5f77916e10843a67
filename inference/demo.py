"""``make demo``: the recycling pipeline on the NASA sunspot series, end to end.

1. Data: x = year, y = log(1 + monthly mean sunspot number); 20% of the months are held out at
   random for testing and 15% of the rest for validation; the models are fitted on the others.
2. Local modules: one sparse GP per contiguous block of time, saved to ``modules/``.
3. A meta-GP recycled from the modules alone (no data), saved as ``meta.safetensors``.
4. A full-data SVGP with the meta-GP's M, fitted on the same points (one partition).
5. Products of experts of the modules: PoE, BCM and softmax-variance weighted gPoE, rBCM and W2
   barycenter over a few temperatures; the one with the best validation NLPD is kept.

It prints the test metrics of each model and draws ``pipeline.png``. Run
``python -m pyrogp_models.inference.demo`` (``--fast`` for a smoke run of a few seconds).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from pyrogp_models.inference import local_fit, recycling
from pyrogp_models.inference.commands.common import one_line_warnings, write_module_folder
from pyrogp_models.inference.local_fit import LocalFitSpec, fit_local
from pyrogp_models.inference.metrics import regression_report
from pyrogp_models.inference.recycling import RecycleSpec, recycle
from pyrogp_models.inference.trainer import TrainConfig

from pyrogp_models.data import load_sunspots
from pyrogp_models.data.columns import Columns
from pyrogp_models.data.partitioners import partition_contiguous, partition_random
from pyrogp_models.models.experts import ExpertCombination, ModuleExperts
from pyrogp_models.modules.files import save_module
from pyrogp_models.modules.predictor import Predictor
from pyrogp_models.modules.record import Module
from pyrogp_models.modules.routing import RoutedModules
from pyrogp_models.text import format_table

OUTPUT = Path("demo_output")
SEED = 0
TEST_FRACTION = 0.2
VALIDATION_FRACTION = 0.15
KERNEL = "matern32"
COLUMNS = Columns(["year"], "log1p_sunspots")
RULE_NAMES = {"poe": "PoE", "bcm": "BCM", "gpoe": "gPoE", "rbcm": "rBCM",
              "barycenter": "W2 barycenter"}


@dataclass(frozen=True)
class Settings:
    """Sizes of the demo: blocks of time, M per module, M of the meta-GP and of the full SVGP,
    a cap on the training steps (None: the library's defaults, which stop when converged),
    softmax temperatures tried, and every ``stride``-th month used."""

    num_partitions: int = 10
    local_inducing: int = 16
    global_inducing: int = 160
    steps: int | None = None
    temperatures: tuple[float, ...] = (1.0, 10.0, 100.0)
    stride: int = 1


FAST = Settings(num_partitions=4, local_inducing=8, global_inducing=32, steps=30,
                temperatures=(10.0,), stride=4)


def capped(config: TrainConfig, steps: int | None) -> TrainConfig:
    """A default training configuration with the demo's seed and at most ``steps`` steps."""
    return replace(config, seed=SEED, steps=config.steps if steps is None else steps)


def sunspot_series(stride: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """x: the year at mid-month [N, 1]; y: log(1 + monthly mean sunspot number) [N]."""
    table = load_sunspots()
    years = table.column("year") + (table.column("month") - 0.5) / 12
    return years[::stride, None], np.log1p(table.column("sunspots"))[::stride]


def split(num_points: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Boolean masks (fit, validation, test): test and validation points drawn at random."""
    order = np.random.default_rng(seed).permutation(num_points)
    num_test = round(TEST_FRACTION * num_points)
    num_validation = round(VALIDATION_FRACTION * (num_points - num_test))
    masks = []
    for rows in (order[num_test + num_validation:], order[num_test:num_test + num_validation],
                 order[:num_test]):
        mask = np.zeros(num_points, dtype=bool)
        mask[rows] = True
        masks.append(mask)
    return masks[0], masks[1], masks[2]


def best_combination(modules: dict[str, Module], X, y, temperatures: tuple[float, ...]
                     ) -> tuple[str, ExpertCombination, int]:
    """The expert combination with the lowest NLPD on (X, y): its label, the predictor and how
    many were tried. The experts' moments are computed once and shared by every candidate."""
    experts = ModuleExperts(modules)
    candidates = [("poe", None, None), ("bcm", None, None)] + [
        (rule, "softmax-var", temperature) for rule in ("gpoe", "rbcm", "barycenter")
        for temperature in temperatures]
    with torch.no_grad():
        mean, var = experts.predict_f(X)
        prior_var = experts.prior_var(X)
        scored = []
        for rule, weights, temperature in candidates:
            combination = ExpertCombination(experts, rule, weights, temperature)
            combined = combination.combine_moments(mean, var, prior_var)
            scored.append((-float(combination.y_log_density(y, *combined).mean()),
                           rule, weights, temperature))
    _, rule, weights, temperature = min(scored, key=lambda entry: entry[0])
    label = RULE_NAMES[rule] + (f", softmax-var T={temperature:g}" if weights else "")
    return label, ExpertCombination(experts, rule, weights, temperature), len(candidates)


def score(predictor: Predictor, X, y) -> dict[str, float | int]:
    """NLPD, RMSE, MAE and 95% coverage on (X, y)."""
    with torch.no_grad():
        mean, var = predictor.predict_y(X)
        log_density = predictor.log_predictive(X, y)
    return regression_report(y, mean, var, log_density)


def plot(path: Path, X, y, test, predictors: dict[str, Predictor], boundaries) -> None:
    """Data, the meta-GP's mean ± 2 sd (of y) and the other models' means: the whole series and
    the last sixty years."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = np.linspace(X.min(), X.max(), 4000)[:, None]
    with torch.no_grad():
        curves = {label: [t.numpy() for t in p.predict_y(grid)] for label, p in predictors.items()}
    figure, axes = plt.subplots(2, 1, figsize=(12, 7))
    for axis, start in zip(axes, (X.min(), X.max() - 60), strict=True):
        axis.plot(X[~test, 0], y[~test], ".", ms=2, color="0.6",
                  label="training + validation months")
        axis.plot(X[test, 0], y[test], ".", ms=2, color="tab:orange", label="test months")
        for (label, (mean, var)), style in zip(curves.items(), ("-", "--", ":"), strict=True):
            axis.plot(grid[:, 0], mean, style, lw=1.2, label=label)
            if style == "-":
                sd = np.sqrt(var)
                axis.fill_between(grid[:, 0], mean - 2 * sd, mean + 2 * sd, alpha=0.2,
                                  label=f"{label} ± 2 sd")
        for boundary in boundaries:
            axis.axvline(boundary, color="0.3", lw=0.5, ls=":")
        axis.set_xlim(start, X.max())
        axis.set_ylabel("log(1 + sunspots)")
    axes[0].set_title("Sunspots: meta-GP recycled from local modules vs full SVGP and the best "
                      "product of experts (dotted lines: module boundaries)")
    axes[1].set_xlabel("year")
    axes[0].legend(loc="upper left", ncol=3, fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(fast: bool = False, output: Path = OUTPUT) -> dict[str, dict[str, float | int]]:
    """Run the pipeline (``fast``: tiny settings); returns the test metrics by model."""
    torch.set_num_threads(1)  # small batched problems: threads only add contention
    settings = FAST if fast else Settings()
    local_spec = LocalFitSpec(settings.local_inducing, kernel=KERNEL, columns=COLUMNS)
    meta_spec = RecycleSpec(settings.global_inducing)
    full_spec = LocalFitSpec(settings.global_inducing, kernel=KERNEL)
    X, y = sunspot_series(settings.stride)
    fit, validation, test = split(len(y), SEED)
    output.mkdir(parents=True, exist_ok=True)
    timings = {}

    start = time.perf_counter()
    partition = partition_contiguous(X[fit], settings.num_partitions)
    local = fit_local((X[fit], y[fit], partition), local_spec,
                      capped(local_fit.default_config(local_spec), settings.steps))
    modules = local.modules
    write_module_folder(modules, output / "modules", partition.rule)
    timings["local"] = time.perf_counter() - start

    start = time.perf_counter()
    meta = recycle(modules, meta_spec, capped(recycling.COLLAPSED_CONFIG, settings.steps)).module
    save_module(meta, output / "meta.safetensors")
    timings["meta"] = time.perf_counter() - start

    start = time.perf_counter()
    full = fit_local((X[fit], y[fit], partition_random(int(fit.sum()), 1, SEED)), full_spec,
                     capped(local_fit.default_config(full_spec), settings.steps))
    timings["full"] = time.perf_counter() - start

    start = time.perf_counter()
    label, combination, tried = best_combination(modules, X[validation], y[validation],
                                                 settings.temperatures)
    timings["combination"] = time.perf_counter() - start

    models = {
        f"local modules, routed (K={settings.num_partitions}, M={settings.local_inducing})":
            ("local", RoutedModules(modules, partition.rule)),
        f"meta-GP from the modules (M={settings.global_inducing})": ("meta", meta),
        f"full-data SVGP (M={settings.global_inducing})": ("full", full.predictor),
        f"best of {tried} expert combinations: {label}": ("combination", combination),
    }
    reports = {name: score(predictor, X[test], y[test])
               for name, (_, predictor) in models.items()}
    plot(output / "pipeline.png", X, y, test,
         {name: predictor for name, (key, predictor) in models.items() if key != "local"},
         partition.rule["boundaries"])

    print(f"Sunspots {X.min():.0f}-{X.max():.0f}, y = log(1 + monthly mean), months drawn at "
          f"random: {fit.sum()} to fit, {validation.sum()} to choose the expert combination, "
          f"{test.sum()} to test.\n")
    rows = [(name, report["nlpd"], report["rmse"], report["mae"], report["coverage95"],
             timings[models[name][0]]) for name, report in reports.items()]
    print(format_table(["model (test set)", "NLPD", "RMSE", "MAE", "coverage95", "fit s"], rows))
    print(f"\nThe meta-GP and the combinations start from the local modules: their times add to "
          f"the local fit's.\nWritten to {output}/: modules/, meta.safetensors, pipeline.png")
    return reports


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="tiny settings, a few seconds")
    parser.add_argument("--out", type=Path, default=OUTPUT, help="output folder")
    arguments = parser.parse_args()
    with one_line_warnings("the demo's settings cap the steps"):
        main(arguments.fast, arguments.out)
