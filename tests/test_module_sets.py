"""Sets of modules as users hand them over: folders with and without an index, paths typed
without ``.safetensors``, folders from several sites with the same module names, a protected
index, and what the command line says about a set (summaries, flags, unconverged fits)."""

import json
import os
from dataclasses import replace

import numpy as np
import pytest
import torch
from pyrogp_models.inference.cli import main
from pyrogp_models.inference.local_fit import LocalFitSpec, fit_local
from pyrogp_models.inference.trainer import TrainConfig, train

from helpers import run_failing, run_ok, write_csv
from pyrogp_models.data.columns import Columns
from pyrogp_models.data.partitioners import partition_contiguous
from pyrogp_models.errors import ModuleFileError, NotConvergedWarning
from pyrogp_models.models.local.local_gps import LocalGPs
from pyrogp_models.modules.files import (
    INDEX_NAME,
    _index_digest,
    load_modules,
    save_module,
    save_modules,
)
from pyrogp_models.modules.health import module_flags


@pytest.fixture(scope="module")
def site_data():
    rng = np.random.default_rng(0)
    x = np.sort(rng.uniform(0, 10, 300))
    y = np.sin(x) + 0.1 * rng.standard_normal(300)
    return x, y


@pytest.fixture(scope="module")
def sites(folder, site_data):
    """Two sites that fitted their own halves with the same module names."""
    x, y = site_data
    paths = []
    for name, rows in (("siteA", x < 5), ("siteB", x >= 5)):
        fit = fit_local((x[rows, None], y[rows], partition_contiguous(x[rows, None], 3)),
                        LocalFitSpec(num_inducing=6, columns=Columns(["x"], "y")))
        paths.append(save_modules(fit.modules, folder / name,
                                  partition_contiguous(x[rows, None], 3)))
    return paths


def test_two_folders_with_the_same_module_names_recycle_together(capsys, folder, sites):
    out = run_ok(capsys, "recycle", *sites, "--inducing", 20, "--out", folder / "both")
    assert "6 modules" in out
    meta = load_modules(folder / "both.safetensors")["both"]
    assert sorted(meta.info["modules"]) == sorted(
        f"{site}/part00{k}" for site in sites for k in range(3))


def test_a_module_file_given_twice_is_refused(capsys, folder, sites):
    message = run_failing(capsys, "recycle", sites[0], sites[0] / "part001",
                          "--inducing", 5, "--out", folder / "twice")
    assert "part001.safetensors is given twice" in message
    assert not (folder / "twice.safetensors").exists()


def test_paths_without_the_suffix_are_read_as_written(capsys, folder, sites, site_data):
    x, y = site_data
    data = write_csv(folder / "all.csv", {"x": x, "y": y})
    run_ok(capsys, "recycle", sites[0], "--inducing", 10, "--out", folder / "meta")
    assert (folder / "meta.safetensors").is_file()
    out = run_ok(capsys, "info", folder / "meta")
    assert "meta" in out
    assert "rmse" in run_ok(capsys, "evaluate", folder / "meta", "--data", data)
    run_ok(capsys, "predict", folder / "meta", "--data", data, "--out", folder / "pred.csv")
    run_ok(capsys, "recycle", folder / "meta", "--inducing", 8, "--out", folder / "again")
    assert "no such module file or folder" in run_failing(
        capsys, "info", folder / "absent")


def test_a_folder_without_an_index_is_a_set_of_modules(capsys, folder, sites, site_data):
    collected = folder / "collected"
    collected.mkdir()
    for site in sites:
        for file in site.glob("part00[01].safetensors"):
            (collected / f"{site.name}_{file.name}").write_bytes(file.read_bytes())
    assert sorted(load_modules(collected)) == ["siteA_part000", "siteA_part001",
                                               "siteB_part000", "siteB_part001"]
    run_ok(capsys, "recycle", collected, "--inducing", 10, "--out", folder / "from_collected")
    x, y = site_data
    data = write_csv(folder / "eval.csv", {"x": x, "y": y})
    assert "rmse" in run_ok(capsys, "evaluate", collected, "--data", data, "--rule", "rbcm")
    # routing needs the index's partition rule
    message = run_failing(capsys, "evaluate", collected, "--data", data)
    assert "cannot route" in message and "--rule" in message


def index_of(path):
    return json.loads((path / INDEX_NAME).read_text())


