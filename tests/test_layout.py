"""The package's structure: no module of equivtool imports another in a cycle.

An import anywhere in a module counts, at module level or inside a function
(a lazy import only hides a cycle), except under ``if TYPE_CHECKING:``. The
root package's lazy ``__getattr__`` table (``equivtool/__init__.py``) is the
public API and imports nothing by statement, so edges into the root package
itself are not followed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _module_name(path: Path, package_dir: Path) -> str:
    parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking_lines(tree: ast.AST) -> set:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _imported(node, module: str, is_package: bool, modules) -> list:
    """The modules a statement imports: for ``from X import y``, X.y where that is a module, else X."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:  # relative import
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    return [f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
            for alias in node.names]


def import_graph(package_dir: Path) -> dict:
    """module -> the modules of the same package it names in an import.

    ``from pkg.sub.mod import x`` is an edge to ``pkg.sub.mod`` only, and
    ``from pkg.sub import mod`` one to ``pkg.sub.mod`` only: the
    packages above it are being or have been initialised when a submodule
    runs, so a package's ``__init__`` that re-exports its submodules (a facade)
    is not a cycle; a submodule that imports a name from its package's
    ``__init__`` is.
    """
    files = {_module_name(p, package_dir): p for p in sorted(package_dir.rglob("*.py"))}
    root = package_dir.name
    graph = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        skip = _type_checking_lines(tree)
        edges = set()
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or node.lineno in skip:
                continue
            for target in _imported(node, module, path.name == "__init__.py", files):
                if target in files and target not in (module, root):
                    edges.add(target)
        graph[module] = edges
    return graph


def cycles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_no_module_of_equivtool_imports_another_in_a_cycle():
    graph = import_graph(ROOT / "equivtool")
    assert len(graph) > 40 and sum(map(len, graph.values())) > 80, "the scan found too little to judge"
    assert cycles(graph) == []


def _plant(tmp_path: Path, files: dict) -> Path:
    package = tmp_path / "pkg"
    for name, text in files.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return package


@pytest.mark.parametrize("files, expected", [
    # module level, both ways
    ({"__init__.py": "", "a.py": "from pkg import b\n", "b.py": "import pkg.a\n"}, [["pkg.a", "pkg.b"]]),
    # a lazy import inside a function still closes the cycle
    ({"__init__.py": "", "a.py": "from pkg.b import f\n",
      "b.py": "def f():\n    from pkg.a import g\n"}, [["pkg.a", "pkg.b"]]),
    # a relative import of a name from the package's __init__, which imports the submodule
    ({"__init__.py": "", "sub/__init__.py": "from .c import x\n",
      "sub/c.py": "from . import helper\n", "sub/helper.py": "from pkg.sub import x\n"},
     [["pkg.sub", "pkg.sub.c", "pkg.sub.helper"]]),
])
def test_the_scan_finds_a_planted_cycle(tmp_path, files, expected):
    assert cycles(import_graph(_plant(tmp_path, files))) == expected


def test_type_checking_imports_and_the_root_table_are_not_cycles(tmp_path):
    package = _plant(tmp_path, {
        "__init__.py": "from pkg import a\n",
        "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n",
        "b.py": "import pkg\nfrom pkg import a\n"})
    graph = import_graph(package)
    assert graph["pkg.b"] == {"pkg.a"} and graph["pkg.a"] == set()
    assert cycles(graph) == []
