"""Every one-line error of ``pyrogp_models.inference.commands``: its message, exit code 2 and
nothing written.

Each case runs one command that must fail at one raising site; the folder it could write into is
compared before and after. (Errors covered with their messages elsewhere: test_cli.py,
test_recycle_cli.py, test_distkernel_cli.py, test_experts_cli.py, test_executors.py,
test_module_sets.py.)"""

from dataclasses import replace

import numpy as np
import pytest
from pyrogp_models.inference.cli import main

from helpers import run_failing, write_csv
from pyrogp_models.data.columns import Columns
from pyrogp_models.modules.files import load_modules, read_index, save_modules


def snapshot(folder):
    return sorted((str(path.relative_to(folder)), path.stat().st_size)
                  for path in folder.rglob("*"))


@pytest.fixture(scope="module")
def files(folder):
    rng = np.random.default_rng(0)
    x = np.sort(rng.uniform(0.0, 10.0, 40))
    group = np.repeat([0.0, 1.0, 2.0], [14, 13, 13])
    paths = {
        "data": write_csv(folder / "data.csv", {"x": x, "group": group,
                                                "y": np.sin(x) + 0.1 * rng.normal(size=40),
                                                "count": rng.poisson(3.0, 40).astype(float)}),
        "two_inputs": write_csv(folder / "two.csv", {"a": x, "b": x}),
        "mean_named": write_csv(folder / "mean.csv", {"mean": x}),
        "modules": folder / "modules",
        "experts": folder / "experts",
        "bare": folder / "bare",
        "dk": folder / "dk.safetensors",
    }
    assert main(["fit-local", str(paths["data"]), "--target", "y", "--features", "x",
                 "--partitions", "2", "--partition-by", "contiguous", "--inducing", "4",
                 "--out", str(paths["modules"])]) == 0
    assert main(["fit-experts", str(paths["data"]), "--target", "y", "--features", "x",
                 "--experts", "2", "--steps", "0", "--out", str(paths["experts"])]) == 0
    assert main(["fit-distkernel", str(paths["data"]), "--target", "y", "--features", "x",
                 "--regions", "2", "--inducing-per-region", "3", "--steps", "2",
                 "--out", str(paths["dk"])]) == 0
    # modules that record neither their feature nor their target columns
    bare = {name: replace(module, columns=Columns()) for name, module in
            load_modules(paths["modules"]).items()}
    save_modules(bare, paths["bare"], read_index(paths["modules"])["partition"])
    (folder / "a_folder").mkdir()
    (folder / "a_folder.csv").mkdir()
    (folder / "meta.safetensors").mkdir()
    return paths


FIT_LOCAL = ["fit-local", "{data}", "--target", "y", "--features", "x", "--inducing", "3",
             "--partitions", "2", "--out", "{out}/fit"]
FIT_EXPERTS = ["fit-experts", "{data}", "--target", "y", "--features", "x", "--experts", "2",
               "--out", "{out}/experts_out"]
FIT_DK = ["fit-distkernel", "{data}", "--target", "y", "--features", "x", "--regions", "2",
          "--inducing-per-region", "3", "--out", "{out}/dk_out.safetensors"]


def without(argv, flag, values=1):
    index = argv.index(flag)
    return argv[:index] + argv[index + 1 + values:]


