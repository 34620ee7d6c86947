"""heldout_results(k): the report's side table, one row per held-out sample (system, mode, query, seed) with
its workflow, status and scores. `benchmark_report` writes it (it is not an asset of its own: the report is
computed from it in the same step) and refreshes the DuckDB catalog so both can be queried at once."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from spogw_dagster.pipeline.data.catalog import refresh_catalog
from spogw_dagster.pipeline.data.storage import AssetStore

TABLE = "heldout_results"


def write(store: AssetStore, key: str, rows: pl.DataFrame) -> Path:
    store.write_parquet(TABLE, key, rows)
    refresh_catalog(store)
    return store.parquet_path(TABLE, key)


def read_reusable(store: AssetStore, partition: str) -> tuple[pl.DataFrame, pl.DataFrame] | None:
    """(benchmark_report, heldout_results) of a partition, when both exist."""
    if store.exists("benchmark_report", partition) and store.exists(TABLE, partition):
        return store.read_parquet("benchmark_report", partition), store.read_parquet(TABLE, partition)
    return None
