"""``make demo``: local GPs on the NASA sunspot series, each tested on its own held-out points.

The series (monthly, 1749–2015) is cut into contiguous blocks of time; one sparse GP is fitted
per block on 80% of its months, and the other 20%, picked at random within each block, are
predicted by routing them through the stored partition rule. Run ``python -m inference.demo``.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from inference.commands.common import write_module_folder
from inference.local_fit import LocalFitSpec, fit_local
from inference.metrics import regression_report
from inference.tables import format_table
from inference.trainer import TrainConfig
from pyrogp_models.data import load_sunspots
from pyrogp_models.partition import Partition, partition_contiguous
from pyrogp_models.routed import RoutedModules

NUM_PARTITIONS = 10
NUM_INDUCING = 12
TEST_FRACTION = 0.2
SEED = 0
SPEC = LocalFitSpec(num_inducing=NUM_INDUCING, kernel="matern32", collapsed=True)
CONFIG = TrainConfig(optimizer="lbfgs", lr=1.0, steps=20, tol=None, seed=SEED)
OUTPUT = Path("demo_output/modules")


def sunspot_series() -> tuple[np.ndarray, np.ndarray]:
    """x: years since 1749-01 [N, 1]; y: log(1 + monthly mean sunspot number) [N]."""
    table = load_sunspots()
    months = (table.column("year") - 1749) * 12 + table.column("month") - 1
    return (months / 12)[:, None], np.log1p(table.column("sunspots"))


def held_out_rows(partition: Partition, fraction: float, seed: int) -> np.ndarray:
    """A boolean mask [N] marking a random ``fraction`` of every partition's points."""
    rng = np.random.default_rng(seed)
    test = np.zeros(partition.assignments.size, dtype=bool)
    for k in range(partition.num_partitions):
        rows = partition.indices(k)
        test[rng.choice(rows, size=round(fraction * rows.size), replace=False)] = True
    return test


def main() -> None:
    torch.set_num_threads(1)  # ten 256-point problems: threads only add contention
    start = time.perf_counter()
    X, y = sunspot_series()
    partition = partition_contiguous(X, NUM_PARTITIONS)
    test = held_out_rows(partition, TEST_FRACTION, SEED)
    train = Partition.from_rule(partition.rule, partition.assignments[~test])
    fit = fit_local(X[~test], y[~test], train, SPEC, CONFIG)
    info = {"features": ["years_since_1749"], "target": "log1p_sunspots"}
    modules = {name: replace(module, info={**module.info, **info})
               for name, module in fit.modules.items()}
    routed = RoutedModules(modules, partition.rule)

    X_test, y_test = X[test], y[test]
    with torch.no_grad():
        mean, var = (t.numpy() for t in routed.predict_y(X_test))
        log_density = routed.log_predictive(X_test, y_test).numpy()
    destination = routed.route(X_test)
    rows = []
    for k, (name, module) in enumerate(modules.items()):
        mine = destination == k
        years = X[partition.indices(k), 0]
        report = regression_report(y_test[mine], mean[mine], var[mine], log_density[mine])
        rows.append((name, f"{1749 + years.min():.0f}-{1749 + years.max():.0f}",
                     module.num_data, report["n"], report["nlpd"], report["rmse"],
                     report["mae"], report["coverage95"]))
    overall = regression_report(y_test, mean, var, log_density)
    rows.append(("overall", "", len(y) - len(y_test), overall["n"], overall["nlpd"],
                 overall["rmse"], overall["mae"], overall["coverage95"]))
    write_module_folder(modules, OUTPUT, partition.rule)

    print(f"Sunspots, log(1 + monthly mean): {NUM_PARTITIONS} contiguous blocks of time, "
          f"M = {NUM_INDUCING}, {TEST_FRACTION:.0%} of each block held out\n")
    headers = ["module", "years", "N train", "N test", "nlpd", "rmse", "mae", "coverage95"]
    print(format_table(headers, rows))
    print(f"\nmodules written to {OUTPUT}/ in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
