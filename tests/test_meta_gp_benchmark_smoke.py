"""Smoke test: ``benchmarks/meta_gp.py --quick`` runs and writes the expected JSON."""

import json

from helpers import run_quick_benchmark

REGIONS = ("in_range", "extrapolation", "all")
SCORES = ("rmse_f", "mae_f", "nlpd", "coverage95")


def test_meta_gp_benchmark_quick(tmp_path):
    out = tmp_path / "meta_gp_quick.json"
    stdout = run_quick_benchmark("meta_gp.py", out)
    assert f"JSON written to {out}" in stdout
    assert "Targets" in stdout

    payload = json.loads(out.read_text())
    assert payload["benchmark"] == "meta_gp"
    assert payload["mode"] == "quick"
    for key in ("cpu_count", "torch", "torch_threads", "date_utc"):
        assert payload["machine"][key] is not None, key
    assert payload["problem"]["dtype"] == "float64"

    e2e = payload["end_to_end"]
    assert set(e2e["stages"]) == {"data", "local_fits", "recycle", "predict"}
    for stage in e2e["stages"].values():
        assert stage["wall_seconds"] > 0 and stage["cpu_seconds"] >= 0
    assert e2e["total_seconds"] > 0
    assert e2e["N"] == e2e["K"] * e2e["points_per_partition"]
    assert e2e["meta_min_precision_eigenvalue"] > 0
    for model in ("meta", "full_svgp"):
        for region in REGIONS:
            assert set(e2e[model][region]) == set(SCORES), (model, region)
    assert e2e["full_svgp_fit"]["wall_seconds"] > 0

    settings = payload["settings"]
    rows = payload["scaling"]
    assert [(row["M"], row["K"]) for row in rows] == [
        (M, K) for M in settings["ms"] for K in settings["ks"]]
    for row in rows:
        for key in ("bound_grad_seconds", "collapsed_grad_seconds", "fit_seconds",
                    "stack_seconds", "bound_us_per_module", "collapsed_us_per_module"):
            assert row[key] > 0, key
        assert row["fit_evaluations"] >= 1 and row["fit_steps"] >= 1
        assert len(row["fit_seconds_all"]) >= 1
        assert len(row["bound_grad_seconds_all"]) == settings["objective_repeats"]
        assert row["bound_grad_figure"] > 0 and row["reference_seconds"] > 0
    slopes = payload["scaling_slopes"]
    assert len(slopes) == 3 * len(settings["ms"])
    assert all(isinstance(row["slope"], float) for row in slopes)

    profile = payload["profile"]
    assert profile["K"] == max(settings["ks"]) and profile["M"] == min(settings["ms"])
    assert profile["forward_seconds"] > 0 and profile["top_ops"]

    methods = payload["accuracy"]["methods"]
    for name in ("meta (collapsed)", "full-data SVGP", "PoE", "gPoE_unif", "BCM", "rBCM_entr",
                 "gPoE_var", "rBCM_var_u", "BAR_var", "BAR_var_w2"):
        assert set(methods[name]) == set(REGIONS), name
        assert set(methods[name]["in_range"]["nlpd"]) == {"mean", "sd"}

    ablation = payload["accuracy"]["ablation_learned_inducing"]
    assert set(ablation) == {"fixed Z_k", "learned Z_k"}
    for record in ablation.values():
        assert set(record) == {"summed_local_bound", "summed_local_elbo", "meta_rmse_in_range",
                               "meta_nlpd_in_range"}

    large = payload["large"]
    assert large["K"] == 50 * settings["large_replicas"]
    assert large["bound_grad_seconds"] > 0 and large["collapsed_grad_figure"] > 0
    assert set(large["bound_saved_bytes_per_module"]) == {str(e2e["K"]), str(large["K"])}
    assert "authors" in payload  # None unless a checkout of the authors' code is given

    targets = payload["targets"]
    assert set(targets) == {
        "fit_k5000_under_30s", "objective_linear_in_K", "large_k_objective_under_150ms",
        "end_to_end_under_5_minutes",
        "end_to_end_rmse_within_1.5x_full_svgp", "accuracy_10k_rmse_le_0.3",
        "accuracy_10k_nlpd_within_0.1_of_full_svgp", "accuracy_10k_nlpd_better_than_poe_family"}
    for target in targets.values():
        assert isinstance(target["met"], bool)
        assert isinstance(target["value"], float) and isinstance(target["threshold"], float)
