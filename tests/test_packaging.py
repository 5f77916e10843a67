"""The distribution as a user installs it: every package is in the wheel, the command line is
there, no generic top-level name (``inference``) is claimed, and the README tour runs against the
installed wheel from outside the repository."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def package_folders() -> set[str]:
    """Every folder of the repository's two source trees that is a package, by the name it
    installs under (``inference/`` is installed as ``pyrogp_models.inference``)."""
    names = set()
    for tree, installed in (("pyrogp_models", "pyrogp_models"),
                            ("inference", "pyrogp_models.inference")):
        for init in (ROOT / tree).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / tree).parts
            names.add(".".join((installed, *parts)))
    return names


def test_every_package_is_listed():
    assert set(PYPROJECT["tool"]["setuptools"]["packages"]) == package_folders()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from a copy of the working tree (the checkout stays clean)."""
    source = tmp_path_factory.mktemp("source")
    tracked = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split()
    for name in tracked:
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(out), str(source)], check=True, capture_output=True)
    return next(out.glob("pyrogp_models-*.whl"))


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh virtual environment with the wheel installed; its dependencies are borrowed from
    this environment (a path entry, so nothing of this checkout is importable there)."""
    env = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    python = env / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], capture_output=True, text=True,
                          check=True).stdout.strip()
    (Path(site) / "borrowed_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "-q", str(wheel)],
                   check=True, capture_output=True)
    return env


def run_in(env: Path, code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(env / "bin" / "python"), "-c", code], cwd=cwd,
                          capture_output=True, text=True)


def test_the_wheel_claims_no_top_level_name_but_its_own(wheel):
    with zipfile.ZipFile(wheel) as archive:
        top = {name.split("/")[0] for name in archive.namelist()}
        assert {name for name in top if not name.endswith(".dist-info")} == {"pyrogp_models"}
        assert "pyrogp_models/inference/commands/fit_local.py" in archive.namelist()
        assert "pyrogp_models/data/datasets/banana.csv" in archive.namelist()


def test_the_installed_package_has_no_inference_module(installed, tmp_path):
    probe = run_in(installed, "import importlib.util as u, pyrogp_models.inference as i; "
                              "print(u.find_spec('inference')); print(i.__file__)", tmp_path)
    assert probe.returncode == 0, probe.stderr
    missing, location = probe.stdout.split()[:1], probe.stdout.split()[-1]
    assert missing == ["None"]
    assert str(installed) in location and str(ROOT) not in location
    help_text = subprocess.run([str(installed / "bin" / "pyrogp"), "--help"],
                               capture_output=True, text=True, cwd=tmp_path)
    assert help_text.returncode == 0 and "fit-local" in help_text.stdout


def test_the_readme_tour_runs_against_the_wheel(installed, tmp_path):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    tour = re.search(r"^## A short tour\n.*?^```python\n(.*?)^```", readme,
                     flags=re.S | re.M).group(1)
    done = run_in(installed, tour + "\nimport pyrogp_models; print(pyrogp_models.__file__)",
                  tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert str(installed) in done.stdout.split()[-1]
