"""``pyrogp fit-multitask`` and multitask files: exact round trips, the command line end to end on
heterotopic two-task data (long and wide form) against per-task constant predictors, one-line
errors for bad input, and damaged or mislabelled files."""

import argparse
import json
import math
import re

import numpy as np
import pytest
import torch
from pyrogp_models.inference.cli import documented_parser, main
from pyrogp_models.inference.multitask_fit import MultitaskSpec, fit_multitask_dgp
from pyrogp_models.inference.trainer import TrainConfig

from helpers import resigned, run_failing, run_ok, write_csv
from pyrogp_models.data import load_table
from pyrogp_models.errors import ModuleFileError
from pyrogp_models.models.multitask import toy_tasks
from pyrogp_models.models.multitask.families import SUMMARIES
from pyrogp_models.models.multitask.files import load_multitask, save_multitask
from pyrogp_models.models.multitask.options import MAX_DEFAULT_TASK_INDUCING
from pyrogp_models.modules.files import load_module
from pyrogp_models.modules.signed import file_format

FIT = ["--inducing", "8", "--steps", "200"]


def two_tasks(num_points: int, seed: int) -> dict[str, np.ndarray]:
    """Heterotopic long-form data: every row one task's label at its own input; task 1 is a
    scaled and shifted copy of task 0 (shared structure, different scales)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, num_points)
    task = rng.integers(0, 2, num_points).astype(float)
    f = np.sin(6 * x)
    y = np.where(task == 0, f, 3 * f + 10) + 0.1 * rng.normal(size=num_points)
    return {"x": x, "task": task, "y": y}


def wide(long: dict[str, np.ndarray], names=("a", "b")) -> dict[str, np.ndarray]:
    """The same rows in wide form: one target column per task, NaN where not observed."""
    return {"x": long["x"], **{name: np.where(long["task"] == t, long["y"], np.nan)
                               for t, name in enumerate(names)}}


@pytest.fixture(scope="module")
def long_csv(folder):
    return write_csv(folder / "train.csv", two_tasks(160, seed=0))


@pytest.fixture(scope="module")
def held_out_csv(folder):
    return write_csv(folder / "test.csv", two_tasks(200, seed=1))


@pytest.fixture(scope="module")
def fitted(folder, long_csv):
    out = folder / "smdgp.safetensors"
    assert main(["--threads", "1", "fit-multitask", str(long_csv), "--task-column", "task",
                 "--target", "y", "--model", "smdgp", *FIT, "--out", str(out)]) == 0
    return out


# Round trip ----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["smdgp", "mmdgp", "cmdgp", "igp"])
@pytest.mark.filterwarnings("ignore::pyrogp_models.errors.ConstantFitWarning")  # 10 steps
def test_a_saved_file_predicts_exactly_as_the_fitted_model(tmp_path, kind):
    fit = fit_multitask_dgp(toy_tasks(20), MultitaskSpec(model=kind, num_inducing=5,
                                                         predictive_samples=30),
                            TrainConfig(steps=10, tol=None))
    fit.predictor.info = {"tasks": ["first", "second"], "features": ["x"]}
    loaded = load_multitask(save_multitask(fit.predictor, tmp_path / "m.safetensors"))
    X, tasks = np.random.default_rng(0).uniform(size=(9, 1)), [0, 1, 1, 0, 1, 0, 0, 1, 1]
    y = np.random.default_rng(1).normal(size=9)
    assert loaded.dtype == torch.float64 and type(loaded.model) is type(fit.model)
    for before, after in zip(fit.predictor.predict_y(X, tasks), loaded.predict_y(X, tasks),
                             strict=True):
        assert torch.equal(before, after)
    assert torch.equal(fit.predictor.log_predictive(X, y, tasks),
                       loaded.log_predictive(X, y, tasks))
    assert loaded.info == fit.predictor.info and loaded.num_samples == 30
    assert torch.equal(loaded.model.ard_weights(), fit.model.ard_weights())


# The command line end to end ------------------------------------------------------------------
def constant_scores(train: dict, test: dict, task: int) -> tuple[float, float]:
    """RMSE and NLPD on the test rows of ``task`` of N(mean, variance) of its training rows."""
    y_train = train["y"][train["task"] == task]
    y_test = test["y"][test["task"] == task]
    mean, var = y_train.mean(), y_train.var()
    rmse = float(np.sqrt(np.mean((y_test - mean) ** 2)))
    nlpd = float(np.mean(0.5 * np.log(2 * math.pi * var) + (y_test - mean) ** 2 / (2 * var)))
    return rmse, nlpd


def test_fit_info_predict_evaluate_beat_a_constant_per_task(capsys, folder, fitted, long_csv,
                                                            held_out_csv):
    assert file_format(fitted) == "pyrogp-multitask"
    info = run_ok(capsys, "info", fitted)
    assert "multitask model: smdgp (shared multitask DGP" in info
    assert "ARD weights" in info and "task column 'task', target 'y'" in info
    train, test = load_table(long_csv), load_table(held_out_csv)
    counts = [int((train.column("task") == t).sum()) for t in range(2)]
    assert re.search(rf"^0\s+{counts[0]}\s", info, re.M) and re.search(rf"^1\s+{counts[1]}\s",
                                                                       info, re.M)
    summary = json.loads(run_ok(capsys, "info", fitted, "--json"))
    phases = summary["phases"]
    assert [phase["model"] for phase in phases] == ["igp", "smdgp"]
    assert summary["elbo"] >= phases[0]["elbo"] - 1e-3          # never below the iGP it holds
    assert summary["steps"] == sum(phase["steps"] for phase in phases)
    assert f"fit: final ELBO {summary['elbo']:.6g}" in info
    above = summary["elbo"] - summary["constant_log_likelihood"]
    assert above > 0 and (f"({above:.6g} above a constant per task's log likelihood, "
                          f"{summary['constant_log_likelihood']:.6g})") in info

    run_ok(capsys, "predict", fitted, "--data", held_out_csv, "--out", folder / "pred.csv")
    predictions = load_table(folder / "pred.csv")
    assert predictions.columns == ["x", "task", "mean", "var"]
    predictor = load_multitask(fitted)
    mean, var = predictor.predict_y(test.select(["x"]), test.column("task"))
    np.testing.assert_array_equal(predictions.column("mean"), mean.numpy())
    np.testing.assert_array_equal(predictions.column("var"), var.numpy())

    report = json.loads(run_ok(capsys, "evaluate", fitted, "--data", held_out_csv, "--json"))
    assert set(report) == {"tasks", "overall"} and set(report["tasks"]) == {"0", "1"}
    train_columns = {name: train.column(name) for name in train.columns}
    test_columns = {name: test.column(name) for name in test.columns}
    for t, name in enumerate(["0", "1"]):
        assert {"nlpd", "rmse"} <= set(report["tasks"][name])
        rmse, nlpd = constant_scores(train_columns, test_columns, t)
        assert report["tasks"][name]["rmse"] < 0.5 * rmse
        assert report["tasks"][name]["nlpd"] < nlpd - 1.0
    assert report["overall"]["n"] == test.num_rows
    table = run_ok(capsys, "evaluate", fitted, "--data", held_out_csv)
    assert re.search(r"^overall\s", table, re.M) and "nlpd" in table


def test_cgp_takes_its_coregionalisation_and_rank_from_the_command_line(capsys, folder,
                                                                          long_csv):
    out = folder / "lmc.safetensors"
    run_ok(capsys, "fit-multitask", long_csv, *LONG, "--model", "cgp", "--coregionalisation",
           "lmc", "--rank", "3", "--inducing", "8", "--steps", "20", "--out", out)
    model = load_multitask(out).model
    assert (model.options.coregionalisation, model.options.coregional_rank) == ("lmc", 3)
    lengthscales = model.top.layer.kernel.lengthscale.detach()
    assert lengthscales.shape[0] == 3 and not torch.equal(lengthscales[0], lengthscales[1])
    assert model.top.mixing.shape == (2, 3)
    assert "coregionalisation lmc: 3 latent GPs mixed into every output" in run_ok(
        capsys, "info", out)


def test_a_deep_model_takes_its_top_mean_from_the_command_line(capsys, folder, long_csv):
    out = folder / "zero_mean.safetensors"
    run_ok(capsys, "fit-multitask", long_csv, *LONG, "--model", "idgp", "--top-mean", "zero",
           "--inducing", "4", "--steps", "2", "--out", out)
    model = load_multitask(out).model
    assert model.options.top_mean == "zero" and model.top.mean_weights is None
    assert "top-layer mean: zero" in run_ok(capsys, "info", out)


def test_a_default_cgp_on_three_outputs_reports_every_candidate_and_keeps_the_best_held_out(
        capsys, folder):
    rng = np.random.default_rng(4)
    x = np.sort(rng.uniform(0, 1, 30))
    a, b = np.sin(6 * x), np.cos(4 * x)
    table = {"x": x, "a": a + 0.05 * rng.normal(size=30), "b": b + 0.05 * rng.normal(size=30),
             "c": a - b + 0.3 * rng.normal(size=30)}
    out = folder / "ranks.safetensors"
    printed = run_ok(capsys, "--threads", "1", "fit-multitask",
                     write_csv(folder / "three.csv", table), "--target", "a,b,c", "--out", out)
    candidates = [f"cgp (R = {rank}, {noise} noise)" for rank in (2, 3)
                  for noise in ("correlated", "independent")]
    assert all(candidate in printed for candidate in candidates)
    options = load_multitask(out).model.options
    rank, noise = options.coregional_rank, options.noise
    assert f"M = {30 if rank == 2 else 20}, R = {rank}, {noise} noise: ELBO" in printed
    assert "held-out MSE" in printed
    described = run_ok(capsys, "info", out)
    assert f"phase cgp (R = {5 - rank}, {noise} noise)" in described
    assert "held-out MSE" in described
    summary = json.loads(run_ok(capsys, "info", out, "--json"))
    errors = {phase["model"]: phase["held_out"] for phase in summary["phases"]}
    assert errors[f"cgp (R = {rank}, {noise} noise)"] == min(errors.values())
    assert len(set(errors.values())) == 4
    # the seconds in all count the candidates' held-out errors and ELBO estimates, not only
    # training
    training = sum(phase["seconds"] for phase in summary["phases"])
    assert summary["training_seconds"] == pytest.approx(training)
    assert summary["seconds"] > training
    assert (f"{training:.1f} s of training, {summary['seconds']:.1f} s in all" in printed
            and "s of training" in described)


def test_a_dropped_candidate_is_one_warning_line_and_named_in_the_tables(capsys, folder):
    """Outputs a and c exact linear copies where a held-out fold keeps both, not over all rows
    (tests/test_multitask_held_out.py): the correlated-noise candidates are dropped, each with
    one ``pyrogp: warning:`` line, and shown as dropped by the fit's table and by ``info``."""
    pairs = toy_tasks(20, seed=0)
    x = pairs[0][0][:, 0]
    c = pairs[0][1] - 0.5 * np.interp(x, pairs[1][0][:, 0], pairs[1][1])
    long = [(x, 0, pairs[0][1]), (pairs[1][0][:, 0], 1, pairs[1][1]), (x, 2, c)]
    table = {"x": np.concatenate([inputs for inputs, _, _ in long]),
             "task": np.concatenate([np.full(len(y), t, float) for _, t, y in long]),
             "y": np.concatenate([y for _, _, y in long])}
    out = folder / "dropped.safetensors"
    capsys.readouterr()
    assert main(["--threads", "1", "fit-multitask", str(write_csv(folder / "dropped.csv", table)),
                 *LONG, "--inducing", "9", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    warned = [line for line in captured.err.splitlines() if line.startswith("pyrogp: warning:")]
    assert len(warned) == 2 and all("correlated noise dropped" in line for line in warned)
    assert "Traceback" not in captured.err and "UserWarning" not in captured.err
    assert all(re.search(rf"cgp \(R = {rank}, correlated noise\).*dropped", captured.out)
               for rank in (2, 3))
    described = run_ok(capsys, "info", out)
    assert "correlated noise): dropped: a fit to its held-out folds failed" in described


def test_the_default_is_an_lmc_cgp_and_the_exact_gp_where_the_largest_task_has_every_input(
        capsys, folder):
    """No flags: cGP with a kernel per latent GP, M = the largest task's rows; where that task
    is observed at every input, the inducing inputs are those inputs and stay fixed (``info``
    says so), and the fit beats independent GPs on a stretch hidden from task b (its values
    are empty cells, as pandas writes a missing value)."""
    rng = np.random.default_rng(3)
    x = np.sort(rng.uniform(0, 1, 80))
    shared = np.sin(6 * x) + 0.5 * np.sin(40 * x)                     # fast co-variation too
    table = {"x": x, "a": shared + 0.05 * rng.normal(size=80),
             "b": 2 * shared + 1 + 0.05 * rng.normal(size=80)}
    hidden = (x > 0.4) & (x < 0.6)
    train = {**table, "b": np.where(hidden, np.nan, table["b"])}
    csv = write_csv(folder / "isotopic.csv", train)
    csv.write_text(csv.read_text().replace("nan", ""))
    rmse = {}
    for model in ("cgp", "igp"):
        out = folder / f"default_{model}.safetensors"
        flags = [] if model == "cgp" else ["--model", "igp"]
        run_ok(capsys, "--threads", "1", "fit-multitask", csv, "--target", "a,b", *flags,
               "--out", out)
        predictor = load_multitask(out)
        mean, _ = predictor.predict_y(x[hidden][:, None], np.ones(hidden.sum(), int))
        rmse[model] = float(np.sqrt(np.mean((mean.numpy() - table["b"][hidden]) ** 2)))
    model = load_multitask(folder / "default_cgp.safetensors").model
    assert (model.kind, model.options.coregionalisation) == ("cgp", "lmc")
    assert model.options.num_inducing == 80 and model.options.learn_inducing is False
    assert "M = 80 inducing inputs per process (fixed)" in run_ok(
        capsys, "info", folder / "default_cgp.safetensors")
    assert rmse["cgp"] < 0.5 * rmse["igp"], rmse


def test_the_default_cgp_predicts_a_hidden_output_from_the_noise_it_shares_with_its_site(
        capsys, folder):
    """Wide data whose outputs share most of their noise at every input (a rough shared term
    no smooth f explains): the default cGP learns the correlation (``info`` shows it), and
    ``predict`` on the training table gives the hidden cells given the row's other output —
    the predictor's :meth:`predict_given_outputs` — much closer than the independent-noise
    model, and ``evaluate`` on the stretch scores the same predictions; ``--rows-in-fit``
    conditions through the noise alone."""
    rng = np.random.default_rng(4)
    x = np.sort(rng.uniform(0, 1, 80))
    common = 0.3 * rng.normal(size=80)
    table = {"x": x, "a": np.sin(6 * x) + common + 0.03 * rng.normal(size=80),
             "b": np.cos(4 * x) - common + 0.03 * rng.normal(size=80)}
    hidden = (x > 0.4) & (x < 0.6)
    csv = write_csv(folder / "shared_noise.csv", {**table, "b": np.where(hidden, np.nan,
                                                                          table["b"])})
    stretch = write_csv(folder / "stretch.csv", {key: values[hidden]
                                                 for key, values in table.items()})
    rmse = {}
    for noise in ("correlated", "independent"):
        out = folder / f"noise_{noise}.safetensors"
        run_ok(capsys, "--threads", "1", "fit-multitask", csv, "--target", "a,b", "--noise",
               noise, "--out", out)
        described = run_ok(capsys, "info", out)
        assert ("correlation of the noise" in described) == (noise == "correlated")
        run_ok(capsys, "predict", out, "--data", csv, "--out", folder / f"{noise}.npz")
        with np.load(folder / f"{noise}.npz") as saved:
            predicted = saved["mean_b"][hidden]
        predictor = load_multitask(out)
        known = np.stack([table["a"], np.where(hidden, np.nan, table["b"])], -1)
        given, _ = predictor.predict_given_outputs(x[:, None], known)
        np.testing.assert_allclose(predicted, given[1].numpy()[hidden], rtol=1e-12)
        rmse[noise] = float(np.sqrt(np.mean((predicted - table["b"][hidden]) ** 2)))
        report = json.loads(run_ok(capsys, "evaluate", out, "--data", stretch, "--json"))
        assert report["tasks"]["b"]["rmse"] == pytest.approx(rmse[noise], rel=1e-9)
        run_ok(capsys, "predict", out, "--data", csv, "--rows-in-fit", "--out",
               folder / "in_fit.npz")
        in_fit, _ = predictor.predict_given_outputs(x[:, None], known, rows_in_fit=True)
        with np.load(folder / "in_fit.npz") as saved:
            np.testing.assert_allclose(saved["mean_b"], in_fit[1].numpy(), rtol=1e-12)
    correlation = load_multitask(folder / "noise_correlated.safetensors").model \
        .site_noise.correlation()
    assert float(correlation[1, 0]) < -0.8
    assert rmse["correlated"] < 0.5 * rmse["independent"], rmse


def test_a_fit_no_better_than_a_constant_per_task_warns_in_one_line(capsys, folder):
    """Labels all 1 in one task and all 0 in the other: a constant per task scores log 1 = 0,
    which no ELBO (an expected log likelihood below 0 less a KL) reaches; the fit is written and
    the command says so in one line."""
    data = two_tasks(60, seed=0)
    table = write_csv(folder / "constant_labels.csv", {**data, "y": 1.0 - data["task"]})
    out = folder / "constant_labels.safetensors"
    capsys.readouterr()
    assert main(["--threads", "1", "fit-multitask", str(table), "--task-column", "task",
                 "--target", "y", "--features", "x", "--model", "igp", "--likelihood",
                 "bernoulli", *FIT, "--out", str(out)]) == 0
    warning = [line for line in capsys.readouterr().err.splitlines()
               if "constant per task" in line]
    assert len(warning) == 1 and re.fullmatch(
        r"pyrogp: warning: the fit's ELBO -\S+ is no higher than the log likelihood of a "
        r"constant per task \(0\): it has learnt nothing from the inputs", warning[0]), warning
    assert json.loads(run_ok(capsys, "info", out, "--json"))["constant_log_likelihood"] == 0


def test_wide_form_classification_beats_the_majority_class(capsys, folder):
    def labels(seed):
        data = two_tasks(200, seed)
        classes = (np.sin(6 * data["x"]) > 0).astype(float)
        flipped = np.where(data["task"] == 1, 1 - classes, classes)   # task b: the opposite
        return wide({**data, "y": flipped})

    train, test = labels(0), labels(1)
    train_csv = write_csv(folder / "labels_train.csv", train)
    held_out_csv = write_csv(folder / "labels_test.csv", test)
    out = folder / "labels.safetensors"
    printed = run_ok(capsys, "--threads", "1", "fit-multitask", train_csv, "--target", "a,b",
                     "--model", "igp", "--likelihood", "bernoulli", *FIT, "--out", out)
    assert re.search(rf"^a\s+{int(np.isfinite(train['a']).sum())}$", printed, re.M)
    assert "ELBO" in printed and " s in all; written to " in printed

    run_ok(capsys, "predict", out, "--data", held_out_csv, "--out", folder / "prob.npz")
    with np.load(folder / "prob.npz") as saved:
        assert set(saved.files) == {"x", "prob_a", "prob_b"}
        assert ((saved["prob_a"] > 0) & (saved["prob_a"] < 1)).all()

    report = json.loads(run_ok(capsys, "evaluate", out, "--data", held_out_csv, "--json"))
    for name in ("a", "b"):
        scores = report["tasks"][name]
        assert {"nlpd", "accuracy", "roc_auc"} <= set(scores)
        observed = test[name][np.isfinite(test[name])]
        majority = max(observed.mean(), 1 - observed.mean())
        assert scores["accuracy"] > majority + 0.2 and scores["roc_auc"] > 0.9
        assert scores["nlpd"] < math.log(2) - 0.2
    assert report["overall"]["n"] == int(np.isfinite(test["a"]).sum()
                                         + np.isfinite(test["b"]).sum())


def test_help_names_every_model_and_the_default_size(capsys):
    """The terminal's help (written without importing the models) names every model the
    library registers and its default M; the documentation's describes each in one line."""
    text = " ".join(run_ok(capsys, "fit-multitask", "--help").split())
    for kind in SUMMARIES:
        assert re.search(rf"\b{kind}\b", text), kind
    assert "(default: cgp," in text
    assert (f"(default: the rows of the largest task, all of them up to "
            f"{MAX_DEFAULT_TASK_INDUCING}); ") in text
    assert "fit-multitask" in run_ok(capsys, "--help")
    (action,) = [a for a in documented_parser()._actions
                 if isinstance(a, argparse._SubParsersAction)]
    epilog = action.choices["fit-multitask"].epilog
    for kind, summary in SUMMARIES.items():
        assert re.search(rf"^  {kind}\s+{re.escape(summary)}$", epilog, re.M), kind


# Bad input -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def awkward_csvs(folder):
    data = two_tasks(40, seed=2)
    nan_x = {**data, "x": np.where(np.arange(40) == 5, np.nan, data["x"])}
    nan_y = {**data, "y": np.where(np.arange(40) == 7, np.nan, data["y"])}
    half = {**data, "y": np.where(data["task"] == 1, 0.5, 1.0)}
    negative = {**data, "y": np.where(data["task"] == 1, -1.0, 1.0)}
    empty = {**wide(data), "c": np.full(40, np.nan)}
    copied = {"x": data["x"], "a": data["y"], "b": 2 * data["y"] + 1}
    return {name: write_csv(folder / f"{name}.csv", columns) for name, columns in
            {"data": data, "nan_x": nan_x, "nan_y": nan_y, "half": half,
             "negative": negative, "empty": empty, "copied": copied}.items()}


LONG = ["--task-column", "task", "--target", "y"]
BAD_FITS = {
    "unknown task column": ("data", ["--task-column", "nope", "--target", "y"],
                            "unknown column 'nope'"),
    "missing target column": ("data", ["--task-column", "task", "--target", "nope"],
                              "unknown column 'nope'"),
    "missing feature column": ("data", [*LONG, "--features", "x,zz"], "unknown column 'zz'"),
    "a task with no rows": ("empty", ["--target", "a,b,c"],
                            "task c has no rows: its target column holds no value"),
    "bernoulli label 0.5": ("half", [*LONG, "--likelihood", "bernoulli"],
                            "column 'y', task 1: labels must be 0 or 1"),
    "negative class": ("negative", [*LONG, "--likelihood", "categorical", "--classes", "2"],
                       "column 'y', task 1: labels must be integers in 0..1"),
    "NaN feature": ("nan_x", LONG, "column 'x' contains NaN or inf (first at row 6)"),
    "NaN target": ("nan_y", LONG, "column 'y' contains NaN or inf (first at row 8)"),
    "one target, no task column": ("data", ["--target", "y"], "give --task-column"),
    "task column with two targets": ("data", ["--task-column", "task", "--target", "x,y"],
                                     "takes one --target column"),
    "a target twice": ("data", ["--target", "y,y"], "name a column twice: y y"),
    "task column as target": ("data", ["--task-column", "y", "--target", "y"],
                              "name a column twice: y y"),
    "target as feature": ("data", [*LONG, "--features", "x,y"], "both features and target"),
    "--shared for igp": ("data", [*LONG, "--model", "igp", "--shared", "2"],
                         "--shared applies to smdgp, mmdgp, cmdgp, not igp"),
    "--private for cgp": ("data", [*LONG, "--private", "2"],
                          "--private applies to mmdgp, idgp, not cgp"),
    "no inducing inputs": ("data", [*LONG, "--inducing", "0"], "--inducing must be positive"),
    "--rank for smdgp": ("data", [*LONG, "--model", "smdgp", "--rank", "2"],
                         "--rank applies to cgp, cmdgp, not smdgp"),
    "--coregionalisation for igp": ("data", [*LONG, "--model", "igp", "--coregionalisation",
                                             "lmc"],
                                    "--coregionalisation applies to cgp, cmdgp, not igp"),
    "rank zero": ("data", [*LONG, "--model", "cgp", "--rank", "0"], "--rank must be positive"),
    "--classes for gaussian": ("data", [*LONG, "--classes", "3"], "--classes applies to"),
    "--link for gaussian": ("data", [*LONG, "--link", "probit"], "--link applies to"),
    "--noise for igp": ("data", [*LONG, "--model", "igp", "--noise", "correlated"],
                        "--noise applies to cgp, not igp"),
    "--top-mean for cgp": ("data", [*LONG, "--top-mean", "linear"],
                           "--top-mean applies to smdgp, mmdgp, idgp, not cgp"),
    "correlated noise of copied outputs": ("copied", ["--target", "a,b", "--noise",
                                                      "correlated"],
                                           "tasks 0 and 1 are exact linear copies"),
}


def test_rows_in_fit_apply_to_wide_single_layer_gaussian_files_only(capsys, folder, fitted,
                                                                    held_out_csv):
    for command in ("predict", "evaluate"):
        extra = ["--out", folder / "rows.csv"] if command == "predict" else []
        error = run_failing(capsys, command, fitted, "--data", held_out_csv, "--rows-in-fit",
                            *extra)
        assert "--rows-in-fit applies to wide-form multitask files of igp or cgp" in error


@pytest.mark.parametrize("case", BAD_FITS, ids=list(BAD_FITS))
def test_bad_fit_input_gives_one_line_and_writes_nothing(capsys, folder, awkward_csvs, case):
    csv, arguments, message = BAD_FITS[case]
    out = folder / "bad.safetensors"
    error = run_failing(capsys, "fit-multitask", awkward_csvs[csv], *arguments, "--steps", "2",
                        "--out", out)
    assert message in error
    assert not out.exists()


def test_outputs_that_are_not_multitask_files_are_not_overwritten(capsys, folder, awkward_csvs):
    csv = awkward_csvs["data"]
    before = csv.read_bytes()
    assert "refusing to overwrite" in run_failing(capsys, "fit-multitask", csv, *LONG,
                                                  "--out", csv)
    assert csv.read_bytes() == before
    assert "does not exist" in run_failing(capsys, "fit-multitask", csv, *LONG,
                                           "--out", folder / "nowhere" / "m.safetensors")


def test_bad_prediction_input_gives_one_line(capsys, folder, fitted, awkward_csvs):
    data = two_tasks(10, seed=3)
    unseen = write_csv(folder / "unseen.csv", {**data, "task": np.full(10, 7.0)})
    out = folder / "p.csv"
    assert "task column 'task' holds 7, which is not among the tasks 0, 1" in run_failing(
        capsys, "predict", fitted, "--data", unseen, "--out", out)
    no_task = write_csv(folder / "no_task.csv", {"x": data["x"], "y": data["y"]})
    assert "unknown column 'task'" in run_failing(capsys, "predict", fitted, "--data", no_task,
                                                  "--out", out)
    assert "column 'x' contains NaN" in run_failing(capsys, "evaluate", fitted, "--data",
                                                    awkward_csvs["nan_x"])
    assert "single model" in run_failing(capsys, "evaluate", fitted, "--data", unseen,
                                         "--rule", "poe")
    assert not out.exists()


# Damaged and mislabelled files ---------------------------------------------------------------
@pytest.mark.parametrize("where", [0.3, 0.6, 0.95])
def test_a_tampered_tensor_is_detected(capsys, fitted, tmp_path, held_out_csv, where):
    path = tmp_path / "flipped.safetensors"
    data = bytearray(fitted.read_bytes())
    header = 8 + int.from_bytes(data[:8], "little")
    data[header + int(where * (len(data) - header - 1))] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(ModuleFileError, match=re.escape(f"{path}: checksum mismatch")):
        load_multitask(path)
    assert f"{path}: checksum mismatch" in run_failing(capsys, "evaluate", path,
                                                       "--data", held_out_csv)


def test_a_truncated_file_is_refused(capsys, fitted, tmp_path, held_out_csv):
    path = tmp_path / "cut.safetensors"
    path.write_bytes(fitted.read_bytes()[:-100])
    with pytest.raises(ModuleFileError,
                       match=re.escape(f"{path}: not a readable multitask model file")):
        load_multitask(path)
    assert str(path) in run_failing(capsys, "predict", path, "--data", held_out_csv,
                                    "--out", tmp_path / "p.csv")
    assert not (tmp_path / "p.csv").exists()


def test_tampered_json_is_detected(fitted, tmp_path):
    data = fitted.read_bytes()
    edited = data.replace(b'\\"num_samples\\": 200', b'\\"num_samples\\": 900')
    assert edited != data and len(edited) == len(data)
    path = tmp_path / "edited.safetensors"
    path.write_bytes(edited)
    with pytest.raises(ModuleFileError, match="checksum mismatch"):
        load_multitask(path)


def _model(edit):
    return lambda record, tensors: edit(record["model"])


INVALID = {
    "unknown kind": (_model(lambda m: m.update(model="nonsense")),
                     "unknown multitask model kind 'nonsense'"),
    "another kind": (_model(lambda m: m.update(model="igp")),
                     "do not fit its igp model (Error(s) in loading state_dict for IGP: "
                     "Unexpected key(s)"),
    "missing tensor": (lambda r, t: t.pop("top.layer.q_mean_unconstrained"),
                       'do not fit its smdgp model (Error(s) in loading state_dict for SMDGP: '
                       'Missing key(s) in state_dict: "top.layer.q_mean_unconstrained"'),
    "NaN tensor": (lambda r, t: t.update({"top.layer.q_mean_unconstrained": torch.full_like(
        t["top.layer.q_mean_unconstrained"], math.nan)}), "contains NaN or inf"),
    "wrong shape": (lambda r, t: t.update({"top.layer.q_mean_unconstrained": t[
        "top.layer.q_mean_unconstrained"][..., :-1].contiguous()}),
                    "size mismatch for top.layer.q_mean_unconstrained"),
    "wrong task count": (_model(lambda m: m.update(num_tasks=3)), "standardisation"),
    "task names": (lambda r, t: r["info"].update(tasks=["0", "0"]), "not 2 distinct names"),
    "newer version": (lambda r, t: r.update(format_version=99), "newer"),
    "missing field": (lambda r, t: r.pop("standardisation"), "invalid record"),
    "a module file": (lambda r, t: r.update(format="pyrogp-module"),
                      "a module file, not a multitask model file"),
}


@pytest.mark.parametrize("case", INVALID, ids=list(INVALID))
def test_invalid_contents_are_refused_in_one_line(fitted, tmp_path, case):
    edit, message = INVALID[case]
    path = resigned(fitted, tmp_path / "edited.safetensors", edit)
    with pytest.raises(ModuleFileError, match=re.escape(message)) as error:
        load_multitask(path)
    text = str(error.value)
    assert text.startswith(f"{path}: ") and "\n" not in text


def test_module_and_multitask_files_are_told_apart(fitted, tmp_path, capsys, folder):
    with pytest.raises(ModuleFileError,
                       match=re.escape(f"{fitted}: a multitask model file, not a module file")):
        load_module(fitted)
    csv = write_csv(folder / "one_task.csv", {"x": np.linspace(0, 1, 20),
                                              "y": np.linspace(0, 1, 20)})
    modules = folder / "modules"
    run_ok(capsys, "fit-local", csv, "--target", "y", "--partitions", "1", "--inducing", "3",
           "--steps", "2", "--out", modules)
    module_file = next(modules.glob("*.safetensors"))
    with pytest.raises(ModuleFileError, match="a module file, not a multitask model file"):
        load_multitask(module_file)
    assert file_format(module_file) == "pyrogp-module" and file_format(csv) is None


def test_tasks_named_by_text_and_a_date_column_left_out_by_features(capsys, tmp_path):
    """A long-form table whose task column names its tasks ('ozone, 'temp') and that carries a
    text column no command uses: fit, info, predict (names written back) and evaluate by name;
    an NA target is a missing cell, not an error."""
    rng = np.random.default_rng(5)
    x = np.sort(rng.uniform(0, 1, 60))
    names = np.where(np.arange(60) % 2 == 0, "ozone", "temp")
    y = np.where(names == "ozone", np.sin(6 * x), np.cos(6 * x)) + 0.05 * rng.normal(size=60)
    lines = ["when,x,task,y"] + [f"2020-{i % 12 + 1:02d},{x[i]:.17g},{names[i]},{y[i]:.17g}"
                                 for i in range(60)]
    (tmp_path / "named.csv").write_text("\n".join(lines) + "\n")
    out = tmp_path / "named.safetensors"
    run_ok(capsys, "--threads", "1", "fit-multitask", tmp_path / "named.csv", "--task-column",
           "task", "--target", "y", "--features", "x", "--model", "igp", "--inducing", "6",
           "--out", out)
    assert load_multitask(out).info["tasks"] == ["ozone", "temp"]
    assert re.search(r"^ozone\s+30\s", run_ok(capsys, "info", out), re.M)
    run_ok(capsys, "predict", out, "--data", tmp_path / "named.csv", "--out",
           tmp_path / "pred.csv")
    predictions = load_table(tmp_path / "pred.csv")
    assert predictions.columns == ["x", "task", "mean", "var"]
    assert predictions.labels("task") == names.tolist()
    report = json.loads(run_ok(capsys, "evaluate", out, "--data", tmp_path / "named.csv",
                               "--json"))
    assert set(report["tasks"]) == {"ozone", "temp"}
    assert all(report["tasks"][name]["rmse"] < 0.5 * np.std(y[names == name])
               for name in ("ozone", "temp"))
    unknown = tmp_path / "unknown.csv"
    unknown.write_text("\n".join(lines[:3] + ["2021-01,0.5,wind,NA"]) + "\n")
    error = run_failing(capsys, "predict", out, "--data", unknown, "--out", tmp_path / "p2.csv")
    assert "task column 'task' holds wind, which is not among the tasks ozone, temp" in error
