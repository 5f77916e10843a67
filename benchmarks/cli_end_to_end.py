"""The command line end to end with its defaults: 10⁶ points, 5000 contiguous partitions.

A user's pipeline, one ``pyrogp`` process per stage, timed from the CSV on disk:

1. ``pyrogp fit-local train.csv --target y --partition-by contiguous --partitions 5000
   --inducing 3 --out modules`` — the local fits (M_k = 3);
2. ``pyrogp recycle modules --inducing 35 --out meta`` — the meta-GP from the modules alone;
3. ``pyrogp evaluate meta --data test.csv --target f --json`` — RMSE against the true f.

The reference is a full-data SVGP fitted by the same command line with the same M
(``fit-local ... --partition-by random --partitions 1 --inducing 35``: the collapsed bound on all
10⁶ points), and the constant predictor. Data: x uniform on [0, 5], y = f(x) + 2ε with
f(x) = 9/2 cos(2πx + 3π/2) − 3 sin(43π/10 x + 3π/10) (the meta-GP benchmark's function); the
test file holds f on a grid of 10⁴ points of [0, 5] with its noisy y.

Run ``python benchmarks/cli_end_to_end.py`` (``--quick``: 2·10⁴ points in 100 partitions).
Writes ``benchmarks/results/cli_end_to_end.json``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import benchmark_parser, machine_info, output_path, print_table, write_json  # noqa: E402
from meta_gp import smooth_function  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NOISE_STD = 2.0


@dataclass(frozen=True)
class Settings:
    points: int = 1_000_000
    partitions: int = 5000
    local_inducing: int = 3
    global_inducing: int = 35
    test_points: int = 10_000
    seed: int = 0


QUICK = Settings(points=20_000, partitions=100, test_points=2000)


def write_data(folder: Path, s: Settings) -> tuple[Path, Path]:
    """train.csv (x, y) and test.csv (x, f, y)."""
    rng = np.random.default_rng(s.seed)
    x = rng.uniform(0.0, 5.0, s.points)
    y = smooth_function(x) + NOISE_STD * rng.standard_normal(s.points)
    grid = np.linspace(0.0, 5.0, s.test_points)
    f = smooth_function(grid)
    noisy = f + NOISE_STD * rng.standard_normal(s.test_points)
    train, test = folder / "train.csv", folder / "test.csv"
    np.savetxt(train, np.column_stack([x, y]), delimiter=",", header="x,y", comments="",
               fmt="%.9g")
    np.savetxt(test, np.column_stack([grid, f, noisy]), delimiter=",", header="x,f,y",
               comments="", fmt="%.9g")
    return train, test


def pyrogp(*args) -> tuple[float, str, str]:
    """Run one ``pyrogp`` command in a fresh process; its wall seconds, stdout and stderr."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pyrogp_models.inference.cli", *map(str, args)],
                          cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"pyrogp {' '.join(map(str, args))} failed:\n{done.stderr}")
    return seconds, done.stdout, done.stderr


def evaluate(model: Path, test: Path) -> dict:
    """RMSE against f (``--target f``) and NLPD of the noisy y, from ``pyrogp evaluate``."""
    against_f = json.loads(pyrogp("evaluate", model, "--data", test, "--target", "f",
                                  "--json")[1].strip().splitlines()[-1])
    noisy = json.loads(pyrogp("evaluate", model, "--data", test, "--target", "y",
                              "--json")[1].strip().splitlines()[-1])
    return {"rmse_f": against_f["rmse"], "nlpd_y": noisy["nlpd"]}


def main() -> None:
    args = benchmark_parser(__doc__.splitlines()[0], "cli_end_to_end", threads=False).parse_args()
    s = QUICK if args.quick else Settings()
    out = output_path(args, "cli_end_to_end")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        train, test = write_data(folder, s)
        print(f"{s.points} points in {s.partitions} contiguous partitions", flush=True)
        stages = {}
        stages["fit_local"], fit_out, fit_err = pyrogp(
            "fit-local", train, "--target", "y", "--partition-by", "contiguous",
            "--partitions", s.partitions, "--inducing", s.local_inducing,
            "--out", folder / "modules")
        stages["recycle"], recycle_out, recycle_err = pyrogp(
            "recycle", folder / "modules", "--inducing", s.global_inducing,
            "--out", folder / "meta")
        start = time.perf_counter()
        meta = evaluate(folder / "meta", test)
        stages["evaluate"] = (time.perf_counter() - start) / 2
        full_seconds, full_out, full_err = pyrogp(
            "fit-local", train, "--target", "y", "--partition-by", "random", "--partitions", 1,
            "--inducing", s.global_inducing, "--out", folder / "full")
        full = evaluate(folder / "full", test)
    f = smooth_function(np.linspace(0.0, 5.0, s.test_points))
    constant = float(np.sqrt(np.mean((f - f.mean()) ** 2)))
    total = stages["fit_local"] + stages["recycle"] + stages["evaluate"]
    rows = [["local fits + meta-GP", f"{total:.1f}", f"{meta['rmse_f']:.4f}",
             f"{meta['nlpd_y']:.4f}"],
            ["full-data SVGP", f"{full_seconds:.1f}", f"{full['rmse_f']:.4f}",
             f"{full['nlpd_y']:.4f}"],
            ["constant (mean of f)", "", f"{constant:.4f}", ""]]
    print_table(rows, ["model", "seconds", "RMSE vs f", "NLPD of y"],
                title=f"\nCLI defaults, N={s.points}, K={s.partitions}, M_k={s.local_inducing}, "
                      f"M={s.global_inducing}")
    print(f"stages: fit-local {stages['fit_local']:.1f} s, recycle {stages['recycle']:.1f} s, "
          f"evaluate {stages['evaluate']:.1f} s (each a fresh process, imports included)")
    warned = [line for line in (fit_err + recycle_err + full_err).splitlines()
              if "warning" in line.lower()]
    for line in warned:
        print(f"  {line}")
    payload = {
        "benchmark": "cli_end_to_end", "mode": "quick" if args.quick else "full",
        "machine": machine_info(), "settings": asdict(s),
        "stages_seconds": stages, "end_to_end_seconds": total, "meta_gp": meta,
        "full_svgp": {**full, "seconds": full_seconds}, "constant_rmse_f": constant,
        "rmse_ratio_to_full_svgp": meta["rmse_f"] / full["rmse_f"],
        "warnings": warned,
        "outputs": {"fit_local": fit_out.strip().splitlines()[-1],
                    "recycle": recycle_out.strip().splitlines()[-1],
                    "full_svgp": full_out.strip().splitlines()[-1]},
        "notes": ["Every stage is a fresh `python -m pyrogp_models.inference.cli` process "
                  "(import time included), with the command line's defaults and no tuning flag.",
                  "The evaluate time is the mean of the two evaluate calls."],
    }
    print(f"JSON written to {write_json(out, payload)}")


if __name__ == "__main__":
    main()
