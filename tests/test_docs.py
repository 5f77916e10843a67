"""The documentation site (``make docs``): what it holds, and how it looks in a real browser.

The site is built once per session with warnings as errors, into a temporary folder, unless
``docs/_build/html`` holds a clean ``make docs`` build newer than every source of the site (the
``.clean-build`` marker written after a build without warnings, the docs, notebooks, packages
and benchmark results, and the commit the changelog lists). The browser test needs Debian's
``chromium`` (or ``chromium-browser``) and is skipped without it; its screenshots are kept in
pytest's temporary folder (``pyrogp-docs-screenshots``).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
import runpy
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest
from pyrogp_models.inference.cli import build_parser

import pyrogp_models
from pyrogp_models import inference

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
BUILD = DOCS / "_build" / "html"
CLEAN_MARKER = ".clean-build"
#: Everything the site is generated from (besides the git history, checked separately).
SOURCES = [DOCS, ROOT / "notebooks", ROOT / "pyrogp_models", ROOT / "inference",
           ROOT / "benchmarks" / "results", ROOT / "pyproject.toml"]
MODEL_PAGES = ["local_svgp", "modules", "meta_gp", "experts", "distributed_kernel", "multitask"]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
RESULTS = ROOT / "benchmarks" / "results"
BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")


# Building -------------------------------------------------------------------------------------
def head_commit() -> str | None:
    """The short hash of HEAD, or None outside a git checkout."""
    result = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else None


def newest_source() -> float:
    """The latest modification time among the site's sources (build output excluded)."""
    times = []
    for source in SOURCES:
        files = [source] if source.is_file() else source.rglob("*")
        times += [f.stat().st_mtime for f in files
                  if f.is_file() and "_build" not in f.parts and "__pycache__" not in f.parts]
    return max(times)


