"""The layer contract (ARCHITECTURE.md "Layers"): imports point one way, function-local imports counted.

    cli, definitions                  entry points: may import anything
    pipeline.runs                     run control (`spogw run`, the CLI's commands)
    pipeline.defs                     the Dagster definitions: assets, checks, sensors, resources, executors
    pipeline.domain                   domain logic: generation, held-out scoring, W4S's turns, evaluation jobs
    pipeline.data                     tables, storage, catalog, checkpoints, locks
    pipeline.settings, .profiles      configuration
    everything else                   the pure core: core, workflow, executors, benchmarks, sandboxing, ...

A module may import its own layer or any layer below it, never one above; only `pipeline.defs` and
`pipeline.runs` (and the entry points) may import Dagster; and assets are leaves: no module imports an asset
module (`pipeline/defs/assets/<asset>.py`) but the package that wires them. The checker is tested on planted
violations."""

from __future__ import annotations

import ast
from pathlib import Path

from test_import_cycles import PACKAGE, module_graph

RANKS = {"runs": 5, "defs": 4, "domain": 3, "data": 2, "settings": 1, "profiles": 1}
ENTRY_POINTS = {"cli", "definitions"}
DAGSTER_LAYERS = {"runs", "defs"}
ASSETS = "spogw_dagster.pipeline.defs.assets"
ASSET_HELPERS = {"common", "report_metadata"}  # shared by the asset modules, not assets


def layer(module: str) -> tuple[str, int]:
    """(layer name, rank) of a dotted module name of the package."""
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in ENTRY_POINTS:
        return "entry", 99
    if len(parts) > 2 and parts[1] == "pipeline" and parts[2] in RANKS:
        return parts[2], RANKS[parts[2]]
    if len(parts) > 1 and parts[1] == "pipeline":
        return "pipeline", 1  # pipeline/__init__: a docstring
    return "core", 0


def imports_dagster(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        if any(n == "dagster" or n.startswith(("dagster.", "dagster_")) for n in names):
            return True
    return False


def violations(root: Path) -> list[str]:
    """Every import that points up a layer, into an asset module, or of Dagster outside the layers allowed one."""
    out = []
    graph = module_graph(root)
    for mod, deps in sorted(graph.items()):
        name, rank = layer(mod)
        for dep in sorted(deps):
            dname, drank = layer(dep)
            if drank > rank:
                out.append(f"{mod} ({name}) imports {dep} ({dname}), a layer above it")
    for mod, deps in sorted(graph.items()):
        for dep in sorted(deps):
            parts = dep.split(".")
            if (dep.startswith(ASSETS + ".") and len(parts) == 5 and parts[-1] not in ASSET_HELPERS
                    and mod != ASSETS):
                out.append(f"{mod} imports the asset module {dep}: assets are leaves")
    for path in sorted(root.rglob("*.py")):
        mod = ".".join(path.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__")
        name, _ = layer(mod)
        if name not in DAGSTER_LAYERS | {"entry"} and imports_dagster(path):
            out.append(f"{mod} ({name}) imports Dagster; only pipeline.defs and pipeline.runs may")
    return out


def test_the_package_keeps_its_layers():
    assert violations(PACKAGE) == []


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / "spogw_dagster" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root / "spogw_dagster"


def test_the_checker_finds_a_planted_back_import_and_a_dagster_import(tmp_path):
    base = {"__init__.py": "", "pipeline/__init__.py": "", "pipeline/data/__init__.py": "",
            "pipeline/domain/__init__.py": "", "pipeline/defs/__init__.py": "", "core/__init__.py": "",
            "core/curation.py": "import math\n",
            "pipeline/defs/partitions.py": "import dagster as dg\nfrom spogw_dagster.pipeline.data import tables\n",
            "pipeline/data/tables.py": "from spogw_dagster.core import curation\n"}
    clean = _write(tmp_path / "clean", base)
    assert violations(clean) == []  # down the layers and Dagster in defs: allowed
    planted = _write(tmp_path / "planted", {
        **base,
        # a function-local back-import (data -> defs) and Dagster in the domain layer
        "pipeline/data/checkpoints.py": "def f():\n    from spogw_dagster.pipeline.defs.partitions import x\n",
        "pipeline/domain/heldout.py": "import dagster as dg\n",
        "core/training/objectives.py": "from spogw_dagster.pipeline.data import tables\n",
        "pipeline/defs/assets/__init__.py": "from spogw_dagster.pipeline.defs.assets import a, b\n",
        "pipeline/defs/assets/common.py": "",
        "pipeline/defs/assets/a.py": "from spogw_dagster.pipeline.defs.assets.common import x\n",
        "pipeline/defs/assets/b.py": "from spogw_dagster.pipeline.defs.assets.a import helper\n"})
    found = violations(planted)
    assert any("pipeline.data.checkpoints (data) imports spogw_dagster.pipeline.defs.partitions" in v for v in found)
    assert any("pipeline.domain.heldout (domain) imports Dagster" in v for v in found)
    assert any("core.training.objectives (core) imports spogw_dagster.pipeline.data.tables" in v for v in found)
    assert any("pipeline.defs.assets.b imports the asset module spogw_dagster.pipeline.defs.assets.a" in v
               for v in found)
    assert len(found) == 4  # the wiring package and the shared helpers are no violation


IMPORT_LINE = ("from ", "import ")


def _own(node: ast.AST, package: str) -> bool:
    """Does this import statement import a module of `package`?"""
    if isinstance(node, ast.Import):
        return any(a.name == package or a.name.startswith(package + ".") for a in node.names)
    if isinstance(node, ast.ImportFrom):
        mod = node.module or ""
        return bool(node.level) or mod == package or mod.startswith(package + ".")
    return False


def uncommented_local_imports(root: Path) -> list[str]:
    """Function-local imports of the package's own modules that give no reason: a `# lazy: <why>` comment on the
    import, or on the line above its block of imports (ARCHITECTURE.md, "Imports")."""
    out = set()
    for path in sorted(root.rglob("*.py")):
        lines = path.read_text().splitlines()
        for fn in ast.walk(ast.parse("\n".join(lines), str(path))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if not _own(node, root.name):
                    continue
                first = node.lineno
                while first > 1 and lines[first - 2].lstrip().startswith(IMPORT_LINE):
                    first -= 1
                said = lines[first - 2:node.end_lineno] if first > 1 else lines[first - 1:node.end_lineno]
                if not any("# lazy:" in ln for ln in said):
                    out.add(f"{path.relative_to(root.parent)}:{node.lineno}")
    return sorted(out)


def test_every_function_local_import_of_the_package_says_why():
    assert uncommented_local_imports(PACKAGE) == []


def test_the_reason_checker_finds_a_planted_silent_local_import(tmp_path):
    root = _write(tmp_path, {
        "__init__.py": "",
        "a.py": ("def f():\n    # lazy: a reason\n    from spogw_dagster.b import x\n    from spogw_dagster.c import y\n"
                 "def g():\n    from .b import z  # lazy: a reason\n"
                 "def h():\n    import json\n"),  # the standard library: not the package's layering
        "b.py": ("def k():\n    x = 1\n    from spogw_dagster.a import f\n"
                 "def m():\n    # a comment that gives no reason\n    import spogw_dagster.a\n"
                 "def n():\n    def inner():\n        from spogw_dagster import a\n")})
    assert uncommented_local_imports(root) == ["spogw_dagster/b.py:3", "spogw_dagster/b.py:6", "spogw_dagster/b.py:9"]
