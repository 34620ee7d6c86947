"""Executing and scoring workflows: each job a workflow (or its parse rejection) for one problem, run in the
sandbox against the executor with bounded concurrency. No Dagster: the assets, the held-out report and W4S's
turns call it with the services a `PipelineResource` built."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Sequence

import polars as pl

from spogw_dagster.contracts import Problem, Status
from spogw_dagster.evaluation import EvalResult, evaluate_workflow
from spogw_dagster.pipeline.data.tables import ANCHOR_FINISH
from spogw_dagster.pipeline.domain.errors import StaleInputError
from spogw_dagster.pipeline.settings import SpogwConfig
from spogw_dagster.workflow.operators import CODE_STOP, OperatorConfig
from spogw_dagster.workflow.runtime import DEFAULT_LIMITS

__all__ = ["EvalJob", "evaluate_jobs", "jobs_for"]


@dataclass
class EvalJob:
    """One workflow to execute: `code` (validated) or a parse rejection (`reject_status`, `reject_reason`)."""

    problem: Problem
    code: str | None
    reject_status: str = ""
    reject_reason: str = ""
    tag: Any = None
    runs: int | None = None  # executor runs averaged for this job (None: evaluate_jobs' runs)


def operator_config(cfg: SpogwConfig) -> OperatorConfig:
    """The operators' executor sampling and call budgets of a config (what its runs' call cache is keyed by)."""
    e = cfg.executor
    return OperatorConfig(temperature=e.temperature, top_p=e.top_p, max_tokens=e.max_tokens,
                          max_operator_calls=e.max_operator_calls, max_llm_calls=e.max_llm_calls,
                          code_stop=CODE_STOP if e.stop_after_code else ())


def run_limits(cfg: SpogwConfig):
    return DEFAULT_LIMITS.with_(wall_s=cfg.execution.wall_s)


async def evaluate_jobs(jobs: Sequence[EvalJob], executor, iso, cfg: SpogwConfig, *, seed: int,
                        runs: int | None = None) -> list:
    """Execute and score every job with bounded concurrency, each the mean of its own `EvalJob.runs`, else `runs`
    executor runs (None: `execution.runs`); rejected jobs score 0 without running."""

    op_cfg, limits = operator_config(cfg), run_limits(cfg)
    sem = asyncio.Semaphore(cfg.execution.concurrency)
    runs = cfg.execution.runs if runs is None else int(runs)

    async def one(j: EvalJob):
        if j.code is None:
            return EvalResult(j.problem.benchmark, j.problem.id, Status(j.reject_status), 0.0,
                              error=j.reject_reason, isolation=iso.name)
        async with sem:
            return await evaluate_workflow(j.code, j.problem, executor, iso, runs=j.runs or runs, seed=seed,
                                           op_cfg=op_cfg, limits=limits)

    return list(await asyncio.gather(*(one(j) for j in jobs)))


def jobs_for(sampled: pl.DataFrame, problems: dict, key: str, anchor_runs: int | None = None) -> list[EvalJob]:
    """One job per sampled row; unparsed rows go through as their parse status (scored, never executed). An
    anchor row (one of the prompt's own workflows) runs `anchor_runs` times where that is set."""
    unknown = sorted(set(sampled["query_id"].to_list()) - set(problems))
    if unknown:
        raise StaleInputError(f"sampled_workflows[{key}] has queries not in the configured training set "
                              f"({unknown[:3]}); the config changed since sampling: rematerialize sampled_workflows")
    jobs = []
    for r in sampled.iter_rows(named=True):
        ok = r["parse_status"] == "ok"
        jobs.append(EvalJob(problems[r["query_id"]], r["workflow"] if ok else None,
                            "" if ok else r["parse_status"], "" if ok else r["parse_error"],
                            tag=(r["query_id"], r["sample_idx"], r["parse_status"]),
                            runs=anchor_runs if r.get("finish_reason") == ANCHOR_FINISH else None))
    return jobs
