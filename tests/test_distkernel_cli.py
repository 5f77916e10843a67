"""``pyrogp fit-distkernel`` and distributed-kernel files: the command-line round trip, exact
reloads, damaged or invalid files, and one-line errors for bad input."""

import json
import re
import warnings

import numpy as np
import pytest
import torch
from pyrogp_models.inference.cli import main
from pyrogp_models.inference.distributed_kernel_fit import (
    DistributedKernelSpec,
    default_layout,
    fit_distributed_kernel,
)
from pyrogp_models.inference.local_fit import LocalFitSpec, fit_local
from pyrogp_models.inference.train_config import (
    DEFAULT_REGION_ROWS,
    MIN_DEFAULT_INDUCING_PER_REGION,
)
from pyrogp_models.inference.train_config import (
    DISTRIBUTED_KERNEL_COLLAPSED_CONFIG as COLLAPSED_CONFIG,
)
from pyrogp_models.inference.train_config import DISTRIBUTED_KERNEL_SVI_CONFIG as SVI_CONFIG
from pyrogp_models.inference.trainer import TrainConfig

from helpers import (
    constant_scores,
    exact_gp_scores,
    gaussian_scores,
    resigned,
    run_failing,
    run_ok,
    write_csv,
)
from pyrogp_models.data import Standardisation, load_table
from pyrogp_models.data.columns import Columns
from pyrogp_models.data.inducing import default_num_inducing
from pyrogp_models.data.partitioners import partition_contiguous
from pyrogp_models.errors import ModuleFileError
from pyrogp_models.io import load_predictor
from pyrogp_models.kernels import RBF
from pyrogp_models.likelihoods import make_likelihood
from pyrogp_models.models.distributed_kernel import (
    DistributedKernelGP,
    Regions,
    init_region_inducing,
)
from pyrogp_models.models.distributed_kernel.files import (
    DistributedKernelPredictor,
    load_distributed_kernel,
    save_distributed_kernel,
)
from pyrogp_models.modules.files import load_modules, save_module
from pyrogp_models.modules.predictor import Predictor
from pyrogp_models.modules.record import Module

FIT = ["--inducing-per-region", "6", "--steps", "40"]


@pytest.fixture(scope="module")
def regression_csv(folder):
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 10, 80)
    y = np.sin(x) + 0.1 * rng.normal(size=80)
    return write_csv(folder / "regression.csv",
                     {"x": x, "noise": rng.normal(size=80), "y": y})


@pytest.fixture(scope="module")
def fitted(folder, regression_csv):
    out = folder / "dk.safetensors"
    assert main(["fit-distkernel", str(regression_csv), "--target", "y", "--features", "x",
                 "--regions", "3", *FIT, "--out", str(out)]) == 0
    return out


