"""Plain helpers shared by several test modules: CSV data files, in-process ``pyrogp`` runs and
quick benchmark runs. Import them as ``from helpers import ...`` (``tests`` is on the path)."""

import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from inference.cli import main

ROOT = Path(__file__).resolve().parents[1]


def write_csv(path, columns: dict[str, np.ndarray]):
    """Write equal-length columns to ``path`` as CSV with a header row; returns ``path``."""
    np.savetxt(path, np.column_stack(list(columns.values())), delimiter=",",
               header=",".join(columns), comments="")
    return path


def run_ok(capsys, *argv) -> str:
    """Run a ``pyrogp`` command that must succeed; returns what it printed to stdout."""
    capsys.readouterr()
    assert main([str(arg) for arg in argv]) == 0
    return capsys.readouterr().out


def run_failing(capsys, *argv) -> str:
    """Run a ``pyrogp`` command that must fail; returns its one-line error message."""
    capsys.readouterr()
    code = main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    assert code == 2
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pyrogp: error: "), captured.err
    return lines[0]


def run_quick_benchmark(script: str, out: Path, budget_seconds: float) -> str:
    """Run ``benchmarks/<script> --quick --out <out>`` from the repository root; asserts it
    succeeds within ``budget_seconds`` and returns its stdout."""
    start = time.perf_counter()
    completed = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--quick", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=budget_seconds)
    elapsed = time.perf_counter() - start
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert elapsed < budget_seconds
    return completed.stdout
