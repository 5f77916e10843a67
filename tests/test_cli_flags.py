"""Command-line flags reach the fit they name, and non-Gaussian fits from the command line give
the ``predict`` columns their likelihood promises, with values a baseline cannot reach.

Each flag is checked by its effect: the CLI's modules equal a Python fit with the matching spec
(so a flag that is dropped or misrouted changes the numbers), or a property only the flag gives
(a kernel family, a dtype, a step count, a class count)."""

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from pyrogp_models.inference.experts_fit import DEFAULT_TRAIN_CONFIG as EXPERTS_CONFIG
from pyrogp_models.inference.experts_fit import ExpertsSpec, fit_exact_experts
from pyrogp_models.inference.local_fit import LocalFitSpec, default_config, fit_local
from pyrogp_models.inference.train_config import UNCOLLAPSED_CONFIG
from scipy import stats

from helpers import constant_scores, run_failing, run_ok, write_csv
from pyrogp_models.data import load_table
from pyrogp_models.data.columns import Columns
from pyrogp_models.data.partitioners import partition_contiguous, partition_kmeans
from pyrogp_models.errors import NotConvergedWarning
from pyrogp_models.models.distributed_kernel.files import load_distributed_kernel
from pyrogp_models.modules.files import load_module, load_modules, read_index, save_modules

N = 90


@pytest.fixture(scope="module")
def arrays():
    rng = np.random.default_rng(4)
    x = np.sort(rng.uniform(0.0, 10.0, N))
    return {
        "x": x,
        "y": np.sin(x) + 0.1 * rng.normal(size=N),
        "count": rng.poisson(np.exp(1.0 + np.sin(x))).astype(float),
        # noise sd from 0.02 (x = 0) to 0.82 (x = 10)
        "het": np.sin(x) + (0.02 + 0.08 * x) * rng.normal(size=N),
        "cls": np.floor(x / 3.34).astype(float),  # labels 0, 1, 2 in three blocks
    }


@pytest.fixture(scope="module")
def data_csv(folder, arrays):
    return write_csv(folder / "data.csv", arrays)


def fit_args(data_csv, target, out, *extra):
    return ["fit-local", data_csv, "--target", target, "--features", "x", "--partitions", "2",
            "--partition-by", "contiguous", *extra, "--out", out]


def predictions(path):
    with np.load(path) as saved:
        return {name: saved[name] for name in saved.files}


def assert_same_predictions(modules, expected, X, rtol=1e-10):
    assert list(modules) == list(expected)
    for name, module in expected.items():
        for got, want in zip(modules[name].predict_y(X), module.predict_y(X), strict=True):
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=rtol, atol=rtol)


# fit-local: --kernel, --float32, --batch-size ---------------------------------------------------
def test_kernel_and_float32_reach_the_fit(capsys, folder, data_csv, arrays):
    X = arrays["x"][:, None]
    run_ok(capsys, *fit_args(data_csv, "y", folder / "m32", "--inducing", 6, "--kernel",
                             "matern32"))
    run_ok(capsys, *fit_args(data_csv, "y", folder / "m32_single", "--inducing", 6, "--kernel",
                             "matern32", "--float32"))
    double, single = load_modules(folder / "m32"), load_modules(folder / "m32_single")
    assert {m.kernel.kind for m in double.values()} == {"matern32"}
    assert {m.kernel.kind for m in single.values()} == {"matern32"}
    assert all(m.q_mean.dtype == m.q_chol.dtype == torch.float64 for m in double.values())
    assert all(m.q_mean.dtype == m.q_chol.dtype == m.kernel.lengthscale.dtype == torch.float32
               for m in single.values())

    spec = LocalFitSpec(num_inducing=6, kernel="matern32",
                        columns=Columns(["x"], "y"))
    python = fit_local((X, arrays["y"], partition_contiguous(X, 2)), spec,
                       replace(default_config(spec), seed=0))
    assert_same_predictions(double, python.modules, X)
    # single precision fits the same model to single-precision accuracy
    for name, module in double.items():
        np.testing.assert_allclose(single[name].predict_y(X)[0].double().numpy(),
                                   module.predict_y(X)[0].numpy(), atol=2e-3)
    assert "rbf" not in run_ok(capsys, "info", folder / "m32")


