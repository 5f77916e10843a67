"""``pyrogp fit-experts`` and ``pyrogp combine``, run in-process through
``pyrogp_models.inference.cli.main``."""

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from pyrogp_models.inference.cli import main
from pyrogp_models.inference.experts_fit import ExpertsSpec, fit_exact_experts

from helpers import constant_scores, exact_gp_scores, write_csv
from pyrogp_models.data import load_table
from pyrogp_models.data.columns import Columns
from pyrogp_models.data.partitioners import partition_kmeans
from pyrogp_models.models.experts import grbcm_rows
from pyrogp_models.modules.files import SUFFIX, load_modules, read_index, save_modules


@pytest.fixture(scope="module")
def data(folder):
    rng = np.random.default_rng(1)

    def make(name, n):
        x1, x2 = rng.uniform(0, 10, n), rng.normal(size=n)
        y = np.sin(x1) + 0.3 * x2 + 0.1 * rng.normal(size=n)
        return write_csv(folder / name, {"x1": x1, "x2": x2, "y": y})

    return make("train.csv", 200), make("test.csv", 50)


@pytest.fixture(scope="module")
def experts(folder, data):
    out = folder / "experts"
    code = main(["fit-experts", str(data[0]), "--target", "y", "--experts", "4",
                 "--partition-by", "kmeans", "--features", "x1,x2", "--ard", "--steps", "5",
                 "--out", str(out)])
    assert code == 0
    return out


def test_fit_experts_writes_a_module_folder(experts):
    modules = load_modules(experts)
    assert len(modules) == 4
    assert read_index(experts)["partition"]["kind"] == "kmeans"
    assert sum(module.num_data for module in modules.values()) == 200
    for module in modules.values():
        assert module.columns == Columns(["x1", "x2"], "y")
        assert module.info["expert"] == "exact"
    lengthscales = [module.kernel.lengthscale for module in modules.values()]
    assert all(torch.equal(lengthscales[0], other) for other in lengthscales[1:])
    assert lengthscales[0].numel() == 2  # --ard


def test_points_per_expert(folder, data):
    out = folder / "per_expert"
    assert main(["fit-experts", str(data[0]), "--target", "y", "--points-per-expert", "70",
                 "--partition-by", "random", "--steps", "0", "--out", str(out)]) == 0
    assert len(load_modules(out)) == 3  # ceil(200 / 70)


def test_without_a_count_there_are_about_default_points_per_expert(monkeypatch, folder, data):
    import pyrogp_models.inference.commands.fit_experts as command

    monkeypatch.setattr(command, "DEFAULT_EXPERT_POINTS", 70)
    out = folder / "default_count"
    assert main(["fit-experts", str(data[0]), "--target", "y", "--partition-by", "random",
                 "--steps", "0", "--out", str(out)]) == 0
    assert len(load_modules(out)) == 3  # ceil(200 / 70)


def test_combine_without_a_rule_is_the_rbcm_with_entropy_weights(folder, data, experts):
    default, rbcm = folder / "default.csv", folder / "rbcm.csv"
    assert main(["combine", str(experts), "--data", str(data[1]), "--out", str(default)]) == 0
    assert main(["predict", str(experts), "--rule", "rbcm", "--weights", "entropy",
                 "--data", str(data[1]), "--out", str(rbcm)]) == 0
    assert default.read_bytes() == rbcm.read_bytes()


