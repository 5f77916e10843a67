"""Every tutorial notebook runs from top to bottom without an error, in its fast mode.

Each notebook executes in a fresh kernel started from this interpreter (so it sees the package
installed here, whatever Jupyter kernels the machine knows about), in the notebook's own folder,
with ``PYROGP_NOTEBOOK_FAST=1`` and the off-screen ``Agg`` matplotlib backend.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

from ipykernel.kernelspec import make_ipkernel_cmd  # noqa: E402
from jupyter_client.kernelspec import KernelSpec  # noqa: E402
from jupyter_client.manager import AsyncKernelManager  # noqa: E402

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
CELL_TIMEOUT = 300  # seconds, per cell
MARKER = "pyrogp-notebook-test kernel prefix: "


class ThisInterpreterKernelManager(AsyncKernelManager):
    """Starts the IPython kernel with ``sys.executable``, ignoring installed kernel specs."""

    @property
    def kernel_spec(self) -> KernelSpec:
        return KernelSpec(
            argv=make_ipkernel_cmd(executable=sys.executable),
            display_name="Python 3 (this interpreter)",
            language="python",
            name="python3",
        )


def _outputs_text(cell) -> str:
    return "".join(out.get("text", "") for out in cell.get("outputs", []))


@pytest.mark.skipif(not NOTEBOOKS, reason="no notebooks to run")
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.name for path in NOTEBOOKS])
def test_notebook_runs(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYROGP_NOTEBOOK_FAST", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    notebook = nbformat.read(path, as_version=4)
    # The kernel must see this environment (its sys.prefix is the venv, not the base Python
    # that the venv's interpreter links to).
    probe = nbformat.v4.new_code_cell(f"import sys\nprint({MARKER!r} + sys.prefix)")
    notebook.cells.append(probe)
    client = nbclient.NotebookClient(
        notebook,
        timeout=CELL_TIMEOUT,
        kernel_name="python3",
        kernel_manager_class=ThisInterpreterKernelManager,
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()  # raises CellExecutionError, with the cell and traceback
    printed = _outputs_text(notebook.cells[-1]).strip()
    assert printed.startswith(MARKER), printed
    kernel_prefix = printed.removeprefix(MARKER)
    assert Path(kernel_prefix).resolve() == Path(sys.prefix).resolve(), (kernel_prefix, sys.prefix)
