"""Run the tutorial notebooks top to bottom and store their outputs (``make notebooks``).

    python notebooks/execute.py                  # every notebook here, full settings, saved
    python notebooks/execute.py 02_recycling.ipynb
    python notebooks/execute.py --fast --dry-run  # fast settings, nothing written

Each notebook runs in a fresh IPython kernel started from this interpreter (so it sees the package
installed here, whatever Jupyter kernels the machine knows about), in the notebook's own folder.
Full settings unset ``PYROGP_NOTEBOOK_FAST``; ``--fast`` sets it to 1, as the test suite does.
Figures are drawn by the inline backend as PNG at the dpi each notebook sets.

Before a notebook is written back its outputs are cleaned so that the committed files stay small
and a rerun changes only what the computation changed: progress bars (stderr output that redraws
itself with carriage returns) and widget outputs are dropped, no execution timestamps are
recorded, and every PNG figure is stored with a palette of at most 256 colours (a third of the
size of matplotlib's true-colour PNG, and no visible difference for line plots and scatters).
A cell that raises stops the run and nothing is written.
"""

from __future__ import annotations

import argparse
import base64
import io
import os
import sys
import time
from pathlib import Path

import nbclient
import nbformat
from ipykernel.kernelspec import make_ipkernel_cmd
from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import AsyncKernelManager
from PIL import Image

NOTEBOOK_DIR = Path(__file__).resolve().parent
CELL_TIMEOUT = 600  # seconds, per cell
FAST_VARIABLE = "PYROGP_NOTEBOOK_FAST"
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"
WIDGET_OUTPUT = "application/vnd.jupyter.widget-view+json"


class ThisInterpreterKernelManager(AsyncKernelManager):
    """Starts the IPython kernel with ``sys.executable``, ignoring installed kernel specs."""

    @property
    def kernel_spec(self) -> KernelSpec:
        return KernelSpec(
            argv=make_ipkernel_cmd(executable=sys.executable),
            display_name="Python 3 (ipykernel)",
            language="python",
            name="python3",
        )


def notebooks() -> list[Path]:
    """Every notebook in the folder, in name order."""
    return sorted(NOTEBOOK_DIR.glob("*.ipynb"))


def execute(notebook: nbformat.NotebookNode, folder: Path, fast: bool,
            timeout: int = CELL_TIMEOUT) -> nbformat.NotebookNode:
    """Run ``notebook`` in place in a fresh kernel whose working directory is ``folder``, with
    fast or full settings; raises :class:`nbclient.exceptions.CellExecutionError` on an error."""
    environment = {FAST_VARIABLE: "1" if fast else None}
    if not fast or "MPLBACKEND" not in os.environ:
        environment["MPLBACKEND"] = INLINE_BACKEND  # figures as PNG outputs
    saved = {name: os.environ.get(name) for name in environment}
    try:
        _set_environment(environment)  # the kernel inherits this process's environment
        client = nbclient.NotebookClient(
            notebook,
            timeout=timeout,
            kernel_name="python3",
            kernel_manager_class=ThisInterpreterKernelManager,
            resources={"metadata": {"path": str(folder)}},
            record_timing=False,
        )
        client.execute()
    finally:
        _set_environment(saved)
    return notebook


def clean(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Drop progress bars and widget outputs and store PNG figures with a palette, in place."""
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        cell.outputs = [output for output in cell.outputs if not _is_noise(output)]
        for output in cell.outputs:
            data = output.get("data", {})
            data.pop(WIDGET_OUTPUT, None)
            if "image/png" in data:
                data["image/png"] = palette_png(data["image/png"])
    notebook.metadata.pop("widgets", None)
    return notebook


def palette_png(encoded: str) -> str:
    """A base64 PNG re-encoded with at most 256 colours, on white where it was transparent."""
    image = Image.open(io.BytesIO(base64.b64decode(encoded))).convert("RGBA")
    opaque = Image.new("RGBA", image.size, "white")
    opaque.alpha_composite(image)
    buffer = io.BytesIO()
    opaque.convert("RGB").quantize(256, dither=Image.Dither.NONE).save(buffer, "png",
                                                                        optimize=True)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _is_noise(output) -> bool:
    if output.output_type == "stream":
        return output.name == "stderr" and "\r" in output.text
    return set(output.get("data", {})) <= {WIDGET_OUTPUT, "text/plain"} and \
        WIDGET_OUTPUT in output.get("data", {})


def _set_environment(values: dict[str, str | None]) -> None:
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path,
                        help="notebooks to run (default: every notebook in notebooks/)")
    parser.add_argument("--fast", action="store_true", help=f"set {FAST_VARIABLE}=1")
    parser.add_argument("--dry-run", action="store_true", help="run without writing back")
    args = parser.parse_args(argv)
    paths = [path if path.exists() else NOTEBOOK_DIR / path for path in args.paths] or notebooks()
    for path in paths:
        notebook = nbformat.read(path, as_version=4)
        start = time.perf_counter()
        execute(notebook, path.resolve().parent, args.fast)
        seconds = time.perf_counter() - start
        if not args.dry_run:
            nbformat.write(clean(notebook), path)
        size = path.stat().st_size / 1024
        print(f"{path.name}: {seconds:.0f} s, {size:.0f} KB"
              + ("" if args.dry_run else " (written)"), flush=True)


if __name__ == "__main__":
    main()
