"""The benchmark guard (benchmarks/bench_check.py) on a clock that counts work instead of
seconds: the cost of a meta-GP evaluation in Cholesky factorisations, the reference operation a
fixed number of them. So the guard's whole path — measuring against the reference, comparing
with a baseline file, the exit status — is checked exactly, whatever the machine's load, and no
test times the library."""

import importlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from pyrogp_models.data import Standardisation
from pyrogp_models.kernels import Stationary, stationary_kernel
from pyrogp_models.models.meta.meta_gp import MetaGP
from pyrogp_models.modules.record import Module
from pyrogp_models.modules.stack import ModuleStack

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def bench_check():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module("bench_check")
    finally:
        sys.path.remove(str(BENCHMARKS))


class CholeskyClock:
    """Counts Cholesky factorisations (every call of torch.linalg.cholesky_ex, which the
    library's factorisations go through) plus the reference's fixed units of work."""

    def __init__(self, monkeypatch):
        self.count = 0.0
        original = torch.linalg.cholesky_ex

        def counting(matrix, *args, **kwargs):
            self.count += 1
            return original(matrix, *args, **kwargs)

        monkeypatch.setattr(torch.linalg, "cholesky_ex", counting)

    def __call__(self) -> float:
        return self.count

    def reference(self, units: float = 1.0):
        def run():
            self.count += units
        return run


def meta_gp_objective():
    """The collapsed bound + gradient of a small meta-GP (two modules)."""
    identity = Standardisation(np.zeros(1), np.ones(1), 0.0, 1.0)
    generator = torch.Generator().manual_seed(0)
    modules = {}
    for k in range(2):
        Z = torch.linspace(0.0, 1.0, 3, dtype=torch.float64).unsqueeze(-1) + k
        kernel = stationary_kernel("rbf", torch.tensor([[0.6]], dtype=torch.float64),
                                   torch.tensor([1.0], dtype=torch.float64), 1)
        modules[f"m{k}"] = Module(
            kernel, "gaussian", {},
            {"variance": torch.tensor(0.1, dtype=torch.float64)}, Z,
            torch.randn(1, 3, generator=generator, dtype=torch.float64),
            0.3 * torch.eye(3, dtype=torch.float64).unsqueeze(0), 10, 0.0, identity, 1e-6)
    meta = MetaGP(ModuleStack.from_modules(modules),
                  torch.linspace(0.0, 2.0, 5, dtype=torch.float64).unsqueeze(-1),
                  Stationary("rbf", 1, (), False, 0.6, 1.0, torch.float64), collapsed=True)

    def run():
        meta.zero_grad(set_to_none=True)
        meta.collapsed_bound().backward()

    return run


def guard(bench_check, clock, baseline, *extra):
    check = bench_check.Check("meta_gp_tiny", "meta_gp", "tiny meta-GP", meta_gp_objective,
                              rounds=3)
    return bench_check.main(["--baseline", str(baseline), *extra], checks=[check],
                            reference=clock.reference(), clock=clock)


def test_the_guard_passes_unchanged_code_and_catches_a_repeated_cholesky(
        bench_check, monkeypatch, tmp_path):
    clock = CholeskyClock(monkeypatch)
    baseline = tmp_path / "bench_check.json"
    assert guard(bench_check, clock, baseline, "--update") == 0
    committed = json.loads(baseline.read_text())["checks"]["meta_gp_tiny"]
    assert committed["figure"] > 0 and committed["reference_seconds"] == 1.0
    assert guard(bench_check, clock, baseline) == 0

    repeated = torch.linalg.cholesky_ex  # the slowdown: every factorisation done twice

    def twice(matrix, *args, **kwargs):
        repeated(matrix, *args, **kwargs)
        return repeated(matrix, *args, **kwargs)

    monkeypatch.setattr(torch.linalg, "cholesky_ex", twice)
    assert guard(bench_check, clock, baseline) == 1


def test_a_uniformly_slower_machine_is_not_a_regression(bench_check, monkeypatch, tmp_path):
    """Work and reference both three times as costly: the figures, and the verdict, stay."""
    clock = CholeskyClock(monkeypatch)
    baseline = tmp_path / "bench_check.json"
    assert guard(bench_check, clock, baseline, "--update") == 0
    slow = torch.linalg.cholesky_ex

    def thrice(matrix, *args, **kwargs):
        clock.count += 2
        return slow(matrix, *args, **kwargs)

    monkeypatch.setattr(torch.linalg, "cholesky_ex", thrice)
    check = bench_check.Check("meta_gp_tiny", "meta_gp", "tiny meta-GP", meta_gp_objective,
                              rounds=3)
    assert bench_check.main(["--baseline", str(baseline)], checks=[check],
                            reference=clock.reference(3.0), clock=clock) == 0


class RampClock:
    """A clock on which the machine's load rises steadily with the work done: a unit of work
    done when w units are done already costs 1 + rate·w."""

    def __init__(self, rate: float):
        self.rate, self.work, self.time = rate, 0.0, 0.0

    def __call__(self) -> float:
        return self.time

    def work_of(self, units: float):
        def run():
            self.time += units * (1.0 + self.rate * (self.work + 0.5 * units))
            self.work += units
        return run


def test_a_load_that_rises_during_a_long_operation_does_not_read_as_a_regression(bench_check):
    """One round of an operation of 50 units against a reference of 1 while the load doubles
    over the operation: the figure is the work ratio, 50 (timing the reference only before the
    operation read 62.6)."""
    clock = RampClock(rate=0.02)
    measured = bench_check.measure(clock.work_of(50.0), clock.work_of(1.0), rounds=1,
                                   clock=clock)
    assert measured.figure == pytest.approx(50.0, rel=1e-9)


def test_compare_flags_only_slowdowns_beyond_the_tolerance(bench_check):
    verdicts = bench_check.compare({"a": 1.49, "b": 1.51, "c": 0.5, "d": 1.0},
                                   {"a": 1.0, "b": 1.0, "c": 1.0}, tolerance=1.5)
    assert [v.status for v in verdicts] == ["ok", "SLOWER", "faster", "new"]
    assert verdicts[1].ratio == pytest.approx(1.51)


def test_unknown_checks_are_named(bench_check, capsys, tmp_path):
    assert bench_check.main(["--only", "nonsense", "--baseline", str(tmp_path / "b.json")]) == 2
    assert "unknown checks nonsense" in capsys.readouterr().err


def test_every_check_of_the_guard_runs_once():
    """Each real check builds and runs one operation without error (a check that no longer
    matches the library — a moved default, a command line that refuses its arguments — fails
    here, not in the next `make bench-check`); the command-line pipeline at 10⁴ points. In a
    separate process: the checks build models outside any parameter scope."""
    code = (
        "import cli_end_to_end, bench_check\n"
        "settings = cli_end_to_end.Settings\n"
        "cli_end_to_end.Settings = lambda **kw: settings(**{**kw, 'points': 10_000, "
        "'partitions': 50})\n"
        "for check in bench_check.CHECKS:\n"
        "    check.setup()()\n")
    completed = subprocess.run([sys.executable, "-c", code], cwd=BENCHMARKS, capture_output=True,
                               text=True, timeout=900)
    assert completed.returncode == 0, completed.stderr[-3000:]