CASES = {
    # fit-local
    "fit-local --inducing 0": (
        [*FIT_LOCAL, "--inducing", "0"], "--inducing must be at least 1, got 0"),
    "fit-local --natural-gradient out of range": (
        [*FIT_LOCAL, "--natural-gradient", "1.5"], "--natural-gradient must be in [0, 1], got 1.5"),
    "fit-local --natural-gradient with --collapsed": (
        [*FIT_LOCAL, "--natural-gradient", "0.5", "--collapsed"],
        "with --collapsed q(u) is optimal already: give one of the two"),
    "fit-local --collapsed with poisson": (
        [*without(FIT_LOCAL, "--target"), "--target", "count", "--likelihood", "poisson",
         "--collapsed"], "--collapsed needs the gaussian likelihood, not poisson"),
    "fit-local --lr with the collapsed bound": (
        [*FIT_LOCAL, "--lr", "0.1"],
        "--lr sets Adam's learning rate of the uncollapsed bound; the collapsed bound is fitted "
        "by L-BFGS"),
    "fit-local empty feature name": (
        [*without(FIT_LOCAL, "--features"), "--features", "x,"],
        "--features has an empty column name: 'x,'"),
    "fit-local label column and --partitions disagree": (
        [*without(FIT_LOCAL, "--partitions"), "--partitions", "5", "--partition-by", "group"],
        "column 'group' has 3 distinct values but --partitions is 5"),
    "fit-local --link with gaussian": (
        [*FIT_LOCAL, "--link", "probit"],
        "--link applies to bernoulli and categorical likelihoods, not gaussian"),
    "fit-local --classes with gaussian": (
        [*FIT_LOCAL, "--classes", "3"], "--classes applies to the categorical likelihood only"),
    # fit-experts
    "fit-experts --steps -1": (
        [*FIT_EXPERTS, "--steps", "-1"], "--steps must be at least 0, got -1"),
    "fit-experts --experts 0": (
        [*without(FIT_EXPERTS, "--experts"), "--experts", "0"],
        "--experts must be at least 1, got 0"),
    "fit-experts --points-per-expert 0": (
        [*without(FIT_EXPERTS, "--experts"), "--points-per-expert", "0"],
        "--points-per-expert must be at least 1, got 0"),
    "fit-experts into a folder that is not a module folder": (
        [*without(FIT_EXPERTS, "--out"), "--out", "{out}/a_folder_with_a_file"],
        "exists and is not a module folder; refusing to overwrite it"),
    # fit-distkernel
    "fit-distkernel --steps 0": ([*FIT_DK, "--steps", "0"], "--steps must be positive, got 0"),
    "fit-distkernel --lr 0": ([*FIT_DK, "--lr", "0"], "--lr must be positive, got 0.0"),
    "fit-distkernel --time-budget 0": (
        [*FIT_DK, "--time-budget", "0"], "--time-budget must be positive, got 0.0"),
    "fit-distkernel --out a folder": (
        [*without(FIT_DK, "--out"), "--out", "{out}/a_folder"],
        "a_folder is a folder; --out needs a file name"),
    # predict
    "predict --out a folder": (
        ["predict", "{modules}", "--data", "{data}", "--out", "{out}/a_folder.csv"],
        "a_folder.csv is a folder; --out needs a file name"),
    "predict feature named like an output column": (
        ["predict", "{bare}", "--data", "{mean_named}", "--out", "{out}/p.csv"],
        "feature column(s) mean clash with output column names"),
    "predict modules without feature names, data with two inputs": (
        ["predict", "{bare}", "--data", "{two_inputs}", "--out", "{out}/p.csv"],
        "the model takes 1 inputs but 2 feature columns were found: a, b"),
    # evaluate
    "evaluate modules without a target name": (
        ["evaluate", "{bare}", "--data", "{data}"],
        "the model does not record its target column; pass --target"),
    # combine
    "combine a module file": (
        ["combine", "{modules}/part000.safetensors", "--rule", "poe", "--data", "{data}",
         "--out", "{out}/c.csv"],
        "part000.safetensors is not a module folder; combine needs a folder of modules (use "
        "pyrogp predict for a single module file)"),
    "combine --rule grbcm with one expert": (
        ["combine", "{single}", "--rule", "grbcm", "--data", "{data}", "--out", "{out}/c.csv"],
        "grbcm needs a communication expert and at least one more"),
    # recycle
    "recycle --target without --data": (
        ["recycle", "{modules}", "--inducing", "4", "--target", "y", "--out", "{out}/meta"],
        "--target applies to the raw data of --data"),
    "recycle --lr with the collapsed bound": (
        ["recycle", "{modules}", "--inducing", "4", "--lr", "0.1", "--out", "{out}/meta_lr"],
        "--lr sets Adam's learning rate of the uncollapsed bound; the collapsed bound is fitted "
        "by L-BFGS"),
    "recycle --out a folder": (
        ["recycle", "{modules}", "--inducing", "4", "--out", "{out}/meta"],
        "meta.safetensors is a folder; --out needs a file name"),
    "recycle raw data for modules without a target name": (
        ["recycle", "{bare}", "--inducing", "4", "--data", "{data}", "--out", "{out}/meta2"],
        "the modules do not record their target column; pass --target"),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_each_error_is_one_line_exit_2_and_writes_nothing(capsys, folder, files, case):
    argv, expected = CASES[case]
    (folder / "a_folder_with_a_file").mkdir(exist_ok=True)
    (folder / "a_folder_with_a_file" / "notes.txt").write_text("mine")
    if "{single}" in " ".join(argv) and not (folder / "single").exists():
        single = dict(list(load_modules(files["experts"]).items())[:1])
        save_modules(single, folder / "single")
    names = {key: str(path) for key, path in files.items()}
    argv = [arg.format(out=folder, single=folder / "single", **names) for arg in argv]
    before = snapshot(folder)
    message = run_failing(capsys, *argv)
    assert expected in message
    assert snapshot(folder) == before


@pytest.mark.parametrize("argv, expected", [
    (["fit-local", "d.csv", "--target", "y", "--out", "m", "--likelihood", "nope"],
     "argument --likelihood: invalid choice: 'nope'"),
    (["fit-local", "d.csv", "--target", "y", "--out", "m", "--bogus"],
     "unrecognized arguments: --bogus"),
    (["fit-multitask", "d.csv"], "the following arguments are required: --target, --out"),
    (["nope"], "argument COMMAND: invalid choice: 'nope'"),
], ids=["invalid choice", "unknown option", "missing argument", "unknown command"])
def test_an_error_in_the_arguments_is_one_line_too(capsys, argv, expected):
    message = run_failing(capsys, *argv)
    assert expected in message and "--help)" in message
