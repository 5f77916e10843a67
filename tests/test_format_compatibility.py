"""Files written by version 0.1.0 (before the format registry and the typed data columns) still
load, describe and predict as they did.

``tests/data/written_by_0.1.0/`` holds what that version's ``pyrogp`` wrote from ``data.csv``: a
module folder (fit-local), a meta-GP (recycle), a distributed-kernel and a multitask file, and
what its ``info`` and ``predict`` printed and wrote for each. Those outputs were computed by the
old code, so they pin the new reader to the old one: same text, same predictions. The module
tables' kernel and likelihood columns are the deliberate changes since: the kernel tree with its
values in data units (format 3) where 0.1.0 printed the first lengthscale and the variance
standardised, and the Gaussian noise variance in data units too (0.1.0's times s_y²: 0.441 ×
0.6186² = 0.169 for part000).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from helpers import run_ok
from pyrogp_models import io
from pyrogp_models.data import load_table
from pyrogp_models.data.columns import Columns
from pyrogp_models.io import ModuleSet

OLD = Path(__file__).parent / "data" / "written_by_0.1.0"
FILES = {"modules": "modules", "meta": "meta.safetensors",
         "distkernel": "distkernel.safetensors", "multitask": "multitask.safetensors"}


@pytest.mark.parametrize("name", FILES)
def test_info_prints_what_the_old_version_printed(capsys, name):
    assert run_ok(capsys, "info", OLD / FILES[name]) == (OLD / f"info_{name}.txt").read_text()


@pytest.mark.parametrize("name", FILES)
def test_predictions_equal_the_old_versions(capsys, tmp_path, name):
    out = tmp_path / "predictions.csv"
    run_ok(capsys, "predict", OLD / FILES[name], "--data", OLD / "data.csv", "--out", out)
    new, old = load_table(out), load_table(OLD / f"pred_{name}.csv")
    assert new.columns == old.columns
    for column in old.columns:
        np.testing.assert_allclose(new.column(column), old.column(column), rtol=1e-9, atol=1e-12)


def test_old_feature_and_target_names_become_typed_columns():
    modules = io.load(OLD / "modules")
    assert isinstance(modules, ModuleSet)
    for module in modules.modules.values():
        assert module.columns == Columns(["x", "x2"], "y")
        assert "features" not in module.info and "target" not in module.info
    assert io.load_predictor(OLD / "distkernel.safetensors").columns == Columns(["x", "x2"], "y")


def test_a_resaved_old_module_keeps_its_columns(tmp_path):
    """Written again by this version, an old module stores its columns in the typed field."""
    old = io.load(OLD / "meta.safetensors")
    path = io.save(old, tmp_path / "meta.safetensors", "pyrogp-module")
    again = io.load(path).first
    assert again.columns == old.first.columns == Columns(["x", "x2"], "y")
