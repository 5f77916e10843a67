"""The command line's defaults on real data it was not tuned on: the Mauna Loa CO2 series
(statsmodels), twelve contiguous blocks of time, every fifth week held out.

The baseline is linear interpolation between the neighbouring training weeks, computed here. The
defaults must come within 10 % of it; the uncollapsed bound with unit natural-gradient steps must
come within 15 % of the collapsed fit and leave no block in a worse optimum (a stale q(u) after
the last Adam step once left one block at ELBO −878 while its neighbours were near +300).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers import run_ok, write_csv
from pyrogp_models.modules.files import load_modules
from pyrogp_models.modules.health import module_flags

statsmodels = pytest.importorskip("statsmodels.api")

FIT = ("--target", "co2", "--partition-by", "contiguous", "--partitions", "12", "--inducing", "40")


@pytest.fixture(scope="module")
def co2(tmp_path_factory):
    """Training and held-out CSV files and the held-out RMSE of linear interpolation."""
    data = statsmodels.datasets.co2.load_pandas().data.dropna()
    year = np.asarray(data.index.year + (data.index.dayofyear - 0.5) / 365.25, dtype=float)
    co2 = data["co2"].to_numpy(dtype=float)
    held_out = np.arange(len(co2)) % 5 == 4
    folder = tmp_path_factory.mktemp("co2")
    train = write_csv(folder / "train.csv", {"year": year[~held_out], "co2": co2[~held_out]})
    test = write_csv(folder / "test.csv", {"year": year[held_out], "co2": co2[held_out]})
    interpolated = np.interp(year[held_out], year[~held_out], co2[~held_out])
    return train, test, float(np.sqrt(np.mean((interpolated - co2[held_out]) ** 2)))


def held_out_rmse(capsys, folder, test) -> float:
    return json.loads(run_ok(capsys, "evaluate", folder, "--data", test, "--target", "co2",
                             "--json").strip().splitlines()[-1])["rmse"]


def test_the_defaults_come_within_ten_percent_of_linear_interpolation(co2, tmp_path, capsys):
    train, test, interpolation = co2
    out = run_ok(capsys, "fit-local", train, *FIT, "--out", tmp_path / "m")
    assert "collapsed bound" in out and "not converged" not in out
    assert held_out_rmse(capsys, tmp_path / "m", test) <= 1.1 * interpolation


@pytest.mark.filterwarnings("ignore::pyrogp_models.errors.NotConvergedWarning")
def test_unit_natural_gradient_steps_reach_the_collapsed_fit(co2, tmp_path, capsys):
    train, test, _ = co2
    run_ok(capsys, "fit-local", train, *FIT, "--out", tmp_path / "collapsed")
    run_ok(capsys, "fit-local", train, *FIT, "--natural-gradient", "1",
           "--out", tmp_path / "natural")
    collapsed = held_out_rmse(capsys, tmp_path / "collapsed", test)
    natural = held_out_rmse(capsys, tmp_path / "natural", test)
    assert natural <= 1.15 * collapsed
    # no block far below its collapsed optimum (the collapsed bound is the uncollapsed ELBO's
    # maximum over q(u); Adam's hyperparameters may trail it by a little)
    best, modules = load_modules(tmp_path / "collapsed"), load_modules(tmp_path / "natural")
    for name, module in modules.items():
        assert module.elbo >= best[name].elbo - 0.05 * abs(best[name].elbo), name
    assert not any("outlier" in flags for flags in module_flags(modules).values())
