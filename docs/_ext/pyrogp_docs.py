"""Local Sphinx extension of the pyrogp_models documentation.

- Docstrings are written as plain-text maths for readers of the source: shapes like
  ``[*batch, N]``, symbols like ``K_**`` or ``σ*²`` and norms like ``|D_j|``. Before
  reStructuredText sees them, the asterisks, bars and trailing underscores that are not markup
  are escaped.
- A name in a cross-reference that a module only imports (``pyrogp_models.layers.SparseGPLayer``,
  or ``DataError`` inside a module that imports it) resolves to the object's own page.
- ``.. package-modules:: PACKAGE`` documents every module of a package (found by walking it, so
  a new module cannot be left out), one section each.
- ``benchmark-scripts`` and ``benchmark-reports`` (in a MyST page) list every script of
  ``benchmarks/`` with the first paragraph of its docstring and its committed results, and
  include every committed report of ``benchmarks/results/`` (``*_quick*`` files are local runs
  and left out).
- A public module, class, function or method that autodoc documents without a docstring is a
  warning (``make docs`` runs with ``-W``, so it fails the build).
- ``.. git-changelog::`` renders ``git log --oneline`` of the repository as a list, so the
  changelog is never edited by hand.
"""

from __future__ import annotations

import ast
import importlib
import os
import pkgutil
import re
import subprocess
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx import addnodes
from sphinx.ext import napoleon
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

LOGGER = logging.getLogger(__name__)
REPOSITORY = Path(__file__).resolve().parents[2]
BENCHMARKS = REPOSITORY / "benchmarks"
RESULTS = BENCHMARKS / "results"
#: The kinds of objects that must carry a docstring of their own.
DOCUMENTED_KINDS = {"class", "exception", "function", "method", "classmethod", "staticmethod"}


#: Inline literals, roles, interpreted text and hyperlink targets: left as they are.
PROTECTED = re.compile(r"(``.+?``|:[\w:.+-]+:`[^`]+`|`[^`]+`_{0,2})")
#: ``*emphasis*`` and ``**strong**`` as docutils recognises them.
EMPHASIS = re.compile(r"(?<![\w\\*])(\*\*?)(?![\s*])([^*]*?[^\s\\*])\1(?![\w*])")
#: A trailing underscore that would make the word before it a hyperlink reference.
TRAILING_UNDERSCORE = re.compile(r"(?<=\w)_(?=[^\w\[({]|$)")


def escape_plain_maths(text: str) -> str:
    """``text`` (one docstring line) with the asterisks, bars and trailing underscores of plain
    maths escaped; markup (emphasis, literals, roles, a line block's leading bar) is kept."""
    pieces = PROTECTED.split(text)
    for i in range(0, len(pieces), 2):  # the even pieces lie outside literals and roles
        plain = pieces[i]
        kept = [match.span() for match in EMPHASIS.finditer(plain)]
        escaped = []
        for position, character in enumerate(plain):
            markup = any(start <= position < end for start, end in kept)
            bullet = i == 0 and not plain[:position].strip() and plain[position + 1:][:1] == " "
            if character == "*" and not (markup or bullet or _escaped(plain, position)):
                character = "\\*"
            elif character == "|" and (i or plain[:position].strip()
                                       or not plain[position + 1:position + 2].isspace()):
                character = "\\|"
            escaped.append(character)
        pieces[i] = TRAILING_UNDERSCORE.sub(r"\\_", "".join(escaped))
    return "".join(pieces)


def _escaped(text: str, position: int) -> bool:
    return position > 0 and text[position - 1] == "\\"


def escape_docstring(app, what, name, obj, options, lines) -> None:
    """Escape the plain maths of every docstring line (see :func:`escape_plain_maths`);
    literal blocks (after a line ending in ``::``) are left alone."""
    literal_indent = None
    for index, line in enumerate(lines):
        indent = len(line) - len(line.lstrip())
        if literal_indent is not None and line.strip() and indent <= literal_indent:
            literal_indent = None
        if literal_indent is None:
            lines[index] = escape_plain_maths(line)
            if line.rstrip().endswith("::"):
                literal_indent = indent