def test_the_default_layout_is_a_local_fits_budget_on_short_data_and_regions_on_long_series():
    for rows in (1, 7, 80, DEFAULT_REGION_ROWS):
        assert default_layout(rows) == (1, int(default_num_inducing(rows)))
    for rows in (DEFAULT_REGION_ROWS + 1, 10_000, 50_000, 10**6):
        regions, per_region = default_layout(rows)
        assert (regions - 1) * DEFAULT_REGION_ROWS < rows <= regions * DEFAULT_REGION_ROWS
        assert per_region >= MIN_DEFAULT_INDUCING_PER_REGION
        assert regions * per_region >= default_num_inducing(rows)
    for rows, regions in ((80, 4), (80, 40), (10_000, 64)):
        given, per_region = default_layout(rows, regions)
        assert given == regions and 1 <= per_region <= -(-rows // (2 * regions))
        assert regions * per_region >= min(default_num_inducing(rows),
                                           regions * MIN_DEFAULT_INDUCING_PER_REGION,
                                           rows // 2)


def test_without_layout_flags_short_data_get_one_region_with_the_local_fits_budget(
        capsys, folder, regression_csv):
    run_ok(capsys, "fit-local", regression_csv, "--target", "y", "--partitions", "1",
           "--steps", "5", "--out", folder / "local_budget")
    local_m = next(iter(load_modules(folder / "local_budget").values())).num_inducing
    run_ok(capsys, "fit-distkernel", regression_csv, "--target", "y", "--steps", "5",
           "--out", folder / "dk_defaults.safetensors")
    info = run_ok(capsys, "info", folder / "dk_defaults.safetensors")
    assert f"distributed-kernel GP: 1 region × {local_m} inducing inputs" in info


def test_fit_info_predict_evaluate_round_trip(capsys, folder, regression_csv, fitted):
    info = run_ok(capsys, "info", fitted)
    assert "3 regions × 6 inducing inputs (M = 18), mean-field q" in info
    assert "cuts along x (data units)" in info and "ELBO" in info and "target: y" in info

    run_ok(capsys, "predict", fitted, "--data", regression_csv, "--out", folder / "pred.csv")
    predictions = load_table(folder / "pred.csv")
    assert predictions.columns == ["x", "mean", "var"]
    predictor = load_predictor(fitted)
    assert isinstance(predictor, DistributedKernelPredictor) and isinstance(predictor, Predictor)
    mean, var = predictor.predict_y(predictions.select(["x"]))
    np.testing.assert_array_equal(predictions.column("mean"), mean.numpy())
    np.testing.assert_array_equal(predictions.column("var"), var.numpy())

    report = json.loads(run_ok(capsys, "evaluate", fitted, "--data", regression_csv, "--json"))
    assert report["n"] == 80
    # the written (mean, var) is the predictive evaluate scores (a variance in the wrong units
    # would change the NLPD recomputed from the file)
    written = gaussian_scores(load_table(regression_csv).column("y"), predictions.column("mean"),
                              predictions.column("var"))
    assert written["nlpd"] == pytest.approx(report["nlpd"], rel=1e-9)
    # held-out points against scikit-learn's exact GP on the 80 training points (rmse 0.105,
    # nlpd -0.84; the distributed kernel 0.106, -0.82; without the q(u) spread in its
    # variance -0.70) and the constant predictor
    rng = np.random.default_rng(5)
    x_test = np.linspace(0.05, 9.95, 60)
    y_test = np.sin(x_test) + 0.1 * rng.normal(size=60)
    held_out = write_csv(folder / "held_out.csv", {"x": x_test, "noise": rng.normal(size=60),
                                                   "y": y_test})
    report = json.loads(run_ok(capsys, "evaluate", fitted, "--data", held_out, "--json"))
    train = load_table(regression_csv)
    exact = exact_gp_scores(train.column("x"), train.column("y"), x_test, y_test)
    constant = constant_scores(train.column("y"), y_test)
    assert report["rmse"] < 1.1 * exact["rmse"] and report["nlpd"] < exact["nlpd"] + 0.1
    assert report["nlpd"] < constant["nlpd"] - 1.5


def test_the_defaults_converge_by_lbfgs_on_the_collapsed_bound(capsys, folder, regression_csv):
    """No training flag: a Gaussian fit runs L-BFGS on the collapsed bound, well within its step
    limit, and says it converged; the help names both defaults."""
    out = run_ok(capsys, "fit-distkernel", regression_csv, "--target", "y", "--features", "x",
                 "--regions", 3, "--inducing-per-region", 6,
                 "--out", folder / "defaults.safetensors")
    steps = int(re.search(r"\n(\d+) steps \(solve\), converged, in ", out).group(1))
    assert steps < COLLAPSED_CONFIG.steps
    text = " ".join(run_ok(capsys, "fit-distkernel", "--help").split())
    assert f"default: {COLLAPSED_CONFIG.steps} L-BFGS steps" in text
    assert f"{SVI_CONFIG.steps} Adam steps otherwise" in text


def test_a_float32_fit_predicts_like_the_float64_one(capsys, folder, regression_csv, fitted):
    out = folder / "single.safetensors"
    run_ok(capsys, "fit-distkernel", regression_csv, "--target", "y", "--features", "x",
           "--regions", "3", *FIT, "--float32", "--out", out)
    single, double = load_predictor(out), load_predictor(fitted)
    x = np.linspace(0, 10, 50)[:, None]
    mean32, var32 = single.predict_y(x)
    mean64, var64 = double.predict_y(x)
    assert bool(torch.isfinite(mean32).all() and torch.isfinite(var32).all())
    assert float((mean32.double() - mean64).abs().max()) <= 2e-2
    assert float((var32.double() / var64 - 1).abs().max()) <= 0.1


def test_fitting_warns_nothing(capsys, folder, regression_csv):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_ok(capsys, "fit-distkernel", regression_csv, "--target", "y", "--features", "x",
               "--regions", 2, "--inducing-per-region", 3, "--steps", 2,
               "--out", folder / "quiet.safetensors")
    assert [str(w.message) for w in caught] == []


def test_joint_bernoulli_fit_round_trip(capsys, folder):
    x = np.linspace(0, 10, 60)
    csv = write_csv(folder / "labels.csv", {"x": x, "label": (np.sin(x) > 0).astype(float)})
    out = folder / "classifier.safetensors"
    run_ok(capsys, "fit-distkernel", csv, "--target", "label", "--regions", "2",
           "--inducing-per-region", "6", "--steps", "60", "--lr", "0.1",
           "--likelihood", "bernoulli", "--link", "probit", "--variational", "joint",
           "--out", out)
    assert "joint q" in run_ok(capsys, "info", out)
    run_ok(capsys, "predict", out, "--data", csv, "--out", folder / "prob.npz")
    with np.load(folder / "prob.npz") as saved:
        assert set(saved.files) == {"x", "prob"}
        assert ((saved["prob"] > 0) & (saved["prob"] < 1)).all()
    report = json.loads(run_ok(capsys, "evaluate", out, "--data", csv, "--json"))
    assert report["accuracy"] > 0.8


def tree_model() -> tuple[DistributedKernelGP, torch.Tensor]:
    """2-D ARD kernel on a 3-leaf box tree, joint q, Poisson likelihood, random q."""
    X = torch.rand(50, 2, generator=torch.Generator().manual_seed(1)) * 4 - 2
    inf = float("inf")
    regions = Regions.from_boxes(torch.tensor([[-inf, -inf], [0.0, -inf], [0.0, 0.5]]),
                                 torch.tensor([[0.0, inf], [inf, 0.5], [inf, inf]]))
    Z = init_region_inducing(X, regions, 4)
    model = DistributedKernelGP(regions, Z, RBF(2, ard=True, lengthscale=torch.tensor([0.7, 1.3])),
                                make_likelihood("poisson"), variational="joint")
    model.set_whitened_posterior(torch.randn(12), torch.eye(12) + 0.1 * torch.randn(12, 12).tril())
    return model, X


def split_model() -> tuple[DistributedKernelGP, torch.Tensor]:
    """1-D split, mean-field q, Gaussian likelihood, fitted briefly (inputs in model units)."""
    X = torch.linspace(-2, 2, 60).unsqueeze(-1)
    spec = DistributedKernelSpec(3, 5, lengthscale=0.4, likelihood_options={"variance": 0.05})
    fit = fit_distributed_kernel((X, torch.sin(3 * X[:, 0])), spec, TrainConfig(steps=10))
    return fit.model, fit.model.bound_data()[0]


@pytest.mark.parametrize("make", [split_model, tree_model], ids=["split", "tree"])
def test_saved_file_round_trip_predicts_identically(tmp_path, make):
    model, X = make()
    X_data = X * 2.0 + 5.0
    y_data = torch.poisson(torch.full((len(X),), 2.0)) if model.likelihood.name == "poisson" \
        else torch.sin(X_data[:, 0])
    standardisation = Standardisation.fit(X_data, y_data,
                                          model.likelihood.standardise_targets)
    original = DistributedKernelPredictor(model, standardisation, len(X), -12.5, {"note": 1},
                                          Columns([f"in{d}" for d in range(X.shape[1])], "out",
                                                  {"out": "m"}))
    path = save_distributed_kernel(original, tmp_path / "model.safetensors")
    loaded = load_distributed_kernel(path)
    for a, b in zip(original.predict_f(X_data), loaded.predict_f(X_data), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    for a, b in zip(original.predict_y(X_data), loaded.predict_y(X_data), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    torch.testing.assert_close(original.log_predictive(X_data, y_data),
                               loaded.log_predictive(X_data, y_data), rtol=0, atol=1e-12)
    assert (loaded.num_data, loaded.elbo, loaded.info) == (len(X), -12.5, original.info)
    assert loaded.columns == original.columns
    assert loaded.standardisation.to_dict() == standardisation.to_dict()
    assert loaded.model.variational == model.variational
    assert torch.equal(loaded.model.inducing, model.inducing.detach())
    assert torch.equal(loaded.model.regions.lower_index, model.regions.lower_index)
    assert loaded.describe() == original.describe()


@pytest.mark.parametrize("where", [0.01, 0.3, 0.6, 0.95])
def test_a_flipped_byte_is_detected(fitted, tmp_path, where):
    path = tmp_path / "flipped.safetensors"
    data = bytearray(fitted.read_bytes())
    data[int(where * (len(data) - 1))] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(ModuleFileError, match=re.escape(str(path))):
        load_distributed_kernel(path)
    with pytest.raises(ModuleFileError, match=re.escape(path.name)):
        load_predictor(path)


def test_truncated_and_missing_files(capsys, fitted, regression_csv, tmp_path):
    path = tmp_path / "cut.safetensors"
    data = fitted.read_bytes()
    for cut in (4, 20, len(data) // 2, len(data) - 1):
        path.write_bytes(data[:cut])
        with pytest.raises(ModuleFileError, match=re.escape(str(path))):
            load_distributed_kernel(path)
    assert path.name in run_failing(capsys, "predict", path, "--data", regression_csv,
                                    "--out", tmp_path / "p.csv")
    with pytest.raises(ModuleFileError, match="no such distributed-kernel file"):
        load_distributed_kernel(tmp_path / "missing.safetensors")


def _set(key, value):
    return lambda record, tensors: tensors.__setitem__(key, value(tensors[key]))


INVALID = {
    "negative lengthscale": (_set("kernel.lengthscale", lambda t: -t), "must be positive"),
    "NaN inducing input": (_set("inducing", lambda t: t + float("nan")), "inducing contains NaN"),
    "upper-triangular entry": (_set("q_sqrt", lambda t: t + torch.ones_like(t).triu(1)),
                               "not a lower Cholesky factor"),
    "negative diagonal": (_set("q_sqrt", lambda t: -t), "not a lower Cholesky factor"),
    "wrong q shape": (_set("q_mean", lambda t: t[:, :-1].contiguous()), "q_mean has shape"),
    "negative noise": (_set("likelihood.variance", lambda t: -t), "out of its range"),
    "cuts not increasing": (_set("cuts.0", lambda t: t.flip(0).contiguous()), "invalid record"),
    "float32 tensor": (_set("kernel.variance", lambda t: t.float()), "dtype"),
    "Matérn kernel": (lambda r, t: r["kernel"].update(family="matern32"), "cannot be split"),
    "newer version": (lambda r, t: r.update(format_version=99), "newer"),
    "face index out of range": (lambda r, t: r["regions"].update(upper_index=[[5], [1], [-1]]),
                                "face indices"),
    "missing field": (lambda r, t: r.pop("standardisation"), "invalid record"),
    "a module file": (lambda r, t: r.update(format="pyrogp-module"),
                      "a module file, not a distributed-kernel file"),
}


@pytest.mark.parametrize("case", INVALID, ids=list(INVALID))
def test_invalid_contents_are_refused(fitted, tmp_path, case):
    edit, message = INVALID[case]
    path = resigned(fitted, tmp_path / "edited.safetensors", edit)
    with pytest.raises(ModuleFileError, match=re.escape(message)) as error:
        load_distributed_kernel(path)
    assert str(path) in str(error.value)


def test_module_files_still_load(tmp_path):
    X = np.linspace(0, 1, 20)[:, None]
    fit = fit_local((X, np.sin(6 * X[:, 0]), partition_contiguous(X, 1)),
                    LocalFitSpec(num_inducing=3), TrainConfig(steps=2))
    path = save_module(next(iter(fit.modules.values())), tmp_path / "one")
    assert isinstance(load_predictor(path), Module)


@pytest.fixture(scope="module")
def awkward_csvs(folder):
    rng = np.random.default_rng(1)
    x = rng.uniform(0, 1, 30)
    with_nan = x.copy()
    with_nan[7] = np.nan
    return {"nan": write_csv(folder / "nan.csv", {"x": with_nan, "y": x}),
            "three values": write_csv(folder / "three.csv",
                                      {"x": np.repeat([0.0, 1.0, 2.0], 10), "y": x}),
            "constant": write_csv(folder / "constant.csv", {"x": np.full(30, 3.0), "y": x})}


BAD_FITS = {
    "unknown target": ({"--target": "nope"}, "unknown column 'nope'"),
    "unknown feature": ({"--features": "x,zz"}, "unknown column 'zz'"),
    "target as feature": ({"--features": "x,y"}, "also listed as a feature"),
    "more regions than points": ({"--regions": "500"}, "500 regions are more than the 80"),
    "no regions": ({"--regions": "0"}, "--regions must be positive"),
    "no inducing inputs": ({"--inducing-per-region": "0"}, "--inducing-per-region must be"),
    "no such dimension": ({"--dim": "2"}, "dim 2 is not an input dimension"),
    "link without bernoulli": ({"--link": "probit"}, "--link applies to the bernoulli"),
    "labels not binary": ({"--likelihood": "bernoulli"}, "labels must be 0 or 1"),
    "counts not integer": ({"--likelihood": "poisson"}, "non-negative integer counts"),
    "missing output folder": ({"--out": "nowhere/dk.safetensors"}, "does not exist"),
}


@pytest.mark.parametrize("case", BAD_FITS, ids=list(BAD_FITS))
def test_bad_fit_arguments_give_one_line_errors(capsys, folder, regression_csv, case):
    changes, message = BAD_FITS[case]
    out = folder / "bad.safetensors"
    options = {"--target": "y", "--regions": "2", "--inducing-per-region": "4", "--steps": "1",
               "--out": out, **changes}
    argv = ["fit-distkernel", regression_csv, *(item for pair in options.items() for item in pair)]
    assert message in run_failing(capsys, *argv)
    assert not out.exists()


def test_bad_data_and_outputs_give_one_line_errors(capsys, folder, regression_csv, fitted,
                                                   awkward_csvs):
    def fit(csv, *extra):
        return run_failing(capsys, "fit-distkernel", csv, "--target", "y", "--regions", "6",
                           "--inducing-per-region", "2", "--steps", "1", *extra)

    assert "column 'x' contains NaN" in fit(awkward_csvs["nan"], "--out", folder / "b.st")
    assert "contain no data point; use fewer regions" in fit(awkward_csvs["three values"],
                                                              "--out", folder / "b.st")
    assert "column 'x' is constant and cannot be cut" in fit(awkward_csvs["constant"],
                                                             "--out", folder / "b.st")
    assert "refusing to overwrite" in fit(regression_csv, "--out", regression_csv)
    assert "single model" in run_failing(capsys, "predict", fitted, "--data", regression_csv,
                                         "--rule", "poe", "--out", folder / "p.csv")