def is_fresh(build: Path) -> bool:
    """Whether ``build`` is a clean build of the current sources and commit."""
    marker = build / CLEAN_MARKER
    if not marker.exists() or marker.stat().st_mtime < newest_source():
        return False
    commit = head_commit()
    return commit is None or commit in (build / "changelog.html").read_text(encoding="utf-8")


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> Path:
    """The built site: a fresh ``make docs`` build, or one made here with ``-W --keep-going``."""
    if is_fresh(BUILD):
        return BUILD
    out = tmp_path_factory.mktemp("docs") / "html"
    result = subprocess.run([sys.executable, "-m", "sphinx", "-E", "-W", "--keep-going", "-q",
                             "-b", "html", str(DOCS), str(out)],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, f"the docs build failed:\n{result.stderr[-6000:]}"
    return out


# Reading HTML ---------------------------------------------------------------------------------
class PageReader(HTMLParser):
    """The visible prose of a page (no scripts, styles, code or MathJax output), its images and
    its external resources."""

    HIDDEN = {"script", "style", "pre", "code", "mjx-container", "noscript", "svg", "template"}

    def __init__(self):
        super().__init__()
        self.text: list[str] = []
        self.images: list[str] = []
        self.resources: list[str] = []
        self.hidden_depth = 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag in self.HIDDEN:
            self.hidden_depth += 1
        if tag == "img":
            self.images.append(attrs.get("src", ""))
        if tag in {"script", "img"} and attrs.get("src"):
            self.resources.append(attrs["src"])
        if tag == "link" and attrs.get("rel") in {"stylesheet", "preload"}:
            self.resources.append(attrs.get("href", ""))

    def handle_endtag(self, tag):
        if tag in self.HIDDEN and self.hidden_depth:
            self.hidden_depth -= 1

    def handle_data(self, data):
        if not self.hidden_depth:
            self.text.append(data)


def read_page(html: str) -> PageReader:
    reader = PageReader()
    reader.feed(html)
    return reader


def page(site: Path, name: str) -> str:
    path = site / f"{name}.html"
    assert path.exists(), f"no page {name}.html in the built site"
    return path.read_text(encoding="utf-8")


# The site's contents --------------------------------------------------------------------------
@pytest.mark.parametrize("name", MODEL_PAGES)
def test_page_per_model(site, name):
    """Every model has a page with its maths (display equations), its paper and its API."""
    html = page(site, f"models/{name}")
    assert html.count('class="math notranslate nohighlight"') >= 1, "no display equation"
    assert '<dl class="py class">' in html or '<dl class="py function">' in html, "no API"
    assert '<section id="api">' in html


def test_cli_page_lists_every_command(site):
    """The command-line page documents every ``pyrogp`` subcommand and every option of each."""
    html = page(site, "cli")
    parser = build_parser()
    (subparsers,) = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    assert subparsers.choices, "the parser has no subcommands"
    text = " ".join(read_page(html).text)
    for name, subparser in subparsers.choices.items():
        assert f'<section id="pyrogp-{name}">' in html, f"no section for pyrogp {name}"
        for action in subparser._actions:
            if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
                continue  # sphinx-argparse leaves out -h/--help, as argparse hides SUPPRESS
            for option in action.option_strings:
                assert option in html, f"pyrogp {name}: option {option} is not on the CLI page"
    assert "fit-local" in text


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_tutorial_pages(site, path):
    """Every notebook has a page with its headings and as many figures as it stores."""
    html = page(site, f"notebooks/{path.stem}")
    notebook = nbformat.read(path, as_version=4)
    headings = [line.lstrip("#").strip() for cell in notebook.cells
                if cell.cell_type == "markdown" for line in cell.source.splitlines()
                if line.startswith("#")]
    text = " ".join(read_page(html).text)
    for heading in headings:
        assert " ".join(heading.replace("`", "").split()[:3]) in " ".join(text.split()), heading
    stored = sum("image/png" in output.get("data", {}) for cell in notebook.cells
                 if cell.cell_type == "code" for output in cell.get("outputs", []))
    figures = [src for src in read_page(html).images if "_images/" in src]
    assert len(figures) >= stored, f"{stored} stored figures, {len(figures)} on the page"


def test_benchmark_results_on_the_site(site):
    """Every committed report and figure of ``benchmarks/results`` is on the benchmarks page."""
    html = page(site, "benchmarks")
    images = {Path(src).name for src in read_page(html).images}
    for figure in RESULTS.glob("*.png"):
        if "_quick" not in figure.name:
            stem = figure.stem
            assert any(name.startswith(stem) for name in images), f"{figure.name} is missing"
    for report in RESULTS.glob("*.md"):
        if "_quick" not in report.name:
            title = report.read_text(encoding="utf-8").splitlines()[0].lstrip("# ").strip()
            assert title.split("(")[0].strip() in html, f"{report.name} is missing"


def test_api_documents_every_module(site):
    """Every module of both packages (but the command modules, documented by the CLI page) is
    documented exactly once."""
    from sphinx.util.inventory import InventoryFile

    with open(site / "objects.inv", "rb") as stream:
        inventory = InventoryFile.load(stream, "", lambda base, uri: uri)
    documented = set(inventory["py:module"])
    expected = set()
    for package in (pyrogp_models, inference):
        prefix = f"{package.__name__}."
        expected.add(package.__name__)
        for path in Path(package.__file__).parent.rglob("*.py"):
            relative = path.relative_to(Path(package.__file__).parent).with_suffix("")
            parts = [p for p in relative.parts if p != "__init__"]
            expected.add(prefix + ".".join(parts) if parts else package.__name__)
    expected = {name for name in expected
                if not name.startswith("pyrogp_models.inference.commands")}
    assert expected - documented == set()


def test_changelog_lists_the_history(site):
    """The changelog is ``git log --oneline``: it names the current commit."""
    commit = head_commit()
    if commit is None:
        pytest.skip("not a git checkout")
    assert commit in page(site, "changelog")


def test_site_works_offline(site):
    """No script, style sheet or image comes from another host (MathJax is bundled)."""
    assert (site / "_static" / "mathjax" / "tex-chtml.js").exists()
    for path in site.rglob("*.html"):
        for resource in read_page(path.read_text(encoding="utf-8")).resources:
            assert not re.match(r"(https?:)?//", resource), f"{path.name} loads {resource}"


@pytest.mark.parametrize("example", sorted((DOCS / "examples").glob("*.py")),
                         ids=lambda path: path.stem)
def test_examples_run(example, capsys):
    """The code the pages include from ``docs/examples`` runs as shown."""
    runpy.run_path(str(example), run_name="__main__")
    assert capsys.readouterr().out.strip(), "the example printed nothing"


# Docstrings -----------------------------------------------------------------------------------
def own_docstring(obj) -> str:
    """The object's own docstring: not inherited, not the one dataclasses generate."""
    doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
    if inspect.isclass(obj) and doc and doc.startswith(f"{obj.__name__}("):
        return ""  # dataclasses write the signature when a class has no docstring
    return inspect.cleandoc(doc or "")


PUBLIC = ([(pyrogp_models, name) for name in pyrogp_models.__all__]
          + [(inference, name) for name in inference.__all__])


@pytest.mark.parametrize("package, name", PUBLIC, ids=[f"{p.__name__}.{n}" for p, n in PUBLIC])
def test_public_names_have_docstrings(package, name):
    """Every name of ``pyrogp_models.__all__`` and ``pyrogp_models.inference.__all__`` has a
    docstring of its own of at least a sentence (the site's build also fails on any public symbol
    without one)."""
    obj = getattr(package, name)
    doc = own_docstring(obj)
    assert len(doc) >= 30 and doc.rstrip().endswith((".", ")", ":", "]")), \
        f"{package.__name__}.{name} needs a docstring"


def test_docstring_check_fails_without_a_docstring():
    """The dataclass-signature docstring does not count, a real one does."""
    from dataclasses import dataclass

    @dataclass
    class Undocumented:
        value: int

    @dataclass
    class Documented:
        """A documented record of one value, in data units."""

        value: int

    assert own_docstring(Undocumented) == ""
    assert own_docstring(Documented).startswith("A documented")


# In a real browser ----------------------------------------------------------------------------
def browser_pages() -> list[str]:
    return (["index"] + [f"models/{name}" for name in MODEL_PAGES]
            + [f"notebooks/{path.stem}" for path in NOTEBOOKS])


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("pyrogp-docs-screenshots")


def render(url: str, screenshot: Path) -> str:
    """The DOM of ``url`` after its scripts (MathJax) ran in headless Chromium, with a
    screenshot."""
    command = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               "--window-size=1280,2400", "--virtual-time-budget=20000",
               f"--screenshot={screenshot}", "--dump-dom", url]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


