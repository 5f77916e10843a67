"""Smoke tests of the multitask benchmarks: ``benchmarks/multitask_dgp.py --quick``,
``benchmarks/multitask_classifier.py --quick`` and ``benchmarks/multitask_experiments.py --quick``
run and write the expected JSON (no wall-clock
asserts: the budget below is only a timeout); the simulated arm of the inverse-dynamics
experiment obeys the manipulator equation."""

import sys

import numpy as np
import pytest

from helpers import ROOT, quick_benchmark_payload

sys.path.insert(0, str(ROOT / "benchmarks"))

from multitask_experiments import (  # noqa: E402
    FULL,
    GRAVITY,
    _kept_text,
    arm_torques,
    job_list,
    kept_real_commits,
    kept_real_runs,
    real_stretches,
    standardised_nlpd,
)

from pyrogp_models.models.multitask import WARPED_LATENTS

TIMEOUT_SECONDS = 1200.0
MODELS = {"smdgp", "mmdgp", "cmdgp", "idgp", "igp", "cgp"}


def test_multitask_classifier_benchmark_quick(tmp_path):
    """Both stopping rules for every model, scored against the logistic regression; the default
    (looser) rule follows the same path as 10⁻⁷ and so never takes more steps."""
    payload = quick_benchmark_payload("multitask_classifier.py", tmp_path, TIMEOUT_SECONDS)
    settings = payload["settings"]
    fits = {(row["model"], row["rule"]): row for row in payload["fits"]}
    assert set(fits) == {(kind, rule) for kind in settings["models"]
                         for rule in ("default", "collapsed tol")}
    for kind in settings["models"]:
        default, tight = fits[kind, "default"], fits[kind, "collapsed tol"]
        assert default["tol"] > tight["tol"] and default["steps"] <= tight["steps"]
        assert default["converged"] and 0 <= default["accuracy"] <= 1
        assert default["log_loss"] == pytest.approx(tight["log_loss"], abs=1e-2)
    for baseline in (payload["baseline"], payload["scikit_learn_gpc"]):
        assert 0 < baseline["log_loss"] and 0 <= baseline["accuracy"] <= 1


def test_multitask_dgp_benchmark_quick(tmp_path):
    pytest.importorskip("gpytorch")
    payload = quick_benchmark_payload("multitask_dgp.py", tmp_path, TIMEOUT_SECONDS)
    for key in ("cpu_count", "torch", "torch_threads", "date_utc", "gpytorch"):
        assert payload["machine"][key] is not None, key
    assert payload["problem"]["dtype"] == "float64"
    settings = payload["settings"]

    assert {row["model"] for row in payload["elbo"]} == MODELS
    for row in payload["elbo"]:
        assert row["ms"] > 0 and len(row["ms_all"]) == settings["rounds"]
        assert row["paper_ms"] > 0 and row["parameters"] > 0
    # a shared process has M inducing inputs like every other process
    smdgp = next(row for row in payload["elbo"] if row["model"] == "smdgp")
    assert smdgp["inducing_per_layer"] == [settings["num_inducing"]] * 2

    steps = {row["contender"]: row for row in payload["per_step_vs_gpytorch"]}
    assert set(steps) == {"ours (B rows, stacked)", "ours (B rows, stratified)",
                          "ours (isotopic batch, B·T pairs)", "GPyTorch DeepGP"}
    for row in steps.values():
        assert row["ms_per_step"] > 0 and len(row["ms_per_step_all"]) == settings["rounds"]
        assert row["gpytorch_over_this_min"] <= row["gpytorch_over_this"] \
            <= row["gpytorch_over_this_max"]
    assert steps["GPyTorch DeepGP"]["gpytorch_over_this"] == pytest.approx(1.0)

    tasks = payload["tasks"]
    assert [row["T"] for row in tasks["rows"]] == settings["task_counts"]
    for row in tasks["rows"]:
        assert row["smdgp_ms"] > 0 and row["cgp_ms"] > 0
        assert row["inducing_per_process"] == settings["num_inducing"]
    for fit in tasks["fits"].values():
        assert set(fit) == {"ms_per_task", "intercept_ms", "loglog_exponent", "linear_fit_r2"}

    convergence = {row["model"]: row for row in payload["convergence"]}
    assert set(convergence) == set(settings["converge_models"])
    assert [phase["model"] for phase in convergence["smdgp"]["phases"]] == ["igp", "smdgp"]
    assert convergence["smdgp"]["elbo"] >= convergence["igp"]["elbo"] - 1e-3

    assert set(payload["targets"]) == {
        "per_step_2x_gpytorch", "per_step_2x_gpytorch_stratified", "per_step_2x_gpytorch_isotopic",
        "smdgp_linear_in_tasks", "cgp_linear_in_tasks",
        *(f"{kind}_converges_within_60s" for kind in settings["converge_models"])}
    for target in payload["targets"].values():
        assert isinstance(target["met"], bool) and isinstance(target["value"], float)


