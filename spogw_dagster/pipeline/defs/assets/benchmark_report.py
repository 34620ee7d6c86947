"""benchmark_report(k): held-out valid / executes / trivial rates, mean reward and answer score of checkpoint
k beside π_{k-1} (the base model at k = 0) and static baselines, greedy and over k samples per query, with 95%
intervals and the paired difference to π_{k-1} on the same queries and seeds (see `heldout.py` for the seeds).
Long format: one row per system, mode and metric; the per-sample rows go to `heldout_results`."""

import time
from typing import Any

import dagster as dg
import polars as pl

from spogw_dagster.adapter_files import ADAPTER_WEIGHTS
from spogw_dagster.pipeline.data import heldout_results, report_stats
from spogw_dagster.pipeline.data.checkpoints import adapter_sha256, weights_mismatch
from spogw_dagster.pipeline.defs import failures
from spogw_dagster.pipeline.defs.assets.common import (
    common_metadata,
    executor_runtime_metadata,
    parent_or_fail,
    say,
    versioned,
)
from spogw_dagster.pipeline.defs.assets.report_metadata import pareto_metadata, report_metadata
from spogw_dagster.pipeline.defs.partitions import iterations, key_to_int
from spogw_dagster.pipeline.defs.resources import PipelineResource
from spogw_dagster.pipeline.domain import heldout as ho

NAME = "benchmark_report"
GROUP = "evaluation"
KINDS = {"python", "parquet"}
DESCRIPTION = ("Held-out metrics of checkpoint k beside π_{k-1} (base at k = 0) and static baselines (IO, CoT, "
               "CoT-SC): valid, executes and trivial rates, mean ladder reward and answer score with 95% intervals, "
               "greedy and over k samples per query, and the paired difference to π_{k-1} on the same queries and "
               "seeds (long format: one row per system, mode and metric; per-sample rows in heldout_results).")
# The config sections it reads (its code version and `config_section_hash` cover them).
SECTIONS = ("benchmark", "generator", "executor", "execution", "reward", "report")


@dg.asset(group_name=GROUP, description=DESCRIPTION, kinds=KINDS, partitions_def=iterations,
          io_manager_key="io_manager")
@versioned
def benchmark_report(context: dg.AssetExecutionContext, pipeline: PipelineResource, lora_checkpoint: pl.DataFrame) -> pl.DataFrame:
    t0 = time.monotonic()
    cfg = pipeline.config()
    key = context.partition_key
    k = key_to_int(key)
    store = pipeline.store()
    with failures.as_failure():
        problems, split_info = ho.heldout_problems(cfg)
    this, prev, reused_prev = _policies(pipeline, key, lora_checkpoint.row(0, named=True), cfg,
                                        per_policy=len(problems) * sum(n for _, n, _ in ho.modes(cfg)))
    if reused_prev is not None:
        say(context, f"{prev.system} reused from benchmark_report[{prev.checkpoint_iteration:04d}] (same adapter and config)")
    scored = ho.score(pipeline, [this] if reused_prev is not None else [this, prev], problems, cfg, iteration=k,
                      split=cfg.report.split, reused=[reused_prev] if reused_prev is not None else [],
                      say=lambda m: say(context, m))
    failures.fail_on_outage(cfg, scored.executed, scored.counters, asset=NAME, partition_key=key,
                          cache_path=pipeline.cache_path())
    side = heldout_results.write(store, key, scored.heldout)
    report = report_stats.summarize_heldout(scored.heldout, iteration=k, config_hash=cfg.hash,
                                      split_ids_sha256=split_info["ids_sha256"],
                                      resamples=cfg.report.bootstrap_resamples, seed=cfg.report.seed)
    context.add_output_metadata({
        **common_metadata(cfg, NAME, t0),
        **report_metadata(store, key, report, split_info, prev.system, reused_prev is not None),
        **pareto_metadata(scored.heldout),
        "executor_new_calls": dg.MetadataValue.int(scored.counters["new_calls"]),
        "executor_cache_hits": dg.MetadataValue.int(scored.counters["cache_hits"]),
        "baselines_from_cache": dg.MetadataValue.json(scored.baselines_cached),
        "generation_s": dg.MetadataValue.float(scored.generation_s),
        "executor_time": dg.MetadataValue.json(scored.time_split),
        "heldout_results": dg.MetadataValue.path(str(side)),
        "isolation": dg.MetadataValue.text(pipeline.isolation().name),
        **executor_runtime_metadata(),
    })
    say(context, _headline(report, this.system, prev.system) + f"; {time.monotonic() - t0:.1f} s")
    return report


def _policies(pipeline: PipelineResource, key: str, ckpt: dict[str, Any], cfg, *, per_policy: int):
    """Checkpoint k, π_{k-1}, and π_{k-1}'s rows from the previous report when they can be reused (same adapter,
    config and sample count), else None."""
    adapter = pipeline.store().adapter_dir(key)  # this assets directory's, wherever the row says it was written
    if not (adapter / ADAPTER_WEIGHTS).is_file():
        raise dg.Failure(f"lora_checkpoint[{key}] points at {adapter}, which holds no adapter; "
                         f"rematerialize lora_checkpoint for {key}")
    sha = adapter_sha256(adapter)
    damaged = weights_mismatch(adapter, sha, ckpt.get("adapter_sha256"), key)
    if damaged:
        raise dg.Failure(f"{damaged}: not scoring it. Rematerialize lora_checkpoint[{key}] (`spogw run` does, "
                         "resuming at it), or restore the folder from a backup.", allow_retries=False)
    store = pipeline.store()
    parent = parent_or_fail(store, key)
    k = key_to_int(key)
    this = ho.Policy(f"spogw@{key}", "checkpoint", adapter, k, sha)
    prev = ho.previous_policy(parent)
    if parent is None:
        return this, prev, None
    stored = heldout_results.read_reusable(store, parent.partition)
    reused = None if stored is None else report_stats.reusable_previous(*stored, prev.system, parent.sha256, cfg.hash, k,
                                                                  per_policy)
    return this, prev, reused


def _headline(report: pl.DataFrame, system: str, prev_system: str) -> str:
    ans = report_stats.metric_row(report, "checkpoint", "answer_score")
    val = report_stats.metric_row(report, "checkpoint", "valid_rate")
    line = f"{system} ({val['mode']}): valid {val['value']:.3f}, answer {ans['value']:.3f}"
    if ans["diff_vs_prev"] is not None:
        line += (f", Δ answer vs {prev_system} {ans['diff_vs_prev']:+.3f} [{ans['diff_ci_low']:+.3f}, "
                 f"{ans['diff_ci_high']:+.3f}]")
    return line
