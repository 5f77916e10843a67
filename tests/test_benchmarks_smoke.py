"""Smoke test: ``benchmarks/local_fit.py --quick`` runs and writes the expected JSON (it races
GPyTorch, from the ``bench`` extra: skipped when only the ``test`` extra is installed)."""

import json
import math

import pytest

from helpers import run_quick_benchmark

pytest.importorskip("gpytorch", reason="the local-fit benchmark races GPyTorch (bench extra)")


def test_local_fit_benchmark_quick(tmp_path):
    out = tmp_path / "local_fit_quick.json"
    stdout = run_quick_benchmark("local_fit.py", out)
    assert "Batched fit vs loop of single fits" in stdout
    assert "Time per optimiser step" in stdout
    assert "fits to reach their optimum" in stdout
    assert f"JSON written to {out}" in stdout

    payload = json.loads(out.read_text())
    assert payload["benchmark"] == "local_fit"
    assert payload["mode"] == "quick"
    machine = payload["machine"]
    for key in ("cpu_count", "torch", "torch_threads", "date_utc", "pyro", "gpytorch"):
        assert machine[key] is not None, key
    assert payload["problem"]["dtype"] == "float64"
    assert payload["problem"]["likelihood"] == "gaussian"

    ks = payload["problem"]["ks"]
    loop = payload["fit_vs_loop"]
    assert [row["K"] for row in loop] == ks
    for row in loop:
        for key in ("batched_seconds", "loop_seconds", "single_fit_seconds_median", "speedup"):
            assert row[key] > 0, key
        assert isinstance(row["loop_extrapolated"], bool)
        assert row["loop_timed_partitions"] <= row["K"]
    # quick mode times the largest K's loop on a subset: the extrapolation must be declared
    assert loop[-1]["loop_extrapolated"] and loop[-1]["loop_timed_partitions"] < loop[-1]["K"]
    assert not loop[0]["loop_extrapolated"]
    assert any("scaled linearly" in note for note in payload["notes"])

    steps = payload["per_step_vs_gpytorch"]
    assert [row["K"] for row in steps] == ks
    for row in steps:
        assert row["ours_seconds"] > 0 and row["gpytorch_seconds"] > 0
        assert len(row["ours_seconds_all"]) == len(row["gpytorch_seconds_all"]) == row["rounds"]
        assert math.isclose(row["speedup"], row["gpytorch_seconds"] / row["ours_seconds"])
        # same objective at the same initial point (up to the two libraries' jitter)
        assert math.isclose(row["first_loss_ours"], row["first_loss_gpytorch"], rel_tol=5e-3)

    converge = payload["convergence"]
    assert converge["K"] == payload["settings"]["converge_k"] and converge["rtol"] == 1e-3
    names = [run["name"] for run in converge["runs"]]
    assert names[0] == "defaults" and sum(name.startswith("GPyTorch") for name in names) == 2
    for run in converge["runs"]:
        # one reference per partition, the best of all runs: no run ends above it
        assert run["final_relative_gap_max"] >= 0 and run["final_relative_gap_median"] >= 0
        assert 0 <= run["partitions_within_at_end"] <= converge["K"]
        # null means "not reached within the run"
        assert (run["all_within_step"] is None) == (run["all_within_seconds"] is None)
        if run["all_within_step"] is not None:
            assert 0 < run["all_within_step"] <= run["steps"]
    # the defaults stop when converged, and converged means within the tolerance
    assert converge["runs"][0]["stopped_by"] == "converged"
    assert converge["runs"][0]["partitions_within_at_end"] == converge["K"]

    targets = payload["targets"]
    assert set(targets) == {"fit_vs_loop", "per_step_vs_gpytorch", "defaults_to_rtol"}
    assert all(isinstance(t["met"], bool) for t in targets.values())
