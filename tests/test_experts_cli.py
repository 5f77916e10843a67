"""``pyrogp fit-experts`` and ``pyrogp combine``, run in-process through ``inference.cli.main``."""

import json

import numpy as np
import pytest
import torch

from helpers import write_csv
from inference.cli import main
from pyrogp_models.data import load_table
from pyrogp_models.modules.files import SUFFIX, load_modules, read_index


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
        assert module.info["features"] == ["x1", "x2"]
        assert module.info["target"] == "y"
        assert module.info["expert"] == "exact"
    lengthscales = [module.lengthscale for module in modules.values()]
    assert all(torch.equal(lengthscales[0], other) for other in lengthscales[1:])
    assert lengthscales[0].numel() == 2  # --ard


def test_points_per_expert(folder, data):
    out = folder / "per_expert"
    assert main(["fit-experts", str(data[0]), "--target", "y", "--points-per-expert", "70",
                 "--partition-by", "random", "--steps", "0", "--out", str(out)]) == 0
    assert len(load_modules(out)) == 3  # ceil(200 / 70)


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
    assert report["rmse"] < 0.5


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
