"""What every asset module shares: progress lines, the common metadata, small Markdown tables, the
parent-checkpoint lookup that turns a missing checkpoint into a Dagster failure with the fix, and the data
version of an asset's frame (`frame_data_version`, which `build_assets` attaches to every output)."""

from __future__ import annotations

import functools
import hashlib
import inspect
import logging
import time
import warnings
from typing import Any, Callable

import dagster as dg
import polars as pl

from spogw_dagster.executors.embedded import runtime_report
from spogw_dagster.pipeline.data.checkpoints import MissingCheckpointError, ParentCheckpoint, parent_checkpoint
from spogw_dagster.pipeline.data.storage import AssetStore
from spogw_dagster.pipeline.defs.versions import section_hash
from spogw_dagster.pipeline.settings import SpogwConfig

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


def executor_runtime_metadata() -> dict[str, Any]:
    """The embedded executor's llama.cpp build and the CPU features it uses (nothing for an endpoint)."""
    info = runtime_report()
    if not info:
        return {}
    feats = sorted({f for i in info for f in i.get("cpu_features_used", [])})
    return {"executor_runtime": dg.MetadataValue.json(info),
            "executor_cpu_features": dg.MetadataValue.text(" ".join(feats))}


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


# How a value was obtained, not what it is: a rerun served from the call cache, or reusing an identical
# training run, changes these and nothing else, so they stay out of the data version.
VOLATILE_COLUMNS = frozenset({"wall_s", "cached_calls", "train_seconds", "reused"})
VOLATILE_METRICS = frozenset({"cached_calls"})  # the same, as rows of a long-format report (`metric` column)


def frame_data_version(frame: pl.DataFrame) -> dg.DataVersion:
    """The frame's content as a Dagster data version: sha256 over its schema and row hashes, without the
    VOLATILE_COLUMNS/METRICS. A rerun that reproduces the same rows (same seeds, cache hits) gets the same
    version, so Dagster marks nothing downstream stale; any other change marks the downstream partitions stale.
    (Row hashes are polars' `hash_rows` with fixed seeds: stable within one polars version.)"""
    f = frame.drop([c for c in frame.columns if c in VOLATILE_COLUMNS])
    if "metric" in f.columns:
        f = f.filter(~pl.col("metric").is_in(sorted(VOLATILE_METRICS)))
    h = hashlib.sha256(repr([(c, str(t)) for c, t in f.schema.items()]).encode())
    h.update(f.height.to_bytes(8, "little"))
    if f.width and f.height:
        h.update(f.hash_rows(seed=0, seed_1=1, seed_2=2, seed_3=3).to_numpy().tobytes())
    return dg.DataVersion(h.hexdigest()[:24])


def reset_peak_rss() -> bool:
    """Reset this process's peak-RSS counter (Linux: `5` to /proc/self/clear_refs), so the next reading is the
    peak of what runs after it; False where the kernel does not offer it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_mb() -> float | None:
    """This process's peak resident set size in MiB since the last reset (VmHWM), None off Linux."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def versioned(compute: Callable[..., Any]) -> Callable[..., Any]:
    """`compute` returning `dg.Output(frame, data_version=<hash of the frame>)`. Dagster reads the parameters
    (names, the `context` annotation) through `functools.wraps`; the return annotation becomes
    `dg.Output[pl.DataFrame]`, as Dagster requires of a function that returns an Output. The step's peak
    resident memory (this process: models, trainer, frames; sandboxed children are capped by their cgroups)
    goes into the metadata as `peak_rss_mb`."""

    @functools.wraps(compute)
    def with_data_version(*args: Any, **kwargs: Any) -> Any:
        measured = reset_peak_rss()  # steps run one after another in one process: this step's own peak
        out = compute(*args, **kwargs)
        if isinstance(out, pl.DataFrame):
            peak = peak_rss_mb() if measured else None
            md = {"peak_rss_mb": dg.MetadataValue.float(peak)} if peak is not None else {}
            with warnings.catch_warnings():  # `data_version=` is marked beta in 1.13; it is what the UI reads
                warnings.simplefilter("ignore", dg.BetaWarning)
                return dg.Output(out, metadata=md, data_version=frame_data_version(out))
        return out

    returns = dg.Output[pl.DataFrame]
    with_data_version.__annotations__ = {**compute.__annotations__, "return": returns}
    with_data_version.__signature__ = inspect.signature(compute).replace(  # type: ignore[attr-defined]
        return_annotation=returns)
    return with_data_version
