"""No import cycle between the package's modules, counting imports inside functions: a cycle hidden behind a
function-local import still means two modules that cannot be understood (or changed) one without the other.

`from package import name` depends on the module `package.name` when there is one, else on the package."""

from __future__ import annotations

import ast
from pathlib import Path

import spogw_dagster

PACKAGE = Path(spogw_dagster.__file__).parent


def module_graph(root: Path) -> dict[str, set[str]]:
    """{module: the package's modules it imports anywhere in its file} for the package at `root`."""
    prefix = root.name
    files = {}
    for p in root.rglob("*.py"):
        parts = list(p.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        files[".".join(parts)] = p
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        pkg = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = ".".join((pkg[: len(pkg) - node.level + 1] if node.level else [])
                                + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            for t in targets:
                while t and t not in files:
                    t = t.rpartition(".")[0]
                if t and t != mod and t.split(".")[0] == prefix:
                    deps.add(t)
        graph[mod] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_check_finds_a_cycle_hidden_in_a_function(tmp_path):
    pkg = tmp_path / "toy"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..a import g\n    return g\n")
    (pkg / "c.py").write_text("import toy.a\n")
    graph = module_graph(pkg)
    assert graph["toy.a"] == {"toy.sub.b"} and graph["toy.sub.b"] == {"toy.a"} and graph["toy.c"] == {"toy.a"}
    assert cycles(graph) == [["toy.a", "toy.sub.b"]]


def test_the_package_has_no_import_cycle():
    graph = module_graph(PACKAGE)
    assert len(graph) > 50
    assert cycles(graph) == []