def test_multitask_experiments_quick(tmp_path):
    payload = quick_benchmark_payload("multitask_experiments.py", tmp_path, TIMEOUT_SECONDS)
    settings = payload["settings"]

    toy = payload["toy"]
    assert set(toy["runs"]) == MODELS | {"cgp1"}
    for runs in toy["runs"].values():
        assert len(runs) == len(settings["toy_seeds"])
        assert set(runs[0]["scores"]) == {"task 1 all", "task 2 out of gap", "task 2 in gap",
                                          "task 2 all"}
        assert all(np.isfinite(run["elbo"]) and run["seconds"] > 0 for run in runs)
    assert np.asarray(toy["runs"]["mmdgp"][0]["ard"]).shape == (2, 4)     # λ = (g: 2, h: 2)
    assert set(toy["t9"]) >= {"mdgp_f2", "cgp_f2", "cgp1_f2", "wins_vs_cgp1", "wins_vs_cgp",
                              "met", "met_rank1"}
    assert set(toy["t10"]) == {"mmdgp_gap_rmse", "idgp_gap_rmse", "wins", "seeds", "met"}
    for kind, floor in toy["elbo_floor"].items():    # each deep model holds its shallow one
        assert min(floor["elbo_minus_contained"]) >= -1e-3, (kind, floor["contains"])
    assert set(payload["transfer"]) == set(WARPED_LATENTS)
    for transfer in payload["transfer"].values():
        assert len(transfer["ratios"]) == len(settings["transfer_seeds"])
    for name in settings["real_sets"]:
        real = payload["real"][name]
        assert set(real["runs"]) == {"lr", "li", *settings["real_models"]}
        assert set(real["checks"]) == {"default_over_lr", "default_over_igp", "default_over_li",
                                       "met", "per_stretch_over_lr", "per_stretch_over_igp",
                                       "per_stretch_over_li", "met_every_stretch"}
        assert all(run["rmse"] > 0 for runs in real["runs"].values() for run in runs)

    for run in (run for runs in payload["digits"]["runs"].values() for run in runs):
        assert set(run["accuracy"]) == {"clean", "random background", "image background", "all"}
        assert all(0.0 <= value <= 1.0 for value in run["accuracy"].values())
    arm = payload["arm"]["runs"]
    assert set(arm) == MODELS
    for by_size in arm.values():
        assert [int(n) for n in by_size] == settings["arm_sizes"]
        for run in (run for runs in by_size.values() for run in runs):
            assert run["rmse"] > 0 and np.isfinite(run["nlpd"]) and len(run["rmse_per_task"]) == 3
    assert set(payload["faims"]["runs"]) == MODELS | {"irf"}
    for run in (run for runs in payload["faims"]["runs"].values() for run in runs):
        assert set(run["roc_auc"]) == {"task 1", "task 2", "task 3", "all"}

    assert len(payload["claims"]) >= 8
    for claim in payload["claims"]:
        assert set(claim) == {"claim", "evidence", "reproduced"}
        assert isinstance(claim["reproduced"], bool)
    for name in ("toy", "digits", "arm", "faims", "ard"):
        assert (tmp_path / f"mt_{name}_quick.png").stat().st_size > 0
    assert "## 5. The paper's claims" in (tmp_path / "multitask_experiments_quick.md").read_text()


# The simulated arm ------------------------------------------------------------------------------
LENGTHS, MASSES = np.array([0.5, 0.4, 0.3]), np.array([3.0, 2.0, 1.0])


def jacobian_mass_matrix(q: np.ndarray) -> np.ndarray:
    """M(q) = Σ_i m_i J_iᵀJ_i + I_i j_iᵀj_i from the centre-of-mass Jacobians of uniform rods
    (derived independently of the recursive Newton–Euler code)."""
    theta = np.cumsum(q)
    normal = np.stack([-np.sin(theta), np.cos(theta)], -1)
    mass = np.zeros((3, 3))
    for i in range(3):
        jacobian = np.zeros((2, 3))
        for k in range(i + 1):
            jacobian[:, k] = LENGTHS[k:i] @ normal[k:i] + LENGTHS[i] / 2 * normal[i]
        rotation = (np.arange(3) <= i).astype(float)
        mass += MASSES[i] * jacobian.T @ jacobian + MASSES[i] * LENGTHS[i] ** 2 / 12 * np.outer(
            rotation, rotation)
    return mass


def potential_energy(q: np.ndarray) -> float:
    heights = np.cumsum(np.concatenate([[0.0], LENGTHS[:-1] * np.sin(np.cumsum(q))[:-1]]))
    return float(GRAVITY * MASSES @ (heights + LENGTHS / 2 * np.sin(np.cumsum(q))))


def rne_mass_matrix(q: np.ndarray) -> np.ndarray:
    eye = np.eye(3)
    return arm_torques(np.tile(q, (3, 1)), np.zeros((3, 3)), eye, gravity=0.0,
                       friction=False).T


