"""The ``pyrogp`` command line, run in-process through ``pyrogp_models.inference.cli.main``."""

import json
import math
import subprocess
import sys
import types

import numpy as np
import pytest
import torch
from pyrogp_models.inference.cli import main

from helpers import constant_scores, gaussian_scores, run_failing, run_ok, write_csv
from pyrogp_models.data import load_table
from pyrogp_models.data.columns import Columns
from pyrogp_models.errors import DataError
from pyrogp_models.io import load_predictor
from pyrogp_models.modules.files import INDEX_NAME, load_modules, read_index

FAST = ["--inducing", "5", "--steps", "15"]




@pytest.fixture(scope="module")
def regression_csv(folder):
    rng = np.random.default_rng(0)
    x1 = rng.uniform(0, 10, 60)
    x2 = rng.normal(size=60)
    group = rng.integers(0, 3, 60).astype(float)
    y = np.sin(x1) + 0.3 * x2 + 0.1 * rng.normal(size=60)
    return write_csv(folder / "regression.csv", {"x1": x1, "x2": x2, "group": group, "y": y})


@pytest.fixture(scope="module")
def label_csv(folder):
    x = np.linspace(0, 10, 40)
    return write_csv(folder / "labels.csv", {"x": x, "label": (np.sin(x) > 0).astype(float)})


@pytest.fixture(scope="module")
def contiguous_modules(folder, regression_csv):
    out = folder / "contiguous"
    code = main(["fit-local", str(regression_csv), "--target", "y", "--features", "x1,x2",
                 "--partitions", "3", "--partition-by", "contiguous", *FAST, "--out", str(out)])
    assert code == 0
    return out


def test_fit_info_predict_evaluate_round_trip(capsys, folder, regression_csv,
                                              contiguous_modules):
    index = read_index(contiguous_modules)
    assert index["partition"]["kind"] == "contiguous"
    modules = load_modules(contiguous_modules)
    assert list(modules) == ["part000", "part001", "part002"]
    for module in modules.values():
        assert module.columns == Columns(["x1", "x2"], "y")
        assert "partition_column" not in module.info

    info = run_ok(capsys, "info", contiguous_modules)
    assert "part002" in info and "rbf" in info and "gaussian(variance=" in info
    assert "contiguous along input 0, 3 partitions" in info

    predictions = folder / "predictions.csv"
    run_ok(capsys, "predict", contiguous_modules, "--data", regression_csv, "--out", predictions)
    table = load_table(predictions)
    assert table.columns == ["x1", "x2", "mean", "var"] and table.num_rows == 60
    assert (table.column("var") > 0).all()

    report = json.loads(run_ok(capsys, "evaluate", contiguous_modules, "--data", regression_csv,
                               "--target", "y", "--json"))
    assert {"nlpd", "rmse", "mae", "n"} <= set(report) and report["n"] == 60
    # baselines on the same points: the constant predictor (rmse 0.57, nlpd 0.86) and least
    # squares on x1, x2 (rmse 0.57, nlpd 0.85); the three modules score 0.28 and 0.14
    data = load_table(regression_csv)
    y = data.column("y")
    design = np.column_stack([np.ones(60), data.select(["x1", "x2"])])
    fitted = design @ np.linalg.lstsq(design, y, rcond=None)[0]
    linear = gaussian_scores(y, fitted, np.mean((y - fitted) ** 2))
    for baseline in (constant_scores(y, y), linear):
        assert report["rmse"] < 0.6 * baseline["rmse"]
        assert report["nlpd"] < baseline["nlpd"] - 0.5
    # the written predictive (mean, var) is the one evaluate scores: its Gaussian NLPD and RMSE
    # recomputed from the file match (a variance written in the wrong units would not)
    written = gaussian_scores(y, table.column("mean"), table.column("var"))
    assert written["nlpd"] == pytest.approx(report["nlpd"], rel=1e-9)
    assert written["rmse"] == pytest.approx(report["rmse"], rel=1e-9)
    text = run_ok(capsys, "evaluate", contiguous_modules, "--data", regression_csv)
    assert "nlpd" in text and "rmse" in text



