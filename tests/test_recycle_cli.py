"""``pyrogp recycle`` end to end (fit-local → recycle → evaluate → recycle again → info), its
one-line errors, and a smoke run of the demo."""

import json

import numpy as np
import pytest
import torch
from pyrogp_models.inference import demo
from pyrogp_models.inference.cli import main

from helpers import (
    constant_scores,
    exact_gp_scores,
    gaussian_scores,
    interpolation_rmse,
    run_failing,
    run_ok,
    write_csv,
)
from pyrogp_models.data import Standardisation, load_table
from pyrogp_models.data.columns import Columns
from pyrogp_models.kernels import stationary_kernel
from pyrogp_models.modules.files import load_module, load_modules, save_modules
from pyrogp_models.modules.record import Module

FIT = ["--inducing", "6", "--steps", "40", "--collapsed"]




@pytest.fixture(scope="module")
def data_csv(folder):
    rng = np.random.default_rng(0)
    x = np.sort(rng.uniform(0.0, 10.0, 150))
    return write_csv(folder / "data.csv", {"x": x, "y": np.sin(x) + 0.1 * rng.normal(size=150)})


@pytest.fixture(scope="module")
def test_csv(folder, data_csv):
    """Held-out points of the same function, and the baselines' scores on them."""
    rng = np.random.default_rng(1)
    x = rng.uniform(0.0, 10.0, 100)
    path = write_csv(folder / "test.csv", {"x": x, "y": np.sin(x) + 0.1 * rng.normal(size=100)})
    train, test = load_table(data_csv), load_table(path)
    baselines = {
        # scikit-learn's exact GP on all 150 points: rmse 0.104, nlpd -0.846 (the meta-GP
        # and its pyramid: 0.104, -0.847; with the noise of all modules summed: fails)
        "exact": exact_gp_scores(train.column("x"), train.column("y"), test.column("x"),
                                 test.column("y")),
        "constant": constant_scores(train.column("y"), test.column("y")),  # 0.71, 1.08
        "interpolation": interpolation_rmse(train.column("x"), train.column("y"),
                                            test.column("x"), test.column("y")),  # 0.134
    }
    return path, baselines


def assert_near_the_exact_gp(report, baselines):
    """A recycled GP predicts like the exact GP on all the data (a wrong recycling formula, a
    lost module or a units error costs far more than these margins) and far better than the
    constant predictor and than interpolating the training points."""
    exact, constant = baselines["exact"], baselines["constant"]
    assert report["rmse"] < 1.05 * exact["rmse"] and report["nlpd"] < exact["nlpd"] + 0.05
    assert report["rmse"] < 0.9 * baselines["interpolation"]
    assert report["rmse"] < 0.2 * constant["rmse"] and report["nlpd"] < constant["nlpd"] - 1.5


@pytest.fixture(scope="module")
def modules_dir(folder, data_csv):
    out = folder / "modules"
    assert main(["fit-local", str(data_csv), "--target", "y", "--partitions", "3",
                 "--partition-by", "contiguous", *FIT, "--out", str(out)]) == 0
    return out


def test_fit_recycle_evaluate_and_recycle_again(capsys, folder, data_csv, test_csv,
                                                 modules_dir):
    out = run_ok(capsys, "recycle", modules_dir, "--inducing", 12, "--collapsed", "--steps", 30,
                 "--out", folder / "meta")
    assert "recycled 3 modules (N = 150)" in out and "M = 12" in out
    meta = load_module(folder / "meta.safetensors")
    assert meta.num_inducing == 12 and meta.num_data == 150
    assert meta.columns == Columns(["x"], "y")
    assert meta.info["modules"] == ["part000", "part001", "part002"]
    assert meta.info["recycle"]["collapsed"] is True
    # both numbers a user meets: the bound the fit maximised and the ELBO info shows
    assert (f"ensemble bound {meta.info['ensemble_bound']:.6g} (ELBO {meta.elbo:.6g} with the "
            "modules' own" in out)
    assert meta.elbo == pytest.approx(meta.info["ensemble_bound"] + meta.info["module_elbo_sum"])

    report = json.loads(run_ok(capsys, "evaluate", folder / "meta.safetensors", "--data",
                               data_csv, "--json"))
    assert report["n"] == 150
    held_out, baselines = test_csv
    report = json.loads(run_ok(capsys, "evaluate", folder / "meta.safetensors", "--data",
                               held_out, "--json"))
    assert_near_the_exact_gp(report, baselines)
    # the predictive written by predict is the one evaluate scores (mean and variance units)
    run_ok(capsys, "predict", folder / "meta.safetensors", "--data", held_out,
           "--out", folder / "meta_predictions.npz")
    with np.load(folder / "meta_predictions.npz") as written:
        scores = gaussian_scores(load_table(held_out).column("y"), written["mean"],
                                 written["var"])
    assert scores["nlpd"] == pytest.approx(report["nlpd"], rel=1e-9)
    assert scores["rmse"] == pytest.approx(report["rmse"], rel=1e-9)

    out = run_ok(capsys, "recycle", folder / "meta.safetensors", "--inducing", 10, "--steps", 20,
                 "--out", folder / "pyramid.safetensors")
    assert "recycled 1 module (N = 150)" in out
    pyramid = load_module(folder / "pyramid.safetensors")
    assert pyramid.info["modules"] == ["meta"] and pyramid.columns.target == "y"
    out = run_ok(capsys, "info", folder / "pyramid.safetensors")
    assert "pyramid" in out and "features: x; target: y" in out
    assert_near_the_exact_gp(json.loads(run_ok(capsys, "evaluate",
                                               folder / "pyramid.safetensors", "--data",
                                               held_out, "--json")), baselines)


