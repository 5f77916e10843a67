"""Smoke test: ``benchmarks/local_fit.py --quick`` runs quickly and writes the expected JSON."""

import json
import math

from helpers import run_quick_benchmark

BUDGET_SECONDS = 40.0


def test_local_fit_benchmark_quick(tmp_path):
    out = tmp_path / "local_fit_quick.json"
    stdout = run_quick_benchmark("local_fit.py", out, BUDGET_SECONDS)
    assert "Batched fit vs loop of single fits" in stdout
    assert "Time per optimiser step" in stdout
    assert "Time for all fits to reach their reference ELBO" in stdout
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

    assert [(c["bound"], c["q_update"]) for c in payload["convergence"]] == [
        ("uncollapsed", "Adam"), ("uncollapsed", "natural gradient, γ = 1"),
        ("collapsed", "optimal (collapsed)")]
    for converge in payload["convergence"]:
        for key in ("K", "rtol", "adam_steps", "adam_seconds", "seconds_per_step",
                    "partitions_within", "lbfgs_reference_evaluations"):
            assert converge[key] is not None, key
        assert converge["K"] == payload["settings"]["converge_k"]
        assert converge["rtol"] == 1e-3
        assert 0 <= converge["partitions_within"] <= converge["K"]
        # null means "not reached within the run": both are reported either way
        for step_key, seconds_key in (("last_partition_step", "last_partition_seconds"),
                                      ("all_within_step", "all_within_seconds")):
            assert (converge[step_key] is None) == (converge[seconds_key] is None)
            if converge[step_key] is not None:
                assert 0 < converge[step_key] <= converge["adam_steps"]
        if converge["last_partition_step"] is not None:
            assert converge["partitions_within"] == converge["K"]
            if converge["all_within_step"] is not None:
                assert converge["all_within_step"] >= converge["last_partition_step"]

    targets = payload["targets"]
    assert set(targets) == {"fit_vs_loop", "per_step_vs_gpytorch"}
    assert all(isinstance(t["met"], bool) for t in targets.values())