def test_combine_matches_predict_and_evaluate(folder, data, experts, capsys):
    combined, predicted = folder / "combined.csv", folder / "predicted.csv"
    rule = ["--rule", "gpoe", "--weights", "softmax-var", "--temperature", "10"]
    assert main(["combine", str(experts), *rule, "--data", str(data[1]),
                 "--out", str(combined)]) == 0
    assert main(["predict", str(experts), *rule, "--data", str(data[1]),
                 "--out", str(predicted)]) == 0
    table = load_table(combined)
    assert table.columns == ["x1", "x2", "mean", "var"]
    assert combined.read_bytes() == predicted.read_bytes()
    capsys.readouterr()
    assert main(["evaluate", str(experts), *rule, "--data", str(data[1]), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {"nlpd", "rmse", "mae", "n"} <= set(report)
    assert report["n"] == 50
    # an exact GP on all 200 points (scikit-learn) scores rmse 0.118, nlpd -0.73; the constant
    # predictor 0.79, 1.19: four experts combined by gPoE come within a few per cent of the GP
    train, test = load_table(data[0]), load_table(data[1])
    X, X_test = train.select(["x1", "x2"]), test.select(["x1", "x2"])
    exact = exact_gp_scores(X, train.column("y"), X_test, test.column("y"))
    assert report["rmse"] < 1.1 * exact["rmse"] and report["nlpd"] < exact["nlpd"] + 0.1
    assert report["nlpd"] < constant_scores(train.column("y"), test.column("y"))["nlpd"] - 1.5


# rBCM's default (differential-entropy) weight β ≠ 1 mixes even a single expert with the prior;
# with normalised uniform weights β = 1 and it reduces to the expert. grBCM needs two experts.
@pytest.mark.parametrize("rule", ["poe", "gpoe", "bcm", "rbcm", "barycenter",
                                  "barycenter-paper"])
def test_one_expert_combination_equals_the_module(folder, data, rule):
    weights = ["--weights", "uniform"] if rule == "rbcm" else []
    out = folder / "single"
    if not out.exists():
        assert main(["fit-experts", str(data[0]), "--target", "y", "--experts", "1",
                     "--steps", "3", "--out", str(out)]) == 0
    (module_file,) = out.glob(f"*{SUFFIX}")
    plain, combined = folder / f"plain-{rule}.npz", folder / f"combined-{rule}.npz"
    assert main(["predict", str(module_file), "--data", str(data[1]), "--out", str(plain)]) == 0
    assert main(["combine", str(out), "--rule", rule, *weights, "--data", str(data[1]),
                 "--out", str(combined)]) == 0
    with np.load(plain) as expected, np.load(combined) as actual:
        assert list(actual) == list(expected)
        for name in expected:
            np.testing.assert_allclose(actual[name], expected[name], rtol=1e-9, atol=1e-12)


def test_bad_rule_is_one_line_and_exit_2(folder, data, experts, capsys):
    out = folder / "bad.csv"
    capsys.readouterr()
    code = main(["combine", str(experts), "--rule", "nonsense", "--data", str(data[1]),
                 "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("pyrogp: error: ") and "nonsense" in err
    assert err.count("\n") == 1
    assert not out.exists()


def test_combine_needs_a_folder(folder, data, experts, capsys):
    module_file = next(experts.glob(f"*{SUFFIX}"))
    capsys.readouterr()
    assert main(["combine", str(module_file), "--rule", "poe", "--data", str(data[1]),
                 "--out", str(folder / "x.csv")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_combine_grbcm_is_eq5_on_the_experts_predictions(folder, data, capsys):
    """A grBCM folder (communication expert D_c, augmented experts D_c ∪ D_j) combined from the
    command line equals eq. (5) with Liu's weights, recomputed here in numpy from each module's
    own latent prediction, with the noise added after combining."""
    train, test = load_table(data[0]), load_table(data[1])
    X, y, X_test = train.select(["x1", "x2"]), train.column("y"), test.select(["x1", "x2"])
    rows, partition = grbcm_rows(partition_kmeans(X, 3, seed=0), 40, seed=0)
    fit = fit_exact_experts((X[rows], y[rows], partition),
                            ExpertsSpec(columns=Columns(["x1", "x2"], "y")))
    modules = dict(fit.modules)
    first = next(iter(modules))
    modules[first] = replace(modules[first], info={**modules[first].info, "role": "communication"})
    save_modules(modules, folder / "grbcm", partition.rule)
    out = folder / "grbcm.npz"
    assert main(["combine", str(folder / "grbcm"), "--rule", "grbcm", "--data", str(data[1]),
                 "--out", str(out)]) == 0

    moments = [tuple(t.numpy() for t in module.predict_f(X_test)) for module in modules.values()]
    (m_c, v_c), augmented = moments[0], moments[1:]
    m = np.stack([a[0] for a in augmented])
    v = np.minimum(np.stack([a[1] for a in augmented]), v_c)  # rBCM's clamp, inactive here
    beta = 0.5 * (np.log(v_c) - np.log(v))
    beta[0] = 1.0
    precision = 1 / v_c + (beta * (1 / v - 1 / v_c)).sum(0)
    mean = ((beta * m / v).sum(0) - (beta.sum(0) - 1) * m_c / v_c) / precision
    noise = np.mean([float(mod.likelihood_params["variance"]) for mod in modules.values()])
    s = modules[first].standardisation
    with np.load(out) as saved:
        assert list(saved) == ["x1", "x2", "mean", "var"]
        np.testing.assert_allclose(saved["mean"], mean * s.y_scale + s.y_mean, rtol=1e-9)
        np.testing.assert_allclose(saved["var"], (1 / precision + noise) * s.y_scale ** 2,
                                   rtol=1e-9)
    capsys.readouterr()
    assert main(["evaluate", str(folder / "grbcm"), "--rule", "grbcm", "--data", str(data[1]),
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    exact = exact_gp_scores(X, y, X_test, test.column("y"))
    # here rmse 0.143 and nlpd -0.71 against the exact GP's 0.118 and -0.73
    assert report["rmse"] < 1.4 * exact["rmse"] and report["nlpd"] < exact["nlpd"] + 0.1


def test_an_unconverged_fit_warns_in_one_line(folder, data, capsys):
    capsys.readouterr()
    assert main(["fit-experts", str(data[0]), "--target", "y", "--experts", "2", "--steps", "1",
                 "--out", str(folder / "one_step")]) == 0
    err = capsys.readouterr().err
    assert err.startswith("pyrogp: warning: the fit stopped at its step limit (1 steps)")
    assert err.count("\n") == 1 and err.rstrip().endswith("raise --steps")


def test_no_start_is_one_line_and_writes_nothing(folder, data, capsys):
    capsys.readouterr()
    out = folder / "no_start"
    assert main(["fit-experts", str(data[0]), "--target", "y", "--experts", "2",
                 "--restarts", "0", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == "pyrogp: error: restarts must be at least 1, got 0\n"
    assert not out.exists()


def test_grbcm_refuses_a_folder_without_a_communication_expert(folder, data, experts, capsys):
    """Experts of an ordinary partition are not augmented by a communication set: grBCM on
    them would be another model, so it is refused in one line (the folder of ``experts``)."""
    capsys.readouterr()
    assert main(["combine", str(experts), "--rule", "grbcm", "--data", str(data[1]),
                 "--out", str(folder / "refused.csv")]) != 0
    error = capsys.readouterr().err.strip()
    assert "grbcm needs a communication expert" in error and "\n" not in error
    assert not (folder / "refused.csv").exists()