def test_without_inducing_the_meta_gp_takes_half_of_what_it_summarises(capsys, folder, test_csv,
                                                                       modules_dir):
    """Three modules of 6 inducing inputs: M = ⌈18/2⌉ = 9, and the meta-GP still predicts like
    the exact GP; two of them with 40 raw rows: M = ⌈(12 + 40)/2⌉ = 26."""
    out = run_ok(capsys, "recycle", modules_dir, "--steps", 30, "--out", folder / "half")
    assert "M = 9 " in out
    assert load_module(folder / "half.safetensors").num_inducing == 9
    held_out, baselines = test_csv
    assert_near_the_exact_gp(json.loads(run_ok(capsys, "evaluate", folder / "half.safetensors",
                                               "--data", held_out, "--json")), baselines)
    raw = write_csv(folder / "raw_rows.csv", {"x": np.linspace(0.0, 10.0, 40),
                                              "y": np.sin(np.linspace(0.0, 10.0, 40))})
    out = run_ok(capsys, "recycle", modules_dir / "part000.safetensors",
                 modules_dir / "part002.safetensors", "--data", raw, "--steps", 10,
                 "--out", folder / "half_raw")
    assert "M = 26 " in out


def test_module_files_and_raw_data(capsys, folder, data_csv, modules_dir):
    raw = write_csv(folder / "raw.csv", {"x": np.linspace(0.0, 10.0, 40),
                                         "y": np.sin(np.linspace(0.0, 10.0, 40))})
    out = run_ok(capsys, "recycle", modules_dir / "part000.safetensors",
                 modules_dir / "part002.safetensors", "--data", raw, "--inducing", 8,
                 "--steps", 10, "--out", folder / "with_raw")
    assert "recycled 2 modules (N = 100) and 40 raw points" in out
    meta = load_module(folder / "with_raw.safetensors")
    assert meta.info["modules"] == ["part000", "part002"]
    assert meta.num_data == 100 + 40
    assert meta.info["likelihood_source"] == "raw data"


def test_bad_inputs_give_one_line_errors(capsys, folder, data_csv, modules_dir):
    message = run_failing(capsys, "recycle", modules_dir, modules_dir / "part001.safetensors",
                          "--inducing", 5, "--out", folder / "twice")
    assert "part001.safetensors is given twice" in message
    message = run_failing(capsys, "recycle", folder / "missing", "--inducing", 5,
                          "--out", folder / "x")
    assert "missing" in message
    message = run_failing(capsys, "recycle", modules_dir, "--inducing", 5,
                          "--out", folder / "no_such_dir" / "meta")
    assert "does not exist" in message
    message = run_failing(capsys, "recycle", modules_dir, "--inducing", 0, "--out", folder / "x")
    assert "--inducing" in message

    other = folder / "other_fit"
    rescaled = write_csv(folder / "rescaled.csv", {"z": np.linspace(0.0, 20.0, 60),
                                                   "y": np.cos(np.linspace(0.0, 20.0, 60))})
    assert main(["fit-local", str(rescaled), "--target", "y", "--partitions", "2",
                 "--partition-by", "contiguous", *FIT, "--out", str(other)]) == 0
    mixed = {**load_modules(modules_dir),
             "foreign": next(iter(load_modules(other).values()))}
    save_modules(mixed, folder / "mixed")
    message = run_failing(capsys, "recycle", folder / "mixed", "--inducing", 5,
                          "--out", folder / "x")
    assert "'foreign' differ" in message and "data columns" in message


@pytest.fixture(scope="module")
def unbounded_dir(folder):
    """Five overlapping under-fitted modules (S = I, wider than their prior in some directions):
    their ensemble bound is unbounded above."""
    modules = {}
    identity = Standardisation(np.zeros(1), np.ones(1), 0.0, 1.0)
    for k in range(5):
        Z = torch.linspace(0.0, 1.0, 5).unsqueeze(-1) + 0.02 * k
        modules[f"o{k}"] = Module(
            stationary_kernel("rbf", torch.tensor([[0.3]]), torch.tensor([2.0]), 1), "gaussian",
            {},
            {"variance": torch.tensor(0.1)}, Z, torch.randn(1, 5), torch.eye(5).unsqueeze(0),
            10, 0.0, identity, 1e-9, {"name": f"o{k}"}, columns=Columns(["x"], "y"))
    return save_modules(modules, folder / "unbounded")