def test_batch_size_fits_minibatches_on_the_uncollapsed_bound(capsys, folder, data_csv, arrays):
    X = arrays["x"][:, None]
    out = run_ok(capsys, *fit_args(data_csv, "y", folder / "minibatch", "--inducing", 5,
                                   "--batch-size", 16, "--steps", 10))
    assert "uncollapsed bound" in out
    spec = LocalFitSpec(num_inducing=5, batch_size=16, columns=Columns(["x"], "y"))
    config = replace(default_config(spec), seed=0, steps=10)
    assert config.natural_gradient_lr == pytest.approx(0.2)  # the minibatch default
    with pytest.warns(NotConvergedWarning):
        python = fit_local((X, arrays["y"], partition_contiguous(X, 2)), spec, config)
    assert_same_predictions(load_modules(folder / "minibatch"), python.modules, X)
    with pytest.warns(NotConvergedWarning):
        full = fit_local((X, arrays["y"], partition_contiguous(X, 2)),
                         replace(spec, batch_size=None, collapsed=False), config)
    assert not np.allclose(python.modules["part000"].q_mean.numpy(),
                           full.modules["part000"].q_mean.numpy(), rtol=1e-6)


# Non-Gaussian likelihoods from the command line -------------------------------------------------
def test_categorical_fit_with_classes_predicts_one_column_per_class(capsys, folder, data_csv,
                                                                     arrays):
    run_ok(capsys, *fit_args(data_csv, "cls", folder / "categorical", "--inducing", 5,
                             "--likelihood", "categorical", "--classes", 4, "--link",
                             "robustmax", "--steps", 40))
    modules = load_modules(folder / "categorical")
    assert all(m.likelihood_options["num_classes"] == 4 and m.num_latent == 4
               for m in modules.values())
    assert "num_classes=4" in run_ok(capsys, "info", folder / "categorical")
    run_ok(capsys, "predict", folder / "categorical", "--data", data_csv,
           "--out", folder / "categorical.npz")
    predicted = predictions(folder / "categorical.npz")
    assert list(predicted) == ["x", "prob_0", "prob_1", "prob_2", "prob_3"]
    probs = np.column_stack([predicted[f"prob_{c}"] for c in range(4)])
    np.testing.assert_allclose(probs.sum(1), 1.0, rtol=1e-9)
    assert probs[:, 3].max() < 0.05  # class 3 was never observed
    assert (probs.argmax(1) == arrays["cls"]).mean() > 0.9  # majority class: 0.36
    report = json.loads(run_ok(capsys, "evaluate", folder / "categorical", "--data", data_csv,
                               "--json"))
    labels = arrays["cls"].astype(int)
    majority = -np.log(np.bincount(labels) / N)[labels]  # class frequencies as probabilities
    assert report["accuracy"] > 0.9 and report["nlpd"] < majority.mean() - 0.5


def test_categorical_without_classes_takes_the_largest_label(capsys, folder, data_csv):
    run_ok(capsys, *fit_args(data_csv, "cls", folder / "three", "--inducing", 3,
                             "--likelihood", "categorical", "--link", "robustmax",
                             "--steps", 2))
    assert {m.likelihood_options["num_classes"] for m in load_modules(folder / "three").values()
            } == {3}


def test_poisson_fit_predicts_rates(capsys, folder, data_csv, arrays):
    run_ok(capsys, *fit_args(data_csv, "count", folder / "poisson", "--inducing", 6,
                             "--likelihood", "poisson", "--steps", 120))
    run_ok(capsys, "predict", folder / "poisson", "--data", data_csv,
           "--out", folder / "poisson.csv")
    table = load_table(folder / "poisson.csv")
    assert table.columns == ["x", "mean", "var"]
    # E[y] = exp(m + v/2) and Var[y] = E[y] + (e^v − 1) E[y]² of the latent f ~ N(m, v),
    # counts are not standardised: computed here from each point's module
    X = arrays["x"][:, None]
    modules = load_modules(folder / "poisson")
    expected_mean = np.empty(N)
    expected_var = np.empty(N)
    boundaries = read_index(folder / "poisson")["partition"]["boundaries"]
    blocks = np.searchsorted(boundaries, X[:, 0], side="right")
    for k, module in enumerate(modules.values()):
        m, v = (t.numpy() for t in module.predict_f(X[blocks == k]))
        expected_mean[blocks == k] = np.exp(m + v / 2)
        expected_var[blocks == k] = np.exp(m + v / 2) + np.expm1(v) * np.exp(2 * m + v)
    np.testing.assert_allclose(table.column("mean"), expected_mean, rtol=1e-12)
    np.testing.assert_allclose(table.column("var"), expected_var, rtol=1e-12)
    # the rates follow the truth exp(1 + sin x) far better than the mean count does
    truth = np.exp(1.0 + np.sin(arrays["x"]))
    assert np.sqrt(np.mean((table.column("mean") - truth) ** 2)) < \
        0.35 * np.sqrt(np.mean((arrays["count"].mean() - truth) ** 2))
    report = json.loads(run_ok(capsys, "evaluate", folder / "poisson", "--data", data_csv,
                               "--json"))
    constant = -stats.poisson.logpmf(arrays["count"], arrays["count"].mean()).mean()
    assert report["nlpd"] < constant - 0.3


