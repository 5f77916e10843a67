"""The package's layers, read from its own import statements (``ast``, nothing is imported): no
module imports from a layer above its own, the model families do not import each other, and no
circle of modules imports itself (within a layer either).

The layers, lowest first (docs/design.md, "Layers"):

0. ``errors``, ``text``, ``arviz_bridge``, ``lazy_exports`` — leaves: exceptions, plain-text
   tables, the ArviZ conversion, the packages' names imported on first use;
1. ``gaussian`` — linear algebra, conditionals, KL divergences, expectations;
2. ``kernels``;
3. ``likelihoods``;
4. ``layers`` — the sparse-GP layer;
5. ``data`` — tables, columns, standardisation, partitioners, k-means, inducing inputs;
6. ``modules`` — the record, its files, stacks, routing, the predictor base;
7. ``models.local``, ``models.meta``, ``models.experts``, ``models.distributed_kernel``,
   ``models.multitask`` — siblings: none imports another;
8. ``io`` — the registry of file formats (it knows every model's file);
9. the package itself (``pyrogp_models/__init__.py``, its lazy exports);
10. ``inference`` (``pyrogp_models.inference``) — training, fitting, metrics, the command line;
    above it only ``benchmarks/``, which nothing imports.

One documented exception: :data:`ALLOWED` (an edge that cannot be removed here).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: The rank of each layer (module docstring); siblings share a rank.
RANKS = {
    "errors": 0, "text": 0, "arviz_bridge": 0, "lazy_exports": 0,
    "gaussian": 1, "kernels": 2, "likelihoods": 3, "layers": 4, "data": 5, "modules": 6,
    "models.local": 7, "models.meta": 7, "models.experts": 7, "models.distributed_kernel": 7,
    "models.multitask": 7,
    "models": 7,  # models/__init__.py (a docstring)
    "io": 8, "package": 9, "inference": 10,
}
#: Edges (importing layer, imported module) allowed against the order, each with its reason.
ALLOWED = {
    # The kernels name their Pyro parameters with the layers' unique_name helper, a leaf module
    # (it imports nothing of the package).
    ("kernels", "pyrogp_models.layers.naming"),
}


def layer_of(module: str) -> str | None:
    """The layer of a dotted module name of this package (None for anything else)."""
    parts = module.split(".")
    if parts[0] != "pyrogp_models":
        return None
    if len(parts) == 1:
        return "package"
    if parts[1] == "models" and len(parts) > 2:
        return f"models.{parts[2]}"
    return parts[1] if parts[1] in RANKS else None


def source_files() -> dict[str, Path]:
    """Every module of the installed package by dotted name (``inference/`` installs as
    ``pyrogp_models.inference``)."""
    files = {}
    for tree, installed in (("pyrogp_models", "pyrogp_models"),
                            ("inference", "pyrogp_models.inference")):
        for path in (ROOT / tree).rglob("*.py"):
            parts = path.relative_to(ROOT / tree).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            files[".".join((installed, *parts))] = path
    return files


def import_statements(path: Path, module: str) -> list[tuple[str, list[str]]]:
    """(module named, the names taken from it; none for ``import x``) for every import of
    ``path``, wherever in the file (imports inside functions count too); relative imports
    resolved to absolute names."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.extend((alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found.append((base, [alias.name for alias in node.names]))
    return found


def imports(path: Path, module: str) -> set[str]:
    """Every module ``path`` imports, and every ``module.name`` it takes from one."""
    found = set()
    for base, names in import_statements(path, module):
        found.add(base)
        found.update(f"{base}.{name}" for name in names)
    return found


def edges() -> list[tuple[str, str, str]]:
    """(importing module, its layer, imported module) for every import within the package."""
    out = []
    for module, path in source_files().items():
        source = layer_of(module)
        for target in imports(path, module):
            if layer_of(target) is not None:
                out.append((module, source, target))
    return out


def test_every_module_has_a_layer():
    assert all(layer_of(module) for module in source_files()), \
        [module for module in source_files() if not layer_of(module)]


def allowed(source: str, target: str) -> bool:
    """Whether the edge is one of :data:`ALLOWED` (a name imported from its module included)."""
    return any(source == layer and (target == name or target.startswith(f"{name}."))
               for layer, name in ALLOWED)


def test_no_layer_imports_from_a_higher_one():
    upward = [(module, target) for module, source, target in edges()
              if RANKS[layer_of(target)] > RANKS[source] and not allowed(source, target)]
    assert upward == []


def test_model_families_do_not_import_each_other():
    across = [(module, target) for module, source, target in edges()
              if source.startswith("models.") and layer_of(target).startswith("models.")
              and layer_of(target) != source]
    assert across == []


def test_the_allowed_exceptions_are_still_needed():
    """An exception that no longer occurs is removed from :data:`ALLOWED`."""
    found = {(source, target) for _, source, target in edges()}
    assert ALLOWED <= found


@pytest.mark.parametrize("module, target, expected", [
    ("pyrogp_models.modules.routing", "pyrogp_models.models.distributed_kernel.files", False),
    ("pyrogp_models.io.formats", "pyrogp_models.models.multitask.files", True),
    ("pyrogp_models.data.tables", "pyrogp_models.modules.record", False),
])
def test_the_rule_reads_an_edge_as_the_order_says(module, target, expected):
    """The order itself: a module may import a lower layer, not a higher one."""
    assert (RANKS[layer_of(target)] <= RANKS[layer_of(module)]) is expected


def test_the_library_never_imports_the_command_line_or_benchmarks():
    library = [(module, target) for module, source, target in edges()
               if source != "inference" and layer_of(target) == "inference"]
    assert library == []
    for module, path in source_files().items():
        assert not any(name.split(".")[0] == "benchmarks" for name in imports(path, module)), \
            module


def module_edges() -> dict[str, set[str]]:
    """Module → the package's modules it imports: ``from package import name`` imports
    ``package.name`` where that is a module, else the package (its ``__init__``)."""
    modules = source_files()
    graph = {}
    for module, path in modules.items():
        targets = set()
        for base, names in import_statements(path, module):
            named = [f"{base}.{name}" for name in names]
            targets.update(name for name in named if name in modules)
            if not names or any(name not in modules for name in named):
                targets.add(base)
        graph[module] = {target for target in targets if target in modules} - {module}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, cycles = {}, {}, set(), [], []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_no_two_modules_import_each_other():
    """No circle of imports, within a layer too (an import inside a function counts)."""
    assert import_cycles(module_edges()) == []


def test_the_cycle_finder_finds_a_circle_and_only_it():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert import_cycles(graph) == [["a", "b", "c"]]