def resolve_imported_name(app, env, node, contnode):
    """Resolve a Python cross-reference whose target is an imported name to the object's own
    documentation (its ``__module__`` and ``__qualname__``)."""
    if node.get("refdomain") != "py":
        return None
    target = re.sub(r"\s+", "", node["reftarget"]).lstrip("~.")
    candidates = [target]
    if node.get("py:module"):
        candidates.append(f"{node['py:module']}.{target}")
        if node.get("py:class"):
            candidates.append(f"{node['py:module']}.{node['py:class']}.{target}")
    domain = env.get_domain("py")
    for candidate in candidates:
        canonical = _canonical_name(candidate)
        if canonical is None or canonical == node["reftarget"]:
            continue
        node["reftarget"] = canonical
        resolved = domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"],
                                       canonical, node, contnode)
        node["reftarget"] = target
        if resolved is not None:
            return resolved
    return None


def _canonical_name(dotted: str) -> str | None:
    """Where the module, class or function named ``dotted`` is defined (None if unknown)."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        try:
            for attribute in parts[split:]:
                obj = getattr(obj, attribute)
        except AttributeError:
            return None
        if isinstance(obj, type(importlib)):
            return obj.__name__
        if hasattr(obj, "__module__") and hasattr(obj, "__qualname__"):
            return f"{obj.__module__}.{obj.__qualname__}"
        return None
    return None


def napoleon_except_attributes(app, what, name, obj, options, lines) -> None:
    """Napoleon's reading of Google-style sections, for everything but attributes and data.

    Napoleon reads the first line of an attribute's docstring as ``type: description``; this
    code base's ``#:`` comments are prose, often with a colon, never a type."""
    if what not in {"attribute", "data", "property"}:
        napoleon._process_docstring(app, what, name, obj, options, lines)


def require_module_docstring(app, what, name, obj, options, lines) -> None:
    """Warn when a module that autodoc documents has no docstring."""
    if what == "module" and not any(line.strip() for line in lines):
        LOGGER.warning("module %s has no docstring", name, type="pyrogp", subtype="docstring")


def require_docstrings(app, doctree) -> None:
    """Warn for every public class, function or method described without a docstring.

    Looks at what autodoc wrote (an object description whose content holds no text of its own),
    so only objects that appear on a page are judged."""
    for description in doctree.findall(addnodes.desc):
        if description.get("domain") != "py" or description.get("objtype") not in DOCUMENTED_KINDS:
            continue
        signature = next(iter(description.findall(addnodes.desc_signature)), None)
        name = signature.get("fullname", "") if signature is not None else ""
        if any(part.startswith("_") for part in name.split(".")):
            continue
        content = next(iter(description.findall(addnodes.desc_content)))
        if not any(not isinstance(child, addnodes.desc | addnodes.index) for child in content):
            LOGGER.warning("%s %s has no docstring", description["objtype"],
                           f"{signature.get('module', '')}.{name}", location=description,
                           type="pyrogp", subtype="docstring")


class PackageModules(SphinxDirective):
    """``.. package-modules:: NAME [NAME ...]``: a section with ``automodule`` for each named
    module and, for a package, each of its modules (``:exclude:`` drops modules by prefix).

    A package's own page shows only what it defines (``:ignore-module-all:``): what it re-exports
    from its modules is documented with them."""

    required_arguments = 1
    optional_arguments = 20
    option_spec = {"exclude": directives.unchanged}

    def run(self) -> list[nodes.Node]:
        excluded = tuple(self.options.get("exclude", "").split())
        lines = []
        for name in self.arguments:
            for module_name in self.modules(name):
                if module_name.startswith(excluded):
                    continue
                title = f"``{module_name}``"
                lines += [title, "-" * len(title), "", f".. automodule:: {module_name}"]
                if hasattr(importlib.import_module(module_name), "__path__"):
                    lines.append("   :ignore-module-all:")
                lines.append("")
        content = nodes.section()
        content.document = self.state.document
        nested_parse_with_titles(self.state, StringList(lines, source=self.get_source_info()[0]),
                                 content)
        return content.children

    @staticmethod
    def modules(name: str) -> list[str]:
        """The module ``name`` and, for a package, all its modules, packages before their
        contents."""
        module = importlib.import_module(name)
        if not hasattr(module, "__path__"):
            return [name]
        found = pkgutil.walk_packages(module.__path__, prefix=f"{name}.")
        return [name, *sorted(info.name for info in found)]


