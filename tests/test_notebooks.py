"""The tutorial notebooks: each runs from top to bottom in its fast mode (and so passes the checks
of its own claims that it asserts), and each committed file holds the outputs of a full run.

The fast runs use the runner of ``make notebooks`` (``notebooks/execute.py``): a fresh kernel
started from this interpreter (so it sees the package installed here, whatever Jupyter kernels
the machine knows about), in the notebook's own folder, here with ``PYROGP_NOTEBOOK_FAST=1`` and
the off-screen ``Agg`` matplotlib backend. Nothing is written back.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
MARKER = "pyrogp-notebook-test kernel prefix: "
#: The largest committed notebook. A full run of the largest tutorial stores about 0.3 MB: ten
#: figures at 72 dpi in palette PNGs of 5-60 KB each. 1 MB leaves room for more figures while
#: catching what bloats a notebook: a figure at print resolution or in true colour (0.2-1 MB
#: alone), a large DataFrame's HTML, an ArviZ InferenceData's HTML view (~90 KB each) or progress
#: bars that were not stripped.
MAX_BYTES = 1_000_000


def _runner():
    spec = importlib.util.spec_from_file_location("notebook_runner", NOTEBOOK_DIR / "execute.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _outputs_text(cell) -> str:
    return "".join(out.get("text", "") for out in cell.get("outputs", []))


@pytest.mark.skipif(not NOTEBOOKS, reason="no notebooks to run")
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.name for path in NOTEBOOKS])
def test_notebook_runs(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MPLBACKEND", "Agg")
    notebook = nbformat.read(path, as_version=4)
    # The kernel must see this environment (its sys.prefix is the venv, not the base Python
    # that the venv's interpreter links to).
    probe = nbformat.v4.new_code_cell(f"import sys\nprint({MARKER!r} + sys.prefix)")
    notebook.cells.append(probe)
    _runner().execute(notebook, path.parent, fast=True)  # raises CellExecutionError on an error
    printed = _outputs_text(notebook.cells[-1]).strip()
    assert printed.startswith(MARKER), printed
    kernel_prefix = printed.removeprefix(MARKER)
    assert Path(kernel_prefix).resolve() == Path(sys.prefix).resolve(), (kernel_prefix, sys.prefix)


@pytest.mark.skipif(not NOTEBOOKS, reason="no notebooks")
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.name for path in NOTEBOOKS])
def test_committed_notebook_has_small_outputs(path: Path) -> None:
    """Run by ``make notebooks``: every code cell executed in order, no errors, at least one PNG
    figure, no progress bars or widgets, and at most MAX_BYTES on disk."""
    size = path.stat().st_size
    assert size <= MAX_BYTES, f"{path.name} is {size / 1e6:.2f} MB; the cap is {MAX_BYTES / 1e6} MB"
    notebook = nbformat.read(path, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    counts = [cell.execution_count for cell in code]
    assert counts == list(range(1, len(code) + 1)), \
        f"{path.name} was not run top to bottom by `make notebooks`: execution counts {counts}"
    outputs = [output for cell in code for output in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"], f"{path.name} stores an error"
    assert any("image/png" in o.get("data", {}) for o in outputs), f"{path.name} has no figure"
    assert not [o for o in outputs if o.output_type == "stream" and "\r" in o.text], \
        f"{path.name} stores a progress bar"
    runner = _runner()
    assert not [o for o in outputs if runner.WIDGET_OUTPUT in o.get("data", {})], \
        f"{path.name} stores a widget"
