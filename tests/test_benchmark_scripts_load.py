"""Every script in ``benchmarks/`` loads against the library as it is and answers ``--help``:
a renamed default or a moved function breaks the script here, not months later when someone
reruns it (the full runs take hours and are not part of ``make test``)."""

import subprocess
import sys

import pytest

from helpers import ROOT

SCRIPTS = sorted(path.name for path in (ROOT / "benchmarks").glob("[a-z]*.py"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_benchmark_script_loads_and_answers_help(script):
    completed = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--help"],
                               cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert "usage:" in completed.stdout
