"""The outage rule at the asset boundary: `domain.outage.check_outage`'s error becomes a `dg.Failure` (no
retries: a retry meets the same dead endpoint; the fix is in the message)."""

from __future__ import annotations

import dagster as dg
import polars as pl

from spogw_dagster.pipeline.domain.outage import ExecutorOutage, check_outage

__all__ = ["fail_on_outage"]


def fail_on_outage(cfg, executed: pl.DataFrame, counters: dict[str, int], *, asset: str, partition_key: str,
                   cache_path) -> None:
    """Raise `dg.Failure` when `executed` (rows that reached the executor) holds too many executor errors."""
    try:
        check_outage(cfg, executed, counters, asset=asset, partition_key=partition_key, cache_path=cache_path)
    except ExecutorOutage as e:
        raise dg.Failure(description=str(e), metadata=e.metadata, allow_retries=False) from e