def test_info_json_gives_each_module_with_its_noise_in_data_units(capsys, folder,
                                                                   contiguous_modules):
    """The noise variance --json gives is the gap between the module's predictive variances of y
    and of f in data units (f's is in model units: times s_y²), for a module and a
    distributed-kernel file alike."""
    summary = json.loads(run_ok(capsys, "info", contiguous_modules, "--json"))
    modules = load_modules(contiguous_modules)
    assert [row["name"] for row in summary["modules"]] == list(modules)
    assert summary["partition_rule"]["kind"] == "contiguous"
    assert summary["columns"] == {"features": ["x1", "x2"], "target": "y"}
    X = torch.tensor([[5.0, 0.0]], dtype=torch.float64)
    for row in summary["modules"]:
        module = modules[row["name"]]
        scale = module.standardisation.y_scale
        noise = float(module.predict_y(X)[1] - scale ** 2 * module.predict_f(X)[1])
        assert row["likelihood"]["variance"] == pytest.approx(noise, rel=1e-8)
        assert (row["num_data"], row["num_inducing"]) == (module.num_data, module.num_inducing)
    distkernel = folder / "info_json.safetensors"
    assert main(["fit-distkernel", str(folder / "regression.csv"), "--target", "y",
                 "--features", "x1,x2", "--steps", "5", "--out", str(distkernel)]) == 0
    capsys.readouterr()
    summary = json.loads(run_ok(capsys, "info", distkernel, "--json"))
    predictor = load_predictor(distkernel)
    scale = predictor.standardisation.y_scale
    noise = float(predictor.predict_y(X)[1] - scale ** 2 * predictor.predict_f(X)[1])
    assert summary["likelihood"]["variance"] == pytest.approx(noise, rel=1e-8)
    assert (summary["model"], summary["num_data"]) == ("distributed-kernel", predictor.num_data)
    assert summary["features"] == ["x1", "x2"] and summary["elbo"] == predictor.elbo

def test_contiguous_folder_predicts_each_point_with_the_module_of_its_block(
        capsys, folder, regression_csv, contiguous_modules):
    out = folder / "routed.npz"
    run_ok(capsys, "predict", contiguous_modules, "--data", regression_csv, "--out", out)
    predicted = np.load(out)
    data = load_table(regression_csv)
    X = data.select(["x1", "x2"])
    boundaries = read_index(contiguous_modules)["partition"]["boundaries"]
    block = np.searchsorted(boundaries, X[:, 0], side="right")
    for k, module in enumerate(load_modules(contiguous_modules).values()):
        rows = block == k
        assert rows.any()
        mean, var = module.predict_y(X[rows])
        np.testing.assert_allclose(predicted["mean"][rows], mean.numpy(), rtol=1e-12)
        np.testing.assert_allclose(predicted["var"][rows], var.numpy(), rtol=1e-12)


def test_label_partition_routes_by_the_partition_column(capsys, folder, regression_csv):
    out = folder / "by_group"
    run_ok(capsys, "fit-local", regression_csv, "--target", "y", "--partition-by", "group",
           *FAST, "--out", out)
    modules = load_modules(out)
    assert len(modules) == 3
    first = next(iter(modules.values()))
    assert first.columns.features == ("x1", "x2") and first.info["partition_column"] == "group"
    predictions = folder / "by_group.csv"
    run_ok(capsys, "predict", out, "--data", regression_csv, "--out", predictions)
    data = load_table(regression_csv)
    mean = load_table(predictions).column("mean")
    for value, module in zip([0.0, 1.0, 2.0], modules.values(), strict=True):
        rows = data.column("group") == value
        expected = module.predict_y(data.select(["x1", "x2"])[rows])[0].numpy()
        np.testing.assert_allclose(mean[rows], expected, rtol=1e-12)


