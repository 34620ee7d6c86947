"""An executor outage fails the step that saw it, instead of turning into scores.

Every asset that executes workflows (execution_scores, benchmark_report, objective_comparison) calls
`check_outage` on the rows it executed just now: when the share of them whose status is `executor_error`
exceeds `execution.max_executor_error_rate`, it raises `ExecutorOutage` naming the endpoint and the fix (the
asset turns it into `dg.Failure`: `defs/failures.py`), and the step writes nothing (a dead executor's rows are not the workflows' scores, and a report over them would compare
outages, not policies). The calls that succeeded are already in the call cache, which stores successes only,
so the rematerialization after the endpoint is back makes only the missing calls."""

from __future__ import annotations

import polars as pl

from spogw_dagster.pipeline.domain.errors import ExecutorOutage

__all__ = ["ExecutorOutage", "check_outage", "executed_rows", "executor_error_share", "executed_error_share"]


def executor_error_share(executed: pl.DataFrame) -> tuple[int, int, float]:
    """(executor_error rows, rows, their ratio) of rows that reached the executor."""
    errors = executed.filter(pl.col("status") == "executor_error").height
    return errors, executed.height, (errors / executed.height if executed.height else 0.0)


def executed_rows(scores: pl.DataFrame) -> pl.DataFrame:
    """The rows of an execution_scores frame that reached the executor (runs > 0: a workflow rejected by the
    validator never did): what `check_outage` judges."""
    return scores.filter(pl.col("runs") > 0)


def executed_error_share(scores: pl.DataFrame) -> tuple[int, int, float]:
    """`executor_error_share` of an execution_scores frame's `executed_rows`."""
    return executor_error_share(executed_rows(scores))


def check_outage(cfg, executed: pl.DataFrame, counters: dict[str, int], *, asset: str, partition_key: str,
                 cache_path) -> None:
    """Raise `ExecutorOutage` when `executed` (rows that reached the executor) holds too many executor errors."""
    limit = cfg.execution.max_executor_error_rate
    errors, n, rate = executor_error_share(executed)
    if errors == 0 or rate <= limit:
        return
    urls = cfg.executor.endpoints()
    where = ("endpoint " + ", ".join(urls)) if len(urls) == 1 else \
        ("endpoints " + ", ".join(urls)) if urls else "the embedded model"
    first = executed.filter(pl.col("status") == "executor_error")["error"][0]
    fix = (f"bring {where} back (or set executor.url to a live endpoint) and rematerialize "
           f"{asset}[{partition_key}]" if urls else
           f"check the bundled model and rematerialize {asset}[{partition_key}]")
    failed = int(counters.get("failed_calls", 0))
    raise ExecutorOutage(
        (
            f"{asset}[{partition_key}]: {errors}/{n} executed workflows ({rate:.0%}) failed on the executor at "
            f"{where}, above execution.max_executor_error_rate = {limit:g}; nothing written (these would not be "
            f"the workflows' scores). First error: {first[:400]}. Fix: {fix}: the {counters['new_calls'] - failed} "
            f"calls that succeeded are kept in the call cache {cache_path}, so only the missing calls are made "
            f"again. To accept a flaky executor, raise execution.max_executor_error_rate."),
        {"executor_errors": errors, "executed_workflows": n, "rate": round(rate, 4), "threshold": limit,
         "executor": where, "executor_new_calls": counters["new_calls"], "executor_failed_calls": failed,
         "executor_cache_hits": counters["cache_hits"]},
    )
