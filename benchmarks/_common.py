"""Small helpers shared by the benchmark scripts: options, timing, machine info, tables, JSON.

Timings on a shared machine are noisy, so every comparison should be made *inside one run*,
with the contenders interleaved (:func:`interleaved_times`) and summarised by medians.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

#: Where benchmark scripts write their JSON results.
RESULTS_DIR = Path(__file__).resolve().parent / "results"


def benchmark_parser(description: str, name: str, *,
                     out_help: str = "JSON output (default: {default})", threads: bool = True,
                     **options: Any) -> argparse.ArgumentParser:
    """An argument parser with the options the benchmark scripts share: ``--quick``, ``--out``
    and, with ``threads``, ``--threads`` (see :func:`apply_threads`). ``{default}`` in
    ``out_help`` stands for ``benchmarks/results/<name>[_quick].json`` (see :func:`output_path`);
    ``options`` go to :class:`argparse.ArgumentParser`."""
    parser = argparse.ArgumentParser(description=description, **options)
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
    parser.add_argument("--out", type=Path, default=None,
                        help=out_help.format(default=f"benchmarks/results/{name}[_quick].json"))
    if threads:
        parser.add_argument("--threads", type=int, default=1,
                            help="torch intra-op threads (default 1; 0 keeps torch's default)")
    return parser


def apply_threads(args: argparse.Namespace) -> None:
    """Run torch on ``args.threads`` intra-op threads (0 keeps torch's default)."""
    import torch

    if args.threads > 0:
        torch.set_num_threads(args.threads)


def output_path(args: argparse.Namespace, name: str) -> Path:
    """``--out``, or else ``RESULTS_DIR/<name>.json`` (``<name>_quick.json`` with ``--quick``)."""
    return args.out or RESULTS_DIR / f"{name}{'_quick' if args.quick else ''}.json"


def median(values: Sequence[float]) -> float:
    """Median of a non-empty sequence (NaN when empty)."""
    return statistics.median(values) if len(values) else math.nan


def time_call(fn: Callable[[], Any], number: int = 1) -> float:
    """Seconds per call of ``fn``, averaged over ``number`` consecutive calls."""
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


def median_time(fn: Callable[[], Any], repeats: int = 5, number: int = 1,
                warmup: int = 1) -> float:
    """Median over ``repeats`` of the mean seconds per call of ``number`` consecutive calls."""
    for _ in range(warmup):
        fn()
    return median([time_call(fn, number) for _ in range(repeats)])


def interleaved_times(fns: dict[str, Callable[[], Any]], repeats: int = 5, number: int = 1,
                      warmup: int = 1) -> dict[str, list[float]]:
    """Seconds per call of every function, measured in rounds that interleave them.

    Each round times ``number`` consecutive calls of every function; the order of the functions
    is reversed every other round (ABBA), so slow drifts in machine load affect all of them
    alike. Returns the ``repeats`` per-call times of each function, in round order.
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    names = list(fns)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(repeats):
        order = names if round_index % 2 == 0 else names[::-1]
        for name in order:
            times[name].append(time_call(fns[name], number))
    return times


def paired_ratios(numerator: Sequence[float], denominator: Sequence[float]) -> list[float]:
    """Round-by-round ratios of two interleaved timing series."""
    return [a / b for a, b in zip(numerator, denominator, strict=True)]


def machine_info() -> dict[str, Any]:
    """CPU, library versions, thread settings, load and date of this run, and the CPU time of
    the reference operation (:mod:`_reference`): benchmark times divided by it compare across
    machines and loads."""
    import numpy
    import torch
    from _reference import reference_seconds

    info: dict[str, Any] = {
        "date_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "numpy": numpy.__version__,
        "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
    }
    info["reference_seconds"] = reference_seconds()
    info.update(source_version())
    for name in ("pyro", "gpytorch"):
        try:
            info[name] = __import__(name).__version__
        except ImportError:
            info[name] = None
    info["load_average"] = load_average()
    return info


def source_version() -> dict[str, Any]:
    """The library version and the git commit the results come from (``dirty``: the code — the
    library, the command line or the benchmarks — differed from that commit; None outside a git
    checkout)."""
    import subprocess

    import pyrogp_models

    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                                  timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    status = git("status", "--porcelain", "--untracked-files=no", "--", "pyrogp_models",
                 "inference", "benchmarks", ":!benchmarks/results", "pyproject.toml")
    return {"pyrogp_models": pyrogp_models.__version__, "commit": git("rev-parse", "HEAD"),
            "dirty": None if status is None else bool(status)}


def load_average() -> list[float] | None:
    """1, 5 and 15 minute load averages (None where the OS does not report them)."""
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def write_json(name: str | Path, payload: dict[str, Any]) -> Path:
    """Write ``payload`` as indented JSON to ``RESULTS_DIR/<name>.json`` (or to a path ending in
    ``.json``), creating the folder; returns the path. NaN and infinities become ``null``;
    tensors and arrays become lists."""
    path = Path(name)
    if path.suffix != ".json":
        path = RESULTS_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(json_safe(payload), indent=2, default=_json_default, allow_nan=False)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(text + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def json_safe(value: Any) -> Any:
    """``value`` with NaN/inf floats replaced by None, recursively through dicts and lists."""
    if isinstance(value, float):
        return finite_or_none(value)
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    if hasattr(value, "tolist") and not isinstance(value, str):
        return json_safe(value.tolist())
    return value


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    return str(value)


def finite_or_none(value: float | None) -> float | None:
    """JSON has no NaN/inf: map them to None."""
    if value is None or not math.isfinite(value):
        return None
    return value


def format_seconds(seconds: float | None) -> str:
    """Human-readable duration: µs, ms or s with 3 significant figures."""
    if seconds is None or not math.isfinite(seconds):
        return "n/a"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.3g} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.3g} s"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """The lines of a Markdown table: the header row, its separator, then one line per row."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(str(cell) for cell in row) + " |" for row in rows)]


def agg_pyplot():
    """matplotlib's pyplot on the Agg backend: the scripts only write image files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def print_table(rows: Sequence[Sequence[Any]], headers: Sequence[str], title: str | None = None
                ) -> str:
    """Print (and return) a plain-text table with right-aligned columns."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[j]) for row in cells) for j in range(len(headers))]
    lines = []
    if title:
        lines.append(title)
    lines.append("  ".join(c.rjust(w) for c, w in zip(cells[0], widths, strict=True)))
    lines.append("  ".join("-" * w for w in widths))
    for row in cells[1:]:
        lines.append("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
    text = "\n".join(lines)
    print(text, flush=True)
    return text
