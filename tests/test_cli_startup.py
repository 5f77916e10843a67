"""The command line starts without the heavy libraries and its flags are consistent.

``pyrogp --help``, ``--version`` and every ``COMMAND --help`` build the parser only: they must not
import torch, Pyro or ArviZ (how fast they answer is measured by
``benchmarks/cli_startup.py``, not here). Every fit takes ``--float32``, every ``--seed`` says
what it seeds, and ``--out`` is checked before anything is fitted.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest
from pyrogp_models.inference.cli import COMMANDS, build_parser

from helpers import run_failing, write_csv
from pyrogp_models import __version__

HEAVY = ("torch", "pyro", "arviz", "numpy")
FITS = ("fit-local", "recycle", "fit-distkernel", "fit-experts", "fit-multitask")


def subcommands() -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return action.choices


def imported_after(argv: list[str]) -> tuple[int, list[str], str]:
    """Run ``pyrogp argv`` in a fresh interpreter: exit code, the heavy modules it imported,
    and what it printed."""
    code = ("import json, sys\n"
            "from pyrogp_models.inference.cli import main\n"
            f"code = main({argv!r})\n"
            f"print(json.dumps([code, [m for m in {HEAVY!r} if m in sys.modules]]))")
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               check=True)
    *printed, last = completed.stdout.strip().splitlines()
    exit_code, heavy = json.loads(last)
    return exit_code, heavy, "\n".join(printed)


@pytest.mark.parametrize("argv", [["--help"], ["--version"]]
                         + [[name, "--help"] for name in subcommands()],
                         ids=lambda argv: " ".join(argv))
def test_help_and_version_import_no_heavy_library(argv):
    exit_code, heavy, printed = imported_after(argv)
    assert exit_code == 0 and heavy == []
    assert printed


def test_a_command_that_runs_imports_them(tmp_path):
    """The check above can fail: running a command does import torch."""
    exit_code, heavy, _ = imported_after(["info", str(tmp_path / "absent")])
    assert exit_code == 2 and "torch" in heavy


def test_version_is_the_packages(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--version"])
    assert capsys.readouterr().out.strip() == f"pyrogp {__version__}"


def test_every_command_module_is_listed_once():
    assert len(COMMANDS) == len(set(COMMANDS)) == len(subcommands())


@pytest.mark.parametrize("name", FITS)
def test_every_fit_takes_float32_and_a_described_seed(name):
    options = {option: action for action in subcommands()[name]._actions
               for option in action.option_strings}
    assert "--float32" in options
    assert options["--seed"].help and "seed of" in options["--seed"].help


def test_every_seed_is_described():
    for name, parser in subcommands().items():
        for action in parser._actions:
            if "--seed" in action.option_strings:
                assert action.help and "default" in action.help, name


def test_fit_multitask_reads_the_data_after_its_target():
    args = build_parser().parse_args(["fit-multitask", "--target", "y", "tasks.csv",
                                      "--task-column", "t", "--out", "m.safetensors"])
    assert str(args.data) == "tasks.csv" and args.target == "y"


@pytest.fixture
def data_csv(tmp_path):
    import numpy as np

    x = np.linspace(0.0, 1.0, 12)
    return write_csv(tmp_path / "data.csv", {"x": x, "task": np.arange(12) % 2.0,
                                             "y": np.sin(x)})


@pytest.mark.parametrize("name, argv, fit", [
    ("fit-local", ["--target", "y", "--partitions", "2", "--inducing", "3"],
     "pyrogp_models.inference.executors.fit_local_on"),
    ("fit-experts", ["--target", "y", "--experts", "2"],
     "pyrogp_models.inference.experts_fit.fit_exact_experts"),
    ("fit-distkernel", ["--target", "y", "--regions", "2", "--inducing-per-region", "3"],
     "pyrogp_models.inference.distributed_kernel_fit.fit_distributed_kernel"),
    ("fit-multitask", ["--target", "y", "--task-column", "task"],
     "pyrogp_models.inference.multitask_fit.fit_multitask_dgp"),
])
def test_out_under_a_file_fails_before_the_fit(capsys, monkeypatch, data_csv, name, argv, fit):
    def never(*args, **kwargs):
        raise AssertionError("fitted before the output was checked")

    module, attribute = fit.rsplit(".", 1)
    monkeypatch.setattr(sys.modules.get(module) or __import__(module, fromlist=[attribute]),
                        attribute, never)
    message = run_failing(capsys, name, data_csv, *argv, "--out", data_csv / "out")
    assert "does not exist" in message


@pytest.mark.parametrize("package", ["pyrogp_models", "pyrogp_models.inference"])
def test_every_public_name_imports(package):
    """The packages' exports are lazy: each name of ``__all__`` resolves on first use."""
    exit_code = subprocess.run(
        [sys.executable, "-c", f"import {package} as p\n"
                               "missing = [n for n in p.__all__ if getattr(p, n, None) is None]\n"
                               "assert not missing, missing\n"
                               f"exec('from {package} import *')"],
        capture_output=True, text=True).returncode
    assert exit_code == 0


def test_the_help_texts_quote_the_models_default_inducing_budget():
    """The help texts' copy (no torch at startup) of the models' rule."""
    from pyrogp_models.inference import train_config

    from pyrogp_models.data import inducing
    from pyrogp_models.models.multitask import options

    assert train_config.MAX_DEFAULT_INDUCING == inducing.MAX_DEFAULT_INDUCING
    assert train_config.MAX_DEFAULT_TASK_INDUCING == options.MAX_DEFAULT_TASK_INDUCING
