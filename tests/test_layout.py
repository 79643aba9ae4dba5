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


# --------------------------------------------------------------------------
# Packages: the layer table of docs/architecture.md, checked import by import
# --------------------------------------------------------------------------

ARCHITECTURE = ROOT / "docs" / "architecture.md"


def layer_table(text: str) -> list:
    """The layers of the "Packages import in one direction" table, lowest first:
    each a list of package names (the backticked names of its second column)."""
    import re
    section = text.split("## Packages import in one direction", 1)[1].split("\n## ", 1)[0]
    layers = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0] not in ("layer", "") and not set(cells[0]) <= set("-"):
            layers.append(re.findall(r"`([^`]+)`", cells[1]))
    return layers


def package_of(module: str) -> str:
    """``equivtool.engine.steps.common`` -> ``engine``; a top-level module is its own
    package; the root is ``equivtool``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def against_the_layers(graph: dict, layers: list) -> list:
    """``(importer, imported)`` module pairs whose packages break the rule: the
    imported package is in a higher layer, or in no layer at all."""
    rank = {package: i for i, names in enumerate(layers) for package in names}
    bad = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            a, b = package_of(module), package_of(target)
            if a != b and (a not in rank or b not in rank or rank[b] > rank[a]):
                bad.append((module, target))
    return bad


def package_graph(graph: dict) -> dict:
    edges: dict = {}
    for module, targets in graph.items():
        for target in targets:
            a, b = package_of(module), package_of(target)
            if a != b:
                edges.setdefault(a, set()).add(b)
    return edges


def test_the_layer_table_names_every_package_once():
    layers = layer_table(ARCHITECTURE.read_text())
    named = [package for names in layers for package in names]
    found = {package_of(m) for m in import_graph(ROOT / "equivtool")}
    assert len(layers) >= 8 and len(named) == len(set(named)), layers
    assert set(named) == found, (sorted(found - set(named)), sorted(set(named) - found))


def test_every_package_import_follows_the_layer_table():
    graph = import_graph(ROOT / "equivtool")
    layers = layer_table(ARCHITECTURE.read_text())
    assert sum(len(t) for t in graph.values()) > 300, "the scan found too little to judge"
    assert against_the_layers(graph, layers) == []
    assert cycles(package_graph(graph)) == []


def test_the_registry_names_only_engine_or_feature_modules():
    """The one upward reference, by design: a step's functions named as a string."""
    from equivtool.engine.registry import REGISTRY
    layers = layer_table(ARCHITECTURE.read_text())
    allowed = set(next(names for names in layers if "engine" in names))
    allowed |= set(layers[[i for i, names in enumerate(layers) if "engine" in names][0] + 1])
    modules = {step.run.partition(":")[0] for step in REGISTRY}
    assert modules and {package_of(m) for m in modules} <= allowed, modules


LAYERS = [["base"], ["vocab"], ["engine"], ["feature"]]


@pytest.mark.parametrize("files, expected", [
    # an upward import inside a function
    ({"__init__.py": "", "base/__init__.py": "", "base/a.py": "def f():\n    from pkg.engine import x\n",
      "engine/__init__.py": "x = 1\n"}, [("pkg.base.a", "pkg.engine")]),
    # a vocabulary that imports the engine at module level
    ({"__init__.py": "", "vocab/__init__.py": "from pkg.engine.run import go\n", "engine/__init__.py": "",
      "engine/run.py": "def go():\n    pass\n"}, [("pkg.vocab", "pkg.engine.run")]),
    # a package missing from the table
    ({"__init__.py": "", "engine/__init__.py": "from pkg.stray import y\n", "stray.py": "y = 2\n"},
     [("pkg.engine", "pkg.stray")]),
])
def test_the_layer_check_finds_a_planted_upward_import(tmp_path, files, expected):
    assert against_the_layers(import_graph(_plant(tmp_path, files)), LAYERS) == expected


def test_a_planted_package_cycle_in_one_layer_is_found(tmp_path):
    package = _plant(tmp_path, {"__init__.py": "", "base/__init__.py": "", "vocab/__init__.py": "",
                                "base/a.py": "from pkg.base2 import b\n", "base2/__init__.py": "",
                                "base2/b.py": "def g():\n    from pkg.base import a\n"})
    graph = import_graph(package)
    layers = [["base", "base2"], ["vocab"]]
    assert against_the_layers(graph, layers) == []  # same layer: allowed one way...
    assert cycles(package_graph(graph)) == [["base", "base2"]]  # ...never both


def test_downward_imports_pass_and_an_empty_scan_is_not_a_pass(tmp_path):
    package = _plant(tmp_path, {"__init__.py": "", "base/__init__.py": "", "feature/__init__.py":
                                "from pkg.base import thing\nfrom pkg.engine import run\n",
                                "engine/__init__.py": "from pkg import base\n"})
    assert against_the_layers(import_graph(package), LAYERS) == []
    # without a table nothing passes: every import between packages is against it
    assert layer_table("## Packages import in one direction\n\nno table\n") == []
    assert len(against_the_layers(import_graph(package), [])) == 3


# --------------------------------------------------------------------------
# tests/README.md: every module's tests, findable by name
# --------------------------------------------------------------------------

def test_the_test_index_lists_every_module_with_test_files_that_exist():
    import re
    index = (ROOT / "tests" / "README.md").read_text()
    rows = dict(re.findall(r"^\| `(equivtool[\w.]*)` \| (.+) \|$", index, flags=re.M))
    modules = set(import_graph(ROOT / "equivtool"))
    modules.discard("equivtool.cli.__main__")
    assert len(modules) > 80 and sorted(modules - set(rows)) == [], "modules missing from tests/README.md"
    assert sorted(set(rows) - modules) == [], "tests/README.md lists modules that do not exist"
    for module, cell in rows.items():
        files = re.findall(r"`([^`]+)`", cell)
        assert files, f"{module}: no test file named"
        missing = [f for f in files if not (ROOT / "tests" / f).is_file() or not f.startswith("test_")]
        assert not missing, f"{module}: {missing} are not test files in tests/"


def test_the_long_files_collected_first_exist():
    """conftest.LONG_FILES orders the suite for pytest-xdist; a renamed file would drop out silently."""
    from conftest import LONG_FILES
    missing = [name for name in LONG_FILES if not (ROOT / "tests" / name).is_file()]
    assert LONG_FILES and missing == [], missing