def test_unbounded_bound_raises_or_is_repaired(capsys, folder, unbounded_dir):
    message = run_failing(capsys, "recycle", unbounded_dir, "--inducing", 8, "--steps", 5,
                          "--out", folder / "unbounded_meta")
    assert "unbounded above" in message and "λ_min(Λ_w) = -" in message
    # the command line names its own flag, not the Python API, and the under-fitted modules
    assert "--on-unbounded repair" in message
    assert "repair_sites" not in message and "clip_site_precisions" not in message
    assert all(f"o{k}" in message for k in range(5))
    assert not message.endswith("...")  # not cut by the CLI's length limit
    assert not (folder / "unbounded_meta.safetensors").exists()

    out = run_ok(capsys, "recycle", unbounded_dir, "--inducing", 8, "--steps", 5, "--uncollapsed",
                 "--on-unbounded", "repair", "--out", folder / "repaired")
    assert "site repair clipped" in out
    assert load_module(folder / "repaired.safetensors").info["recycle"]["site_repairs"]


def test_unbounded_bound_can_warn(capsys, folder, unbounded_dir):
    capsys.readouterr()
    assert main(["recycle", str(unbounded_dir), "--inducing", "8", "--steps", "1",
                 "--uncollapsed", "--on-unbounded", "warn", "--out", str(folder / "warned")]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines()
                if line.startswith("pyrogp: warning:") and "unbounded" in line]
    assert len(warnings) == 1 and "unbounded above" in warnings[0]
    assert "--on-unbounded" in warnings[0] and "repair_sites" not in warnings[0]


def test_unbounded_collapsed_fit_names_the_flag(capsys, folder, unbounded_dir):
    """The collapsed bound has no optimum when unbounded, so it stops even with warn."""
    message = run_failing(capsys, "recycle", unbounded_dir, "--inducing", 8, "--steps", 5,
                          "--collapsed", "--on-unbounded", "warn",
                          "--out", folder / "unbounded_collapsed")
    assert "unbounded above" in message and "--on-unbounded repair" in message
    assert "repair_sites" not in message


def test_unbounded_after_repair_does_not_advise_the_repair(capsys, folder, unbounded_dir,
                                                           monkeypatch):
    from pyrogp_models.inference import recycling

    from pyrogp_models.errors import UnboundedBoundError

    def unbounded(*args, **kwargs):
        raise UnboundedBoundError("Python advice: repair_sites=True", -2.5, ["o1"])

    monkeypatch.setattr(recycling, "recycle", unbounded)
    message = run_failing(capsys, "recycle", unbounded_dir, "--inducing", 8,
                          "--on-unbounded", "repair", "--out", folder / "never")
    assert "λ_min(Λ_w) = -2.5" in message and "o1" in message
    assert "clipped (--on-unbounded repair)" in message and "rerun" not in message
    assert "repair_sites" not in message


def test_demo_runs_end_to_end(tmp_path, capsys, monkeypatch):
    """The demo's pipeline on a sixth of the sunspot series, sized so that its models learn the
    solar cycle (the --fast sizes stop after three L-BFGS steps, near the constant predictor):
    every model must beat the constant predictor and interpolation of the training months."""
    settings = demo.Settings(num_partitions=6, local_inducing=16, global_inducing=80, steps=15,
                             temperatures=(10.0,), stride=4)
    monkeypatch.setattr(demo, "FAST", settings)
    reports = demo.main(fast=True, output=tmp_path)
    out = capsys.readouterr().out
    assert len(reports) == 4
    X, y = demo.sunspot_series(settings.stride)
    fit, _, test = demo.split(len(y), demo.SEED)
    constant = constant_scores(y[fit], y[test])  # rmse 1.14, nlpd 1.56
    interpolation = interpolation_rmse(X[fit], y[fit], X[test], y[test])  # 0.547
    for report in reports.values():  # rmse 0.54-0.59, nlpd 0.85-0.91 here
        assert report["rmse"] < 1.15 * interpolation and report["rmse"] < 0.55 * constant["rmse"]
        assert report["nlpd"] < constant["nlpd"] - 0.6
    meta = next(r for name, r in reports.items() if name.startswith("meta-GP"))
    full = next(r for name, r in reports.items() if name.startswith("full-data SVGP"))
    assert meta["nlpd"] < full["nlpd"] + 0.1
    assert "best of" in out and "meta-GP" in out
    assert (tmp_path / "pipeline.png").stat().st_size > 10_000
    assert len(load_modules(tmp_path / "modules")) == settings.num_partitions
    meta = load_module(tmp_path / "meta.safetensors")
    assert meta.num_inducing == settings.global_inducing and meta.columns.target
