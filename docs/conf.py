"""Sphinx configuration of the pyrogp_models documentation (``make docs``).

The site is built offline: MathJax comes from the ``sphinx-mathjax-offline`` package and is copied
into ``_static/mathjax``; notebooks are rendered from their stored outputs by myst-nb and never
executed; the command-line page is generated from :func:`pyrogp_models.inference.cli.build_parser`.
Local checks (missing docstrings, the changelog from ``git log``) live in ``_ext/pyrogp_docs.py``.
"""

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent))
sys.path.insert(0, str(DOCS / "_ext"))

project = "pyrogp_models"
author = "the pyrogp_models developers"
copyright = "the pyrogp_models developers; Apache-2.0"
release = version = "0.1.0"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.mathjax",
    "sphinx-mathjax-offline",
    "sphinxarg.ext",
    "myst_nb",
    "pyrogp_docs",  # also loads sphinx.ext.napoleon (not for attributes)
]

source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "notebooks/.ipynb_checkpoints", "notebooks/*.md"]
# A broken cross-reference is an error (make docs runs with -W); third-party types are named in
# signatures without an inventory to resolve them against (the build is offline).
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(torch|np|numpy|pyro|arviz|az|xarray|dask|distributed|argparse|collections"
               r"|typing|pathlib|os|io|contextlib|dataclasses|enum|json|abc|concurrent|constraints)"
               r"(\..*)?"),
    (r"py:.*", r"(Tensor|Path|Sequence|Mapping|Iterable|Iterator|Callable|Any|Literal|NamedTuple"
               r"|Generator|ndarray|PyroModule|PyroParam|Parameter|Distribution)"),
    (r"py:.*", r"(optional|default|callable|array-like|tensor)"),
]

# autodoc: every public member, in source order, with its own docstring
autodoc_default_options = {
    "members": True,
    "undoc-members": True,
    "member-order": "bysource",
    "show-inheritance": True,
}
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_inherit_docstrings = True
napoleon_google_docstring = True
napoleon_numpy_docstring = False

# notebooks: rendered from the outputs stored in them, never executed here
nb_execution_mode = "off"
nb_merge_streams = True
myst_enable_extensions = ["dollarmath"]

html_theme = "furo"
html_title = "pyrogp_models"
html_static_path = ["_static"]
html_css_files = ["pyrogp.css"]
html_show_sourcelink = False
html_theme_options = {"navigation_with_keys": True}