@pytest.mark.parametrize("edit, fragment", [
    (lambda index: index["modules"].update(part000="part001.safetensors"), "checksum mismatch"),
    (lambda index: index["partition"].update(num_partitions=2), "checksum mismatch"),
])
def test_a_tampered_index_is_refused_in_one_line(capsys, folder, sites, edit, fragment):
    copy = folder / "tampered"
    copy.mkdir(exist_ok=True)
    for file in sites[0].iterdir():
        (copy / file.name).write_bytes(file.read_bytes())
    index = index_of(copy)
    edit(index)
    (copy / INDEX_NAME).write_text(json.dumps(index))
    with pytest.raises(ModuleFileError, match=f"{INDEX_NAME}: {fragment}"):
        load_modules(copy)
    assert fragment in run_failing(capsys, "info", copy)


@pytest.mark.parametrize("file", ["../outside.safetensors", "/etc/passwd", "a/b.safetensors",
                                  "..", "linked.safetensors"])
def test_the_index_names_only_plain_files_inside_its_folder(folder, sites, file, tmp_path):
    copy = tmp_path / "modules"
    copy.mkdir()
    for path in sites[0].iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    (tmp_path / "outside.safetensors").write_bytes((copy / "part000.safetensors").read_bytes())
    os.symlink(tmp_path / "outside.safetensors", copy / "linked.safetensors")
    index = index_of(copy)
    index["modules"]["part000"] = file
    record = {key: value for key, value in index.items() if key != "sha256"}
    index["sha256"] = _index_digest(record)  # a valid digest: only the file name is bad
    (copy / INDEX_NAME).write_text(json.dumps(index))
    with pytest.raises(ModuleFileError, match="not a plain file name inside the folder"):
        load_modules(copy)


def test_loading_modules_and_folders_never_unpickles(monkeypatch, sites, tmp_path):
    import pickle

    def refuse(*args, **kwargs):
        raise AssertionError("unpickling was attempted")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    modules = load_modules(sites[0])
    save_module(next(iter(modules.values())), tmp_path / "one")
    load_modules(tmp_path)


# What the command line says ------------------------------------------------------------------
def test_large_fits_print_a_summary_and_verbose_lists_every_module(capsys, folder, site_data):
    x, y = site_data
    data = write_csv(folder / "many.csv", {"x": x, "y": y})
    out = run_ok(capsys, "fit-local", data, "--target", "y", "--partitions", 25,
                 "--partition-by", "contiguous", "--inducing", 3, "--out", folder / "many")
    assert "25 modules; ELBO per point: min" in out and "lowest ELBO per point" in out
    assert "part024 " not in out.split("lowest")[0]  # no row per module
    verbose = run_ok(capsys, "info", folder / "many", "--verbose")
    assert all(f"part0{k:02d}" in verbose for k in range(25))


def test_an_unconverged_fit_says_so_in_one_line(capsys, folder, site_data):
    x, y = site_data
    data = write_csv(folder / "short.csv", {"x": x, "y": y})
    capsys.readouterr()
    assert main(["fit-local", str(data), "--target", "y", "--partitions", "3", "--partition-by",
                 "contiguous", "--inducing", "6", "--steps", "3", "--out",
                 str(folder / "short")]) == 0
    warning = [line for line in capsys.readouterr().err.splitlines()
               if line.startswith("pyrogp: warning:")]
    assert len(warning) == 1 and "step limit (3 steps)" in warning[0]
    assert warning[0].endswith("raise --steps")
    info = run_ok(capsys, "info", folder / "short")
    assert info.count("not converged") >= 3


def test_an_outlier_among_siblings_is_flagged(sites):
    modules = {f"{site.name}/{name}": module for site in sites
               for name, module in load_modules(site).items()}
    assert module_flags(modules) == {}
    name = next(iter(modules))
    spoiled = dict(modules)
    spoiled[name] = replace(modules[name], elbo=modules[name].elbo - 50 * modules[name].num_data)
    assert module_flags(spoiled) == {name: ["outlier"]}


def test_the_trainer_warns_when_it_stops_unconverged():
    rng = np.random.default_rng(1)
    x = rng.uniform(0, 1, (60, 1))
    model = LocalGPs(torch.as_tensor(x), torch.as_tensor(np.sin(6 * x[:, 0])),
                     partition_contiguous(x, 2), 4, collapsed=True)
    with pytest.warns(NotConvergedWarning, match="2 of 2 independent members") as caught:
        train(model, config=TrainConfig(optimizer="lbfgs", lr=1.0, steps=4, window=2))
    assert caught[0].message.steps == 4 and caught[0].message.members == 2
