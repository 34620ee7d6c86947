"""Each asset is said once: its own module (the `@dg.asset` function, and beside it the config sections it
reads), listed in `pipeline/defs/assets/__init__.py::ASSET_MODULES`. Everything else that names the assets
derives from that list: the loop's chain (`ASSET_NAMES`), its job, the comparison's job, the definitions, the
code versions and section hashes (`pipeline/defs/versions.py`), the catalog's tables (found from the files). A
new asset touches its module, one entry of that list and its test; these tests fail when an asset is added, or
listed, anywhere else."""

from __future__ import annotations

import ast
from pathlib import Path

import dagster as dg

from spogw_dagster.pipeline.defs import versions
from spogw_dagster.pipeline.defs.assets import (
    ASSET_MODULES,
    ASSET_NAMES,
    LOOP_MODULES,
    ON_DEMAND_ASSETS,
    ON_DEMAND_MODULES,
)
from spogw_dagster.pipeline.defs.sensors import JOB_NAME
from spogw_dagster.pipeline.defs.wiring import COMPARISON_JOB, build_definitions
from spogw_dagster.pipeline.settings import SpogwConfig, load_config

PKG = Path(versions.__file__).resolve().parents[2]  # spogw_dagster/
ASSETS_DIR = PKG / "pipeline" / "defs" / "assets"
NAMES = {m.NAME for m in ASSET_MODULES}


def decorated_assets(folder: Path) -> dict[str, str]:
    """{module name: function name} of every function decorated with `@dg.asset(...)` (or `@asset`) in `folder`."""
    found = {}
    for path in sorted(folder.glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and any(
                    ast.unparse(d.func if isinstance(d, ast.Call) else d) in ("dg.asset", "asset", "dagster.asset")
                    for d in node.decorator_list):
                found[path.stem] = node.name
    return found


def asset_name_lists(root: Path, names: set[str]) -> list[str]:
    """Literal tuples, lists, sets and dict keys naming two or more assets, outside the assets package."""
    out = []
    for path in sorted(root.rglob("*.py")):
        if path.is_relative_to(root / "pipeline" / "defs" / "assets"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            elts = (node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set))
                    else node.keys if isinstance(node, ast.Dict) else [])
            listed = {e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)} & names
            if len(listed) >= 2:
                out.append(f"{path.relative_to(root)}:{node.lineno} {sorted(listed)}")
    return out


def test_every_decorated_asset_is_a_module_of_the_one_list():
    listed = {m.__name__.rpartition(".")[2]: m.NAME for m in ASSET_MODULES}
    assert decorated_assets(ASSETS_DIR) == listed, "add the asset's module to ASSET_MODULES (assets/__init__.py)"
    assert all(stem == name for stem, name in listed.items())  # the module is named after its asset
    assert ASSET_MODULES == LOOP_MODULES + ON_DEMAND_MODULES and len(set(ASSET_MODULES)) == len(ASSET_MODULES)


def test_no_other_module_lists_the_assets(tmp_path):
    assert asset_name_lists(PKG, NAMES) == []
    # the checker finds a planted hand-kept list
    (tmp_path / "pkg" / "pipeline" / "data").mkdir(parents=True)
    (tmp_path / "pkg" / "pipeline" / "data" / "storage.py").write_text('TABLES = ("screened_groups", "lora_checkpoint")\n')
    assert asset_name_lists(tmp_path / "pkg", NAMES) == ["pipeline/data/storage.py:1 ['lora_checkpoint', 'screened_groups']"]


def test_the_derived_lists_equal_the_modules(tmp_path):
    assert ASSET_NAMES == tuple(m.NAME for m in LOOP_MODULES)
    assert ON_DEMAND_ASSETS == tuple(m.NAME for m in ON_DEMAND_MODULES)
    defs = build_definitions("ci", assets_dir=tmp_path)
    graph = defs.resolve_asset_graph()
    assert {k.to_user_string() for k in graph.get_all_asset_keys()} == NAMES
    for job, names in ((JOB_NAME, ASSET_NAMES), (COMPARISON_JOB, ON_DEMAND_ASSETS)):
        selected = defs.resolve_job_def(job).asset_layer.executable_asset_keys
        assert {k.to_user_string() for k in selected} == set(names), job
    for m in ASSET_MODULES:
        assert graph.get(dg.AssetKey(m.NAME)).code_version == versions.code_version(m.NAME, load_config("ci"))


def test_each_module_declares_the_sections_it_reads_and_versions_reads_the_same():
    sections = set(SpogwConfig.model_fields)
    for m in ASSET_MODULES:
        when_on = getattr(m, "SECTIONS_WHEN_ON", {})
        assert versions.declared_sections(m.NAME) == (m.SECTIONS, when_on), m.NAME
        assert set(m.SECTIONS) <= sections and all(set(v) <= sections for v in when_on.values()), m.NAME
        assert all(hasattr(getattr(SpogwConfig(), s), "enabled") for s in when_on), m.NAME  # a switchable section