def test_lr_trains_an_exact_bound_by_adam_instead_of_lbfgs(capsys, folder, data_csv, arrays):
    """A Poisson fit trains by L-BFGS by default; --lr asks for Adam with natural-gradient
    steps (the uncollapsed configuration), and the modules are that Python fit's."""
    X = arrays["x"][:, None]
    run_ok(capsys, *fit_args(data_csv, "count", folder / "poisson_adam", "--inducing", 6,
                             "--likelihood", "poisson", "--lr", 0.03, "--steps", 10))
    spec = LocalFitSpec(num_inducing=6, likelihood="poisson", columns=Columns(["x"], "count"))
    assert default_config(spec).optimizer == "lbfgs"
    config = replace(UNCOLLAPSED_CONFIG, lr=0.03, steps=10, seed=0)
    with pytest.warns(NotConvergedWarning):
        python = fit_local((X, arrays["count"], partition_contiguous(X, 2)), spec, config)
    assert_same_predictions(load_modules(folder / "poisson_adam"), python.modules, X)


def test_heteroscedastic_fit_predicts_input_dependent_noise(capsys, folder, data_csv, arrays):
    run_ok(capsys, *fit_args(data_csv, "het", folder / "het", "--inducing", 6,
                             "--likelihood", "heteroscedastic", "--steps", 150))
    assert all(m.num_latent == 2 for m in load_modules(folder / "het").values())
    run_ok(capsys, "predict", folder / "het", "--data", data_csv, "--out", folder / "het.npz")
    predicted = predictions(folder / "het.npz")
    assert list(predicted) == ["x", "mean", "var"]
    x, var = predicted["x"], predicted["var"]
    # true noise variance grows from 0.0004 to 0.67 along x
    assert np.median(var[x > 7]) > 5 * np.median(var[x < 3])
    het = json.loads(run_ok(capsys, "evaluate", folder / "het", "--data", data_csv, "--json"))
    run_ok(capsys, *fit_args(data_csv, "het", folder / "homo", "--inducing", 6))
    homo = json.loads(run_ok(capsys, "evaluate", folder / "homo", "--data", data_csv, "--json"))
    assert het["nlpd"] < homo["nlpd"] - 0.07  # 0.12 here
    assert het["nlpd"] < constant_scores(arrays["het"], arrays["het"])["nlpd"] - 0.5


# fit-experts --kernel, fit-distkernel --time-budget ---------------------------------------------
def test_fit_experts_kernel_reaches_the_fit(capsys, folder, data_csv, arrays):
    X = arrays["x"][:, None]
    run_ok(capsys, "fit-experts", data_csv, "--target", "y", "--features", "x", "--experts", 2,
           "--kernel", "matern52", "--steps", 3, "--out", folder / "experts52")
    modules = load_modules(folder / "experts52")
    assert {m.kernel.kind for m in modules.values()} == {"matern52"}
    spec = ExpertsSpec(kernel="matern52", columns=Columns(["x"], "y"))
    python = fit_exact_experts((X, arrays["y"], partition_kmeans(X, 2, 0)), spec,
                               replace(EXPERTS_CONFIG, seed=0, steps=3))
    assert_same_predictions(modules, python.modules, X)


