"""execution_scores(k): every sampled workflow executed R times in the sandbox against the executor and
scored (reward ladder + benchmark metric); executor calls go through the persistent call cache.

An executor outage fails the asset (`domain/outage.py`: over `execution.max_executor_error_rate` of the executed
workflows, parse rejections never call the executor). Below the threshold the rows are written with their
`executor_error` status and curation treats them as unscored."""

import asyncio
import time
from collections import Counter
from typing import Any

import dagster as dg
import polars as pl

from spogw_dagster.core.curation import NOT_VALID_STATUSES
from spogw_dagster.pipeline.data import report_stats, tables
from spogw_dagster.pipeline.defs import failures
from spogw_dagster.pipeline.defs.assets.common import (
    common_metadata,
    executor_runtime_metadata,
    md_table,
    say,
    versioned,
)
from spogw_dagster.pipeline.defs.partitions import iterations, key_to_int
from spogw_dagster.pipeline.defs.plots import score_histogram
from spogw_dagster.pipeline.defs.resources import PipelineResource
from spogw_dagster.pipeline.domain.anchors import ANCHOR_FINISH
from spogw_dagster.pipeline.domain.jobs import evaluate_jobs, jobs_for
from spogw_dagster.pipeline.domain.outage import executed_rows

NAME = "execution_scores"
GROUP = "execution"
KINDS = {"python", "parquet"}
DESCRIPTION = ("Every sampled workflow executed R times in the sandbox against the executor and scored (reward "
               "ladder + benchmark metric); executor calls go through the call cache.")
# The config sections it reads (its code version and `config_section_hash` cover them).
SECTIONS = ("benchmark", "executor", "execution", "reward")


@dg.asset(group_name=GROUP, description=DESCRIPTION, kinds=KINDS, partitions_def=iterations,
          io_manager_key="io_manager")
@versioned
def execution_scores(context: dg.AssetExecutionContext, pipeline: PipelineResource, sampled_workflows: pl.DataFrame) -> pl.DataFrame:
    t0 = time.monotonic()
    cfg = pipeline.config()
    k = key_to_int(context.partition_key)
    with failures.as_failure():
        jobs = jobs_for(sampled_workflows, {p.id: p for p in pipeline.train_queries()}, context.partition_key,
                        anchor_runs=cfg.execution.anchor_runs)
    iso = pipeline.isolation()

    async def run():
        async with pipeline.executor() as ex:
            res = await evaluate_jobs(jobs, ex.executor, iso, cfg, seed=cfg.execution.seed)
            return res, {**ex.counters(), "failed_calls": int(getattr(ex.executor, "failures", 0))}, ex.model, \
                ex.time_split()

    say(context, f"executing {len(jobs)} workflows ({sum(j.code is not None for j in jobs)} valid), "
                 f"isolation={iso.name}")
    results, counters, executor_model, time_split = asyncio.run(run())
    ladder = cfg.reward.core()
    df = tables.execution_frame(
        tables.execution_row(k, j.tag[0], j.tag[1], j.tag[2], r, ladder, workflow=j.code) for j, r in zip(jobs, results))
    failures.fail_on_outage(cfg, executed_rows(df), counters, asset=NAME,
                            partition_key=context.partition_key, cache_path=pipeline.cache_path())
    context.add_output_metadata({
        **common_metadata(cfg, NAME, t0), **_metadata(df, k, counters),
        **_sampled_metadata(df, sampled_workflows),
        "executor": dg.MetadataValue.text(executor_model),
        "isolation": dg.MetadataValue.text(iso.name),
        "executor_time": dg.MetadataValue.json(time_split),
        "reward_ladder": dg.MetadataValue.json(cfg.reward.model_dump()),
        **executor_runtime_metadata(),
    })
    say(context, f"status {dict(Counter(df['status'].to_list()))}, mean reward {float(df['score'].mean() or 0):.3f}, "
                 f"executor calls {counters['new_calls']} new / {counters['cache_hits']} cached, "
                 f"{time.monotonic() - t0:.1f} s")
    return df


def _sampled_metadata(df: pl.DataFrame, sampled: pl.DataFrame) -> dict[str, Any]:
    """The policy's own samples apart from `generator.anchors`' rows: the means above count both, and anchors
    (the prompt's fixed workflows) would otherwise pass for what the policy writes."""
    anchors = sampled.filter(pl.col("finish_reason") == ANCHOR_FINISH).select("query_id", "sample_idx")
    own = df.join(anchors, on=["query_id", "sample_idx"], how="anti")
    return {
        "anchor_rows": dg.MetadataValue.int(df.height - own.height),
        "sampled_mean_answer_score": dg.MetadataValue.float(round(float(own["answer_score"].mean() or 0.0), 4)),
        "sampled_valid_rate": dg.MetadataValue.float(
            round(float((~own["status"].is_in(NOT_VALID_STATUSES)).mean()), 4) if own.height else 0.0),
    }


def _metadata(df: pl.DataFrame, k: int, counters: dict[str, int]) -> dict[str, Any]:
    statuses = dict(Counter(df["status"].to_list()))
    by_status = {s: df.filter(pl.col("status") == s)["score"].to_list() for s in statuses}
    return {
        "status": md_table(statuses, ("status", "workflows")),
        "mean_score": dg.MetadataValue.float(round(float(df["score"].mean() or 0.0), 4)),
        "mean_answer_score": dg.MetadataValue.float(round(float(df["answer_score"].mean() or 0.0), 4)),
        "score_distribution": dg.MetadataValue.json(report_stats.score_distribution(df["score"].to_list())),
        "score_histogram": dg.MetadataValue.md(score_histogram(by_status, f"iteration {k}: rewards by status")),
        "executor_calls": dg.MetadataValue.int(int(df["llm_calls"].sum())),
        "executor_new_calls": dg.MetadataValue.int(counters["new_calls"]),
        "executor_cache_hits": dg.MetadataValue.int(counters["cache_hits"]),
        "executor_uncacheable_calls": dg.MetadataValue.int(counters["uncacheable_calls"]),
        "completion_tokens": dg.MetadataValue.int(int(df["completion_tokens"].sum())),
        # executor failures charged to the request that caused them (a control request succeeded), and the
        # runs that tripped a bug of ours (runtime_error, see the no_internal_errors check)
        "executor_request_faults": dg.MetadataValue.int(counters.get("request_faults", 0)),
        "executor_control_requests": dg.MetadataValue.int(counters.get("control_requests", 0)),
        "internal_errors": dg.MetadataValue.int(tables.internal_error_rows(df).height),
    }
