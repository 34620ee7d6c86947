"""What every asset module shares: progress lines, the common metadata, small Markdown tables, and the
parent-checkpoint lookup that turns a missing checkpoint into a Dagster failure with the fix."""

from __future__ import annotations

import logging
import time
from typing import Any

import dagster as dg

from ..settings import SpogwConfig, section_hash
from ..lineage import MissingCheckpointError, ParentCheckpoint, parent_checkpoint
from ..storage import AssetStore

# Progress lines for terminals (`spogw run` prints this logger); the same text goes to the Dagster event log.
PROGRESS = logging.getLogger("spogw.progress")


def say(context: dg.AssetExecutionContext, msg: str) -> None:
    context.log.info(msg)
    asset = context.assets_def.key.to_user_string()
    PROGRESS.info("[%s] %-17s %s", context.partition_key, asset, msg)


def common_metadata(cfg: SpogwConfig, asset: str, t0: float) -> dict[str, Any]:
    """Config hashes, profile and wall time: on every asset's materialization."""
    return {
        "config_hash": dg.MetadataValue.text(cfg.hash),
        "config_section_hash": dg.MetadataValue.text(section_hash(cfg, asset)[:16]),
        "profile": dg.MetadataValue.text(cfg.profile),
        "wall_s": dg.MetadataValue.float(round(time.monotonic() - t0, 2)),
    }


def md_table(rows: dict[str, Any], head: tuple[str, str] = ("", "count")) -> dg.MetadataValue:
    lines = [f"| {head[0]} | {head[1]} |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows.items()]
    return dg.MetadataValue.md("\n".join(lines))


def ints(counts: dict[str, int]) -> dict[str, dg.MetadataValue]:
    return {k: dg.MetadataValue.int(int(v)) for k, v in counts.items()}


def parent_or_fail(store: AssetStore, key: str) -> ParentCheckpoint | None:
    """lora_checkpoint(k-1) (None at k = 0); a missing one fails the step without retries, saying what to run."""
    try:
        return parent_checkpoint(store, key)
    except MissingCheckpointError as e:
        raise dg.Failure(description=str(e), allow_retries=False) from None