def test_fit_distkernel_time_budget_stops_the_fit(capsys, folder, data_csv):
    out = run_ok(capsys, "fit-distkernel", data_csv, "--target", "y", "--features", "x",
                 "--regions", 2, "--inducing-per-region", 4, "--steps", 500,
                 "--time-budget", "1e-9", "--out", folder / "budget.safetensors")
    assert "\n1 steps (" in out
    assert load_distributed_kernel(folder / "budget.safetensors").num_data == N
    out = run_ok(capsys, "fit-distkernel", data_csv, "--target", "y", "--features", "x",
                 "--regions", 2, "--inducing-per-region", 4, "--steps", 3,
                 "--out", folder / "no_budget.safetensors")
    assert "\n3 steps (" in out


# recycle --likelihood, --target ----------------------------------------------------------------
def test_recycle_target_reads_another_column_of_the_raw_data(capsys, folder, data_csv, arrays):
    run_ok(capsys, *fit_args(data_csv, "y", folder / "gauss", "--inducing", 5))
    # raw data beyond the modules' inputs, under another column name
    x_new = np.linspace(11.0, 13.0, 30)
    raw = write_csv(folder / "raw.csv", {"x": x_new, "obs": np.sin(x_new)})
    message = run_failing(capsys, "recycle", folder / "gauss", "--data", raw, "--inducing", 8,
                          "--out", folder / "never")
    assert "unknown column 'y'" in message
    out = run_ok(capsys, "recycle", folder / "gauss", "--data", raw, "--target", "obs",
                 "--likelihood", "gaussian", "--inducing", 10, "--out", folder / "with_raw")
    assert "recycled 2 modules (N = 90) and 30 raw points" in out
    with_raw = load_module(folder / "with_raw.safetensors")
    assert with_raw.likelihood_name == "gaussian" and with_raw.num_data == N + 30
    run_ok(capsys, "recycle", folder / "gauss", "--inducing", 10, "--out", folder / "no_raw")
    no_raw = load_module(folder / "no_raw.safetensors")
    X_new = x_new[:, None]
    error = {name: np.sqrt(np.mean((m.predict_y(X_new)[0].numpy() - np.sin(x_new)) ** 2))
             for name, m in (("raw", with_raw), ("none", no_raw))}
    assert error["raw"] < 0.2 < error["none"]


def mixed_likelihood_folder(capsys, folder, data_csv, name: str) -> dict:
    """A folder of Gaussian modules in which part001 claims a Poisson likelihood; its modules."""
    run_ok(capsys, *fit_args(data_csv, "y", folder / f"gauss_{name}", "--inducing", 5))
    modules = load_modules(folder / f"gauss_{name}")
    modules["part001"] = replace(modules["part001"], likelihood_name="poisson",
                                 likelihood_params={})
    save_modules(modules, folder / name)
    return modules


def test_recycle_likelihood_names_the_saved_likelihood(capsys, folder, data_csv):
    modules = mixed_likelihood_folder(capsys, folder, data_csv, "mixed")
    raw = write_csv(folder / "raw_mixed.csv", {"x": np.linspace(0, 1, 5), "y": np.zeros(5)})
    message = run_failing(capsys, "recycle", folder / "mixed", "--data", raw, "--inducing", 6,
                          "--out", folder / "never")
    assert "different likelihoods (gaussian, poisson)" in message and "--likelihood" in message
    assert not (folder / "never.safetensors").exists()
    out = run_ok(capsys, "recycle", folder / "mixed", "--likelihood", "poisson", "--inducing", 6,
                 "--out", folder / "as_poisson")
    assert "recycled 2 modules" in out
    meta = load_module(folder / "as_poisson.safetensors")
    assert meta.likelihood_name == "poisson" and meta.info["likelihood_source"] == "user"
    run_ok(capsys, "recycle", folder / "mixed", "--likelihood", "gaussian", "--inducing", 6,
           "--out", folder / "as_gauss")
    meta = load_module(folder / "as_gauss.safetensors")
    # the noise of the Gaussian modules only (the Poisson module has none)
    assert float(meta.likelihood_params["variance"]) == pytest.approx(
        float(modules["part000"].likelihood_params["variance"]))


def test_recycle_of_mixed_likelihoods_names_the_flag(capsys, folder, data_csv):
    mixed_likelihood_folder(capsys, folder, data_csv, "mixed_x")
    message = run_failing(capsys, "recycle", folder / "mixed_x", "--inducing", 6,
                          "--out", folder / "never_x")
    assert "different likelihoods" in message and "--likelihood" in message
    assert "likelihood='" not in message