@pytest.mark.skipif(BROWSER is None, reason="no chromium or chromium-browser binary")
@pytest.mark.parametrize("name", browser_pages())
def test_pages_in_a_browser(site, screenshots, name):
    """Equations are typeset (MathJax elements, no TeX errors, no raw delimiters left in the
    text) and every image the page shows exists as an image file."""
    source = site / f"{name}.html"
    shot = screenshots / f"{name.replace('/', '_')}.png"
    dom = render(source.as_uri(), shot)
    assert shot.exists() and shot.stat().st_size > 10_000, "no screenshot"
    has_math = 'class="math' in source.read_text(encoding="utf-8")
    if has_math:
        assert "<mjx-container" in dom, "MathJax did not typeset the page"
    assert "<mjx-merror" not in dom, "MathJax reports a TeX error"
    text = " ".join(read_page(dom).text)
    for raw in ("$", "\\(", "\\)", "\\[", "\\begin{"):
        assert raw not in text, f"raw {raw!r} in the rendered text: ...{_around(text, raw)}..."
    for src in read_page(dom).images:
        assert not src.startswith(("http:", "https:")), f"remote image {src}"
        if src.startswith("data:"):
            continue
        image = (source.parent / src.split("?")[0]).resolve()
        assert image.exists(), f"broken image {src}"
        head = image.read_bytes()[:16]
        assert head.startswith((b"\x89PNG", b"\xff\xd8", b"GIF8", b"<svg", b"<?xml")), src


def _around(text: str, needle: str, width: int = 60) -> str:
    index = text.index(needle)
    return text[max(0, index - width):index + width]


def test_docs_extension_escapes_plain_maths():
    """Shapes, starred symbols, norms and trailing underscores in docstrings are escaped for
    reStructuredText; emphasis, bullets, literals and roles are left alone."""
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        escape = importlib.import_module("pyrogp_docs").escape_plain_maths
    finally:
        sys.path.remove(str(DOCS / "_ext"))
    assert escape("X [*B, N, D] and K_** and σ*²") == r"X [\*B, N, D] and K\_\*\* and σ\*²"
    emphasis = "the **unwhitened** q(u), an *outlier*"
    assert escape(emphasis) == emphasis
    assert escape("* a bullet with |D_j| points") == r"* a bullet with \|D_j\| points"
    assert escape("u_k_ and ``a*b`` and :class:`X`") == r"u_k\_ and ``a*b`` and :class:`X`"
