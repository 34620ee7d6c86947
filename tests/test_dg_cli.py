"""The project as the `dg` CLI sees it ([tool.dg] in pyproject.toml): `dg list defs` from the repo root loads the
same code location as `dagster dev` through workspace.yaml (spogw_dagster.definitions, object `defs`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from spogw_dagster.pipeline.defs.assets import ASSET_NAMES

REPO = Path(__file__).resolve().parent.parent
DG = shutil.which("dg", path=str(Path(sys.executable).parent)) or shutil.which("dg")


@pytest.mark.skipif(DG is None, reason="the dg CLI (dagster-dg-cli) is not installed: pip install -e .")
def test_dg_list_defs_lists_the_six_assets_and_the_sensor(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("SPOGW_CONFIG", "DAGSTER_HOME")}
    env.update(SPOGW_PROFILE="ci", SPOGW_ASSETS_DIR=str(tmp_path), DAGSTER_HOME=str(tmp_path / ".dagster"))
    (tmp_path / ".dagster").mkdir()
    p = subprocess.run([DG, "list", "defs", "--json"], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    defs = json.loads(p.stdout)
    keys = {a["asset_key"] for a in defs["assets"]}
    assert set(ASSET_NAMES) <= keys, keys
    assert {a["asset_key"]: a["group_name"] for a in defs["assets"] if a["asset_key"] in ASSET_NAMES} == {
        "sampled_workflows": "sampling", "execution_scores": "execution", "screened_groups": "curation",
        "sharpened_groups": "curation", "lora_checkpoint": "training", "benchmark_report": "evaluation"}
    assert "next_iteration_sensor" in {s["name"] for s in defs["sensors"]}
    assert "spogw_iteration" in {j["name"] for j in defs["jobs"]}
    assert "SupersessionWarning" not in p.stderr
