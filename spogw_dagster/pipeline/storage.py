"""Where materialized assets live, and atomic writes.

Layout under the assets directory (default ./assets, or SPOGW_ASSETS_DIR):

    <asset>/<partition>.parquet          one Parquet file per asset and iteration partition
    lora_checkpoint/<partition>/         the PEFT adapter folder of that iteration
    heldout_results/<partition>.parquet  per-query rows behind benchmark_report (a side table)
    splits/                              the benchmark splits used (JSON)
    call_cache.sqlite                    the executor call cache (reruns are served from it)
    spogw.duckdb                         the DuckDB catalog: one view per table over the Parquet files
    .dagster/                            the persistent Dagster instance `spogw run` uses by default

Writes are atomic: a file is written to a temporary name in the same directory (which never ends in
.parquet, so the catalog's globs never see it), fsynced, then renamed over the target with os.replace. A
reader sees the old file or the new one, never half of one; a re-materialization replaces its partition.
"""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl

from ..fsutil import atomic_path

ASSET_NAMES = (
    "sampled_workflows",
    "execution_scores",
    "screened_groups",
    "sharpened_groups",
    "lora_checkpoint",
    "benchmark_report",
)
# Materialized on demand, not by the loop's job.
ON_DEMAND_ASSETS = ("objective_comparison",)
SIDE_TABLES = ("heldout_results", "comparison_heldout")
TABLES = ASSET_NAMES + ON_DEMAND_ASSETS + SIDE_TABLES
CATALOG_FILE = "spogw.duckdb"


def default_assets_dir() -> Path:
    return Path(os.environ.get("SPOGW_ASSETS_DIR") or (Path.cwd() / "assets")).expanduser().resolve()


class AssetStore:
    """Paths and atomic IO for one assets directory."""

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root).expanduser().resolve()

    def table_dir(self, table: str) -> Path:
        return self.root / table

    def parquet_path(self, table: str, partition: str) -> Path:
        return self.table_dir(table) / f"{partition}.parquet"

    def adapter_dir(self, partition: str) -> Path:
        return self.table_dir("lora_checkpoint") / partition

    @property
    def catalog_path(self) -> Path:
        return self.root / CATALOG_FILE

    def write_parquet(self, table: str, partition: str, df: pl.DataFrame) -> Path:
        if "iteration" not in df.columns:
            raise ValueError(f"table {table!r} must carry an 'iteration' column (got {df.columns})")
        path = self.parquet_path(table, partition)
        write_parquet_atomic(df, path)
        return path

    def read_parquet(self, table: str, partition: str) -> pl.DataFrame:
        path = self.parquet_path(table, partition)
        if not path.is_file():
            raise FileNotFoundError(
                f"{table}[{partition}] has no data at {path}; materialize {table} for iteration {partition} first")
        return pl.read_parquet(path)

    def exists(self, table: str, partition: str) -> bool:
        return self.parquet_path(table, partition).is_file()

    def partitions(self, table: str) -> list[str]:
        d = self.table_dir(table)
        return sorted(p.stem for p in d.glob("*.parquet")) if d.is_dir() else []


def write_parquet_atomic(df: pl.DataFrame, path: str | os.PathLike[str]) -> Path:
    with atomic_path(path) as tmp:
        df.write_parquet(tmp, compression="zstd", statistics=True)
    return Path(path)