class BenchmarkScripts(SphinxDirective):
    """A table of the benchmark scripts: the first paragraph of each one's docstring and its
    committed results (written as Markdown: the directive belongs in a MyST page)."""

    def run(self) -> list[nodes.Node]:
        here = Path(self.env.doc2path(self.env.docname)).parent
        lines = ["| script | what it measures | results |", "|---|---|---|"]
        for script in sorted(BENCHMARKS.glob("[!_]*.py")):
            docstring = ast.get_docstring(ast.parse(script.read_text(encoding="utf-8"))) or ""
            summary = " ".join(docstring.split("\n\n")[0].split())
            results = []
            for path in committed_results(f"{script.stem}.*"):
                if path.suffix == ".md":
                    results.append(f"{{ref}}`report <results-{path.stem}>`")
                else:
                    link = os.path.relpath(path, here)
                    results.append(f"{{download}}`{path.suffix[1:].upper()} <{link}>`")
            listed = ", ".join(results) or "—"
            lines.append(f"| `{script.name}` | {summary} | {listed} |")
        return parse_markdown(self, lines)


class BenchmarkReports(SphinxDirective):
    """Every committed report of ``benchmarks/results``, included as it is, one section each
    (Markdown: the directive belongs in a MyST page, after any other content of its section)."""

    def run(self) -> list[nodes.Node]:
        here = Path(self.env.doc2path(self.env.docname)).parent
        lines = []
        for report in committed_results("*.md"):
            lines += [f"(results-{report.stem})=",
                      f"```{{include}} {os.path.relpath(report, here)}",
                      ":relative-images:", ":heading-offset: 1", "```", ""]
        return parse_markdown(self, lines)


def parse_markdown(directive: SphinxDirective, lines: list[str]) -> list[nodes.Node]:
    """``lines`` parsed by the page's own (MyST) parser; sections attach to the page."""
    content = nodes.section()
    directive.state.nested_parse(StringList(lines, source=directive.get_source_info()[0]),
                                 directive.content_offset, content)
    return content.children


def committed_results(pattern: str) -> list[Path]:
    """The files of ``benchmarks/results`` that match ``pattern``, without local quick runs."""
    return sorted(path for path in RESULTS.glob(pattern) if "_quick" not in path.name)


class GitChangelog(SphinxDirective):
    """The repository's history, newest first, one commit a line (``git log --oneline``)."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        try:
            log = subprocess.run(["git", "-C", str(REPOSITORY), "log", "--oneline"],
                                 capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            return [nodes.paragraph(text="(No git history: this copy is not a git checkout.)")]
        items = nodes.bullet_list()
        for line in log.splitlines():
            commit, _, subject = line.partition(" ")
            paragraph = nodes.paragraph()
            paragraph += nodes.literal(text=commit)
            paragraph += nodes.Text(" " + subject)
            items += nodes.list_item("", paragraph)
        return [items]


def setup(app):
    app.setup_extension("sphinx.ext.napoleon")
    for listener in list(app.events.listeners["autodoc-process-docstring"]):
        if listener.handler is napoleon._process_docstring:
            app.disconnect(listener.id)
    app.connect("autodoc-process-docstring", escape_docstring, priority=400)
    app.connect("autodoc-process-docstring", napoleon_except_attributes)
    app.connect("autodoc-process-docstring", require_module_docstring)
    app.connect("missing-reference", resolve_imported_name)
    app.connect("doctree-read", require_docstrings)
    app.add_directive("git-changelog", GitChangelog)
    app.add_directive("package-modules", PackageModules)
    app.add_directive("benchmark-scripts", BenchmarkScripts)
    app.add_directive("benchmark-reports", BenchmarkReports)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
