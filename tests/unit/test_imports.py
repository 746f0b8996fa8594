"""The package's import graph: no circles (imports inside functions included) and no private
name imported from another module, so every module can be read and tested from below."""

from __future__ import annotations

import ast
from pathlib import Path

from helpers import ROOT

from capacity_advisor.models import MOVED

PACKAGES = ("advisor", "core", "models", "probes", "training")


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def graph() -> tuple[dict[str, set[str]], list[str]]:
    """(module -> the package modules it imports, the private names imported across modules)."""
    mods = modules()
    moved = {old[len("capacity_advisor."):]: new.__name__[len("capacity_advisor."):] for old, new in MOVED.items()}
    edges: dict[str, set[str]] = {m: set() for m in mods}
    private = []
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("capacity_advisor."):
                target = node.module[len("capacity_advisor."):]
                target = moved.get(target, target)  # a module imported by the name it had before it moved
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    if sub in mods:
                        edges[name].add(sub)
                    elif target in mods:
                        edges[name].add(target)
                        if alias.name.startswith("_"):
                            private.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {alias.name} from {target}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("capacity_advisor.") and alias.name[len("capacity_advisor."):] in mods:
                        edges[name].add(alias.name[len("capacity_advisor."):])
    for m in edges:
        edges[m].discard(m)
    return edges, private


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in edges:
        if v not in index:
            visit(v)
    return out


def test_the_graph_finds_a_circle_it_is_shown():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circles():
    edges, _ = graph()
    assert len(edges) > 50  # the walk found the package's modules
    assert circles(edges) == []


def test_no_private_name_is_imported_across_modules():
    assert graph()[1] == []


def advisor_levels(edges: dict[str, set[str]]) -> dict[int, list[str]]:
    """{level: advisor modules}: the longest chain of imports below each module of `advisor/`
    (the predictor package counted as one module, a subpackage's `__init__` as the package)."""
    def unit(m: str) -> str | None:
        if not m.startswith("advisor.") or m.startswith("advisor.predictor_data"):
            return None
        rest = m[len("advisor."):]
        return "predictor" if rest.startswith("predictor") else rest

    deps: dict[str, set[str]] = {}
    for m, targets in edges.items():
        u = unit(m)
        if u is not None:
            deps.setdefault(u, set()).update(t for t in map(unit, targets) if t is not None and t != u)
    level: dict[str, int] = {}

    def depth(u: str) -> int:
        if u not in level:
            level[u] = 1 + max((depth(d) for d in deps.get(u, ())), default=-1)
        return level[u]

    out: dict[int, list[str]] = {}
    for u in deps:
        out.setdefault(depth(u), []).append(u)
    return {k: sorted(v) for k, v in sorted(out.items())}


def test_the_architectures_level_table_is_the_one_the_imports_give():
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = [line.split()[1:] for line in text.splitlines() if line.startswith("level ")]
    stated = {int(row[0]): sorted(row[1:]) for row in table}
    assert stated == advisor_levels(graph()[0]), "redraw docs/architecture.md's level table from the imports"


def test_the_tests_share_helpers_only():
    """A test file imports what it shares from tests/helpers.py, never from another test file or from
    conftest (whose fixtures pytest hands over by name); each sits in one of the four groups."""
    groups = {"unit", "cli", "e2e", "stored"}
    crossing = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        assert path.parent.name in groups and path.parent.parent == ROOT / "tests", path
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            crossing += [f"{path.name}: {n}" for n in names if n.split(".")[0].startswith("test_") or n == "conftest"]
    assert not crossing, crossing