def test_without_inducing_each_partition_takes_half_its_rows(capsys, folder, regression_csv):
    """``--inducing`` is optional: every partition's M is half its size, rounded up (all
    partitions are below 200 points here)."""
    out = folder / "default_inducing"
    run_ok(capsys, "fit-local", regression_csv, "--target", "y", "--partition-by", "group",
           "--steps", "5", "--out", out)
    data = load_table(regression_csv)
    sizes = [int((data.column("group") == value).sum()) for value in (0.0, 1.0, 2.0)]
    assert [m.num_inducing for m in load_modules(out).values()] == [(n + 1) // 2 for n in sizes]


def test_without_partitions_there_is_one_partition_per_default_rows(capsys, monkeypatch, folder,
                                                                    regression_csv):
    """``--partitions`` is optional: ⌈N / DEFAULT_PARTITION_ROWS⌉ k-means partitions (the
    constant set to 25 here: 60 rows make 3)."""
    import pyrogp_models.inference.commands.fit_local as command

    monkeypatch.setattr(command, "DEFAULT_PARTITION_ROWS", 25)
    out = folder / "default_partitions"
    run_ok(capsys, "fit-local", regression_csv, "--target", "y", "--features", "x1,x2",
           *FAST, "--out", out)
    assert len(load_modules(out)) == 3


def test_a_text_column_is_no_default_feature(capsys, tmp_path):
    """A date column beside the numbers: without --features the inputs are the numeric columns
    (the module records them), and a table of nothing but text besides the target is refused
    in one line naming the text columns."""
    rows = ["when,x,y"] + [f"2020-{i % 12 + 1:02d},{i / 30:.17g},{math.sin(i / 5):.17g}"
                           for i in range(30)]
    (tmp_path / "dated.csv").write_text("\n".join(rows) + "\n")
    run_ok(capsys, "fit-local", tmp_path / "dated.csv", "--target", "y", *FAST, "--out",
           tmp_path / "dated")
    assert [list(m.columns.features) for m in load_modules(tmp_path / "dated").values()] == [["x"]]
    (tmp_path / "words.csv").write_text("when,y\n2020-01,1\n2020-02,2\n2020-03,3\n")
    error = run_failing(capsys, "fit-local", tmp_path / "words.csv", "--target", "y", "--out",
                        tmp_path / "words")
    assert "no feature columns left besides the target but text columns (when)" in error


def test_binary_classifier_outputs_probabilities(capsys, folder, label_csv):
    out = folder / "classifier"
    run_ok(capsys, "fit-local", label_csv, "--target", "label", "--partitions", "2",
           "--likelihood", "bernoulli", "--link", "probit", *FAST, "--out", out)
    assert "bernoulli(link=probit)" in run_ok(capsys, "info", out / "part000.safetensors")
    predictions = folder / "classifier.npz"
    run_ok(capsys, "predict", out, "--data", label_csv, "--out", predictions)
    with np.load(predictions) as arrays:
        assert sorted(arrays.files) == ["prob", "x"]
        assert ((arrays["prob"] >= 0) & (arrays["prob"] <= 1)).all()
    report = json.loads(run_ok(capsys, "evaluate", out, "--data", label_csv, "--json"))
    assert {"nlpd", "accuracy", "n"} <= set(report) and report["n"] == 40


def test_refitting_replaces_an_existing_module_folder(capsys, folder, regression_csv):
    out = folder / "refit"
    run_ok(capsys, "fit-local", regression_csv, "--target", "y", "--partitions", "3", *FAST,
           "--out", out)
    (out / "notes.txt").write_text("keep me")
    run_ok(capsys, "fit-local", regression_csv, "--target", "y", "--partitions", "2", *FAST,
           "--out", out)
    assert sorted(path.name for path in out.iterdir()) == [
        INDEX_NAME, "notes.txt", "part000.safetensors", "part001.safetensors"]
    assert read_index(out)["partition"]["num_partitions"] == 2


def test_random_partitions_must_be_combined(capsys, tmp_path, regression_csv):
    out = tmp_path / "random"
    run_ok(capsys, "fit-local", regression_csv, "--target", "y", "--partitions", "2",
           "--partition-by", "random", *FAST, "--out", out)
    message = run_failing(capsys, "predict", out, "--data", regression_csv,
                          "--out", tmp_path / "p.csv")
    assert "random partition" in message and "--rule" in message
    assert not (tmp_path / "p.csv").exists()


def fit_args(data, *extra):
    return ["fit-local", data, "--target", "y", "--partitions", "2", *FAST, *extra]


@pytest.mark.parametrize("change, extra, expected", [
    ("missing file", [], "data file not found"),
    ("unknown column", ["--features", "x1,nope"], "unknown column 'nope'"),
    ("unknown partition column", ["--partition-by", "nope"], "nor a column of the data"),
    ("nan", [], "column 'x2' contains NaN or inf"),
    ("bad labels", ["--likelihood", "bernoulli"], "labels must be 0 or 1"),
    ("tied values", ["--partition-by", "contiguous", "--dim", "2"], "non-empty contiguous"),
    ("duplicate points", ["--features", "group"], "cannot form 2 k-means partitions"),
    ("too few points", ["--inducing", "40"], "fewer than its 40 inducing inputs"),
    ("no start", ["--restarts", "0"], "restarts must be at least 1"),
    ("too many partitions", ["--partitions", "61"], "cannot split 60 points into 61"),
])
def test_bad_fit_input_fails_in_one_line_and_writes_nothing(capsys, tmp_path, regression_csv,
                                                            change, extra, expected):
    data = load_table(regression_csv)
    values = data.values.copy()
    if change == "nan":
        values[5, 1] = np.nan
    if change == "tied values":
        values[:, 2] = 0.0
    if change == "duplicate points":
        values[:, 2] = 1.0
    columns = dict(zip(data.columns, values.T, strict=True))
    path = write_csv(tmp_path / "data.csv", columns)
    if change == "missing file":
        path = tmp_path / "missing.csv"
    out = tmp_path / "out"
    message = run_failing(capsys, *fit_args(path, *extra, "--out", out))
    assert expected in message
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["data.csv"]


def test_an_existing_folder_that_is_not_a_module_folder_is_not_clobbered(capsys, tmp_path,
                                                                        regression_csv):
    out = tmp_path / "precious"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    message = run_failing(capsys, *fit_args(regression_csv, "--out", out))
    assert "not a module folder" in message
    assert [p.name for p in out.iterdir()] == ["thesis.tex"]


@pytest.mark.parametrize("damage, expected", [
    ("flip", "checksum mismatch"),
    ("truncate", "not a readable module file"),
])
def test_damaged_module_files_are_refused(capsys, tmp_path, regression_csv, contiguous_modules,
                                          damage, expected):
    module_file = tmp_path / "part001.safetensors"
    content = bytearray((contiguous_modules / "part001.safetensors").read_bytes())
    if damage == "flip":
        content[-3] ^= 0x01
    else:
        del content[len(content) // 2:]
    module_file.write_bytes(bytes(content))
    out = tmp_path / "predictions.csv"
    message = run_failing(capsys, "predict", module_file, "--data", regression_csv, "--out", out)
    assert expected in message and "part001.safetensors" in message
    assert not out.exists()


@pytest.mark.parametrize("argv, expected", [
    (["--out", "{tmp}/p.txt"], "unknown output extension '.txt'"),
    (["--out", "{tmp}/missing/p.csv"], "does not exist"),
    (["--out", "{tmp}/p.csv", "--weights", "uniform"], "only apply together with --rule"),
])
def test_bad_predict_arguments_write_nothing(capsys, tmp_path, regression_csv,
                                             contiguous_modules, argv, expected):
    argv = [arg.format(tmp=tmp_path) for arg in argv]
    message = run_failing(capsys, "predict", contiguous_modules, "--data", regression_csv, *argv)
    assert expected in message
    assert list(tmp_path.iterdir()) == []


def test_evaluate_needs_the_target_column(capsys, tmp_path, contiguous_modules):
    data = write_csv(tmp_path / "unlabelled.csv", {"x1": np.arange(4.0), "x2": np.zeros(4)})
    assert "unknown column 'y'" in run_failing(capsys, "evaluate", contiguous_modules,
                                               "--data", data)


def test_rule_is_passed_to_the_expert_combination(capsys, monkeypatch, folder, regression_csv,
                                                  contiguous_modules):
    received = {}

    class FakeCombination:
        is_classifier = False
        columns = Columns(["x1", "x2"], "y")
        input_dim = 2

        def __init__(self, modules, rule, weights=None, temperature=None):
            received.update(count=len(modules), rule=rule, weights=weights,
                            temperature=temperature)

        def predict_y(self, X, labels=None):
            return torch.zeros(len(X)), torch.ones(len(X))

    fake = types.ModuleType("pyrogp_models.models.experts.predictor")
    fake.ExpertCombination = FakeCombination
    monkeypatch.setitem(sys.modules, "pyrogp_models.models.experts.predictor", fake)
    run_ok(capsys, "predict", contiguous_modules, "--data", regression_csv, "--out",
           folder / "experts.csv", "--rule", "gpoe", "--weights", "entropy",
           "--temperature", "2")
    assert received == {"count": 3, "rule": "gpoe", "weights": "entropy", "temperature": 2.0}

    monkeypatch.setitem(sys.modules, "pyrogp_models.models.experts.predictor", None)
    message = run_failing(capsys, "predict", contiguous_modules, "--data", regression_csv,
                          "--out", folder / "never.csv", "--rule", "gpoe")
    assert "pyrogp_models.models.experts.predictor" in message
    assert not (folder / "never.csv").exists()


@pytest.fixture
def restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def threads_seen(monkeypatch) -> list[int]:
    """The thread count ``pyrogp info`` runs with, recorded at each call."""
    import pyrogp_models.inference.commands.info as info_command

    seen = []
    real_run = info_command.run

    def recording_run(args):
        seen.append(torch.get_num_threads())
        return real_run(args)

    monkeypatch.setattr(info_command, "run", recording_run)
    return seen


@pytest.mark.parametrize("place", ["before", "after"])
def test_threads_is_applied_before_the_command_runs(capsys, contiguous_modules, restore_threads,
                                                    threads_seen, place):
    wanted = 3 if torch.get_num_threads() != 3 else 2
    argv = (["--threads", wanted, "info", contiguous_modules] if place == "before"
            else ["info", contiguous_modules, "--threads", wanted])
    assert "part002" in run_ok(capsys, *argv)
    assert threads_seen == [wanted] and torch.get_num_threads() == wanted


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5"])
def test_threads_must_be_a_positive_whole_number(capsys, contiguous_modules, restore_threads,
                                                 value):
    threads = torch.get_num_threads()
    capsys.readouterr()
    assert main(["--threads", value, "info", str(contiguous_modules)]) == 2
    assert "--threads: expected a positive whole number" in capsys.readouterr().err
    assert torch.get_num_threads() == threads


def test_debug_shows_the_exception(tmp_path):
    with pytest.raises(DataError, match="data file not found"):
        main(["--debug", *fit_args(str(tmp_path / "missing.csv"), "--out", str(tmp_path / "o"))])


def test_the_installed_command_exits_with_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "pyrogp_models.inference.cli", "evaluate",
         str(tmp_path / "no_modules"), "--data", str(tmp_path / "data.csv")],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and "no such module file" in result.stderr


@pytest.mark.parametrize("environment", [None, "2"])
def test_one_thread_unless_asked(capsys, monkeypatch, contiguous_modules, restore_threads,
                                 threads_seen, environment):
    """Without --threads the command runs on one thread; OMP_NUM_THREADS leaves torch's choice."""
    if environment is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", environment)
    torch.set_num_threads(2)
    assert "part002" in run_ok(capsys, "info", contiguous_modules)
    assert threads_seen == [1 if environment is None else 2]
    assert "--threads N" in run_ok(capsys, "--help")