def test_the_simulated_arm_obeys_the_manipulator_equation():
    rng = np.random.default_rng(0)
    for q in rng.uniform(-np.pi, np.pi, (5, 3)):
        mass = rne_mass_matrix(q)
        np.testing.assert_allclose(mass, jacobian_mass_matrix(q), atol=1e-12)
        assert np.linalg.eigvalsh(mass).min() > 0
        # gravity torques are the gradient of the potential energy
        gravity = arm_torques(q[None], np.zeros((1, 3)), np.zeros((1, 3)), friction=False)[0]
        step = 1e-6
        gradient = [(potential_energy(q + step * e) - potential_energy(q - step * e)) / (2 * step)
                    for e in np.eye(3)]
        np.testing.assert_allclose(gravity, gradient, atol=1e-6)
        # velocity terms: q̇ᵀC(q, q̇)q̇ = ½ q̇ᵀṀq̇ (Ṁ − 2C is skew-symmetric)
        dq = rng.standard_normal(3)
        coriolis = arm_torques(q[None], dq[None], np.zeros((1, 3)), gravity=0.0,
                               friction=False)[0]
        mass_rate = (rne_mass_matrix(q + step * dq) - rne_mass_matrix(q - step * dq)) / (2 * step)
        assert dq @ coriolis == pytest.approx(0.5 * dq @ mass_rate @ dq, abs=1e-6)
        # viscous friction adds Bq̇
        friction = arm_torques(q[None], dq[None], np.zeros((1, 3)))[0] - coriolis - gravity
        np.testing.assert_allclose(friction, np.array([0.4, 0.3, 0.2]) * dq, atol=1e-12)


def test_standardised_nlpd_is_the_nlpd_of_the_scaled_targets():
    """Densities of y in data units give the NLPD of y/s (the inverse-dynamics tables)."""
    from scipy.stats import norm

    rng = np.random.default_rng(0)
    y, mean, sd, scale = rng.normal(size=50), rng.normal(size=50), 0.3, 7.0
    in_data_units = norm.logpdf(scale * y, scale * mean, scale * sd)
    expected = -norm.logpdf(y, mean, sd).mean()
    assert standardised_nlpd(in_data_units, scale) == pytest.approx(expected, rel=1e-12)


def test_a_section_kept_twice_names_one_commit_and_keeps_its_text():
    """A section not rerun keeps its text under one not-rerun line, however often it is kept."""
    first = "| table |\n\nA note.\n\n![toy](mt_toy.png)\n"
    once = _kept_text(first, "aaa")
    twice = _kept_text(once + "\n", "bbb")
    assert twice == "*Not rerun: results of commit bbb.*\n\n| table |\n\nA note."
    assert once.replace("aaa", "bbb") == twice


def test_the_real_data_experiment_reruns_the_models_named_and_keeps_the_others_rows():
    """``--real-models cgp``: the real-data jobs are the baselines' and cGP's; every other
    model's record is the previous results' record of the same set and stretch."""
    jobs = job_list(FULL, ["real"], ["cgp"])
    assert {key[1] for key in jobs} == {"lr", "li", "cgp"}
    assert len(jobs) == 3 * sum(len(real_stretches(FULL, name)) for name in FULL.real_sets)
    previous = {"real": {name: {"runs": {kind: [{"rmse": hash((name, kind, i))}
                                                for i in range(len(real_stretches(FULL, name)))]
                                         for kind in FULL.real_models}}
                         for name in FULL.real_sets}}
    kept = kept_real_runs(previous, FULL, ["igp"])
    assert {key[1] for key in kept} == {"igp"}
    for (_, kind, seed, name), record in kept.items():
        index = real_stretches(FULL, name).index(seed)
        assert record == previous["real"][name]["runs"][kind][index]
    assert len(kept) == len(jobs) // 3


def test_a_real_data_set_without_previous_rows_fits_every_model():
    """A data set new to the results keeps nothing: every model is fitted on it, while the
    other sets rerun only the models named."""
    new = FULL.real_sets[-1]
    jobs = job_list(FULL, ["real"], ["igp"], new_sets=(new,))
    assert {key[1] for key in jobs if key[3] == new} == {"lr", "li", *FULL.real_models}
    assert {key[1] for key in jobs if key[3] != new} == {"lr", "li", "igp"}
    previous = {"real": {name: {"runs": {kind: [{"rmse": 1.0}] * 3 for kind in FULL.real_models}}
                         for name in FULL.real_sets if name != new}}
    assert all(key[3] != new for key in kept_real_runs(previous, FULL, ["cgp"]))


def test_a_kept_real_data_row_names_the_commit_that_made_it():
    """Rows the previous results kept keep their commit; rows the previous run made get its
    commit — per data set, so a set first fitted later is not credited to an older commit."""
    previous = {"machine": {"commit": "new"}, "kept_from": {},
                "real_kept_from": {"macro": {"cgp": "old"}}}
    commits = kept_real_commits(previous, ["cgp", "smdgp"], ["macro", "danish"])
    assert commits == {"macro": {"cgp": "old", "smdgp": "new"},
                       "danish": {"cgp": "new", "smdgp": "new"}}
    previous["kept_from"]["real"] = "kept"   # a section kept whole names its own commit
    assert kept_real_commits(previous, ["smdgp"], ["danish"]) == {"danish": {"smdgp": "kept"}}
