"""Build the Dagster `Definitions` of the pipeline for one configuration and assets directory.

`spogw_dagster.definitions` (the code location `workspace.yaml` points at) calls `definitions_from_env()`:
SPOGW_PROFILE (default tiny) or SPOGW_CONFIG (a YAML file), and SPOGW_ASSETS_DIR (default ./assets).
Steps run in-process one after another (`in_process_executor`): the assets load models and are chained
anyway, and on a small CPU machine one process per step would only add start-up time. The executor holds the
assets directory's lock for the whole run (`run_executors.locking_in_process_executor`), so runs launched from the UI,
a backfill or the sensor on one assets directory go one at a time, in iteration order, whatever the instance's
configuration.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

import dagster as dg

from spogw_dagster.pipeline.data.storage import default_assets_dir
from spogw_dagster.pipeline.defs.assets import ASSET_NAMES, ON_DEMAND_ASSETS, build_assets
from spogw_dagster.pipeline.defs.checks import ALL_CHECKS
from spogw_dagster.pipeline.defs.io_manager import ParquetIOManager
from spogw_dagster.pipeline.defs.resources import PipelineResource
from spogw_dagster.pipeline.defs.run_executors import locking_in_process_executor
from spogw_dagster.pipeline.defs.sensors import JOB_NAME, build_sensor
from spogw_dagster.pipeline.defs.step_executor import step_executor
from spogw_dagster.pipeline.settings import SpogwConfig, load_config

COMPARISON_JOB = "objective_comparison_job"


def build_definitions(
    profile: str | None = None,
    config_file: str | os.PathLike[str] | None = None,
    assets_dir: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    *,
    config: SpogwConfig | None = None,
) -> dg.Definitions:
    """Definitions for a profile / YAML file / overrides, or for an already loaded `config` (then the others
    are ignored: `spogw run` loads once and passes it)."""
    cfg: SpogwConfig = config if config is not None else load_config(profile, config_file, overrides)
    root = Path(assets_dir).expanduser().resolve() if assets_dir else default_assets_dir()
    assets = build_assets(cfg)
    job = dg.define_asset_job(
        JOB_NAME, selection=dg.AssetSelection.assets(*ASSET_NAMES),
        description="One SPOGW iteration: sample, execute, screen, sharpen, train, report (with checks).",
        tags={"spogw/loop": "iteration", "spogw/profile": cfg.profile, "spogw/config_hash": cfg.hash[:16]},
    )
    comparison = dg.define_asset_job(
        COMPARISON_JOB, selection=dg.AssetSelection.assets(*ON_DEMAND_ASSETS),
        description="The methods of comparison.methods side by side on one iteration's data (needs the "
                    "iteration's report).", tags={"spogw/profile": cfg.profile})
    pipeline = PipelineResource.from_config(cfg, root)
    return dg.Definitions(
        assets=assets,
        asset_checks=ALL_CHECKS,
        jobs=[job, comparison],
        sensors=[build_sensor(job, cfg.iterations, cfg.hash, running=cfg.loop.sensor)],
        resources={"pipeline": pipeline, "io_manager": ParquetIOManager(assets_dir=str(root))},
        # SPOGW_STEP_EXECUTOR=docker: each step in its own container (step_executor.py), under the same lock
        executor=step_executor(root) or locking_in_process_executor(root),
    )


def definitions_from_env() -> dg.Definitions:
    cfg_file = os.environ.get("SPOGW_CONFIG") or None
    profile = os.environ.get("SPOGW_PROFILE") or (None if cfg_file else "tiny")
    return build_definitions(profile, cfg_file, os.environ.get("SPOGW_ASSETS_DIR") or None)
