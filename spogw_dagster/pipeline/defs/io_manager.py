"""The IO manager: one Parquet file per asset and iteration partition, written atomically.

Why our own instead of dagster-polars' PolarsParquetIOManager: dagster-polars is stuck at 0.27.12 on PyPI
and breaks with polars 2.x (dagster-io/dagster#33506), and dagster-duckdb-polars breaks with duckdb 2.x and
keeps one DuckDB file that only one process may write. Ours is ~60 lines on polars' own Parquet writer,
writes `<assets>/<asset>/<partition>.parquet` atomically (temp file + os.replace, so a re-materialization
replaces its partition and a concurrent reader sees old or new, never half), checks the `iteration`
column, and keeps the DuckDB catalog (`catalog.py`) in step. Unpartitioned use is refused: every table here
belongs to an iteration.
"""

from __future__ import annotations

import logging

import dagster as dg
import polars as pl

from spogw_dagster.pipeline.data.catalog import refresh_catalog
from spogw_dagster.pipeline.data.storage import AssetStore

log = logging.getLogger(__name__)


class ParquetIOManager(dg.ConfigurableIOManager):
    """Polars frames <-> `<assets_dir>/<asset>/<partition>.parquet`, plus the DuckDB catalog."""

    assets_dir: str

    def _store(self) -> AssetStore:
        return AssetStore(self.assets_dir)

    @staticmethod
    def _table(context) -> str:
        return context.asset_key.path[-1]

    def handle_output(self, context: dg.OutputContext, obj: pl.DataFrame) -> None:
        if obj is None:
            return
        if not isinstance(obj, pl.DataFrame):
            raise TypeError(f"{context.asset_key.to_user_string()} returned {type(obj).__name__}; "
                            "this IO manager stores polars DataFrames")
        if not context.has_partition_key:
            raise ValueError(f"{context.asset_key.to_user_string()} is not partitioned; every table here belongs "
                             "to an iteration partition")
        store = self._store()
        table = self._table(context)
        path = store.write_parquet(table, context.partition_key, obj)
        try:
            refresh_catalog(store)
        except Exception as e:  # the Parquet file is the data; a catalog hiccup must not fail the step
            log.warning("DuckDB catalog refresh failed (%s); run `spogw catalog` to rebuild it", e)
        context.add_output_metadata({
            "path": dg.MetadataValue.path(str(path)),
            "dagster/row_count": dg.MetadataValue.int(obj.height),
            "columns": dg.MetadataValue.text(", ".join(obj.columns)),
            "duckdb": dg.MetadataValue.md(
                f"`duckdb {store.catalog_path} \"select * from {table} where iteration = "
                f"{int(context.partition_key)}\"`"),
        })

    def load_input(self, context: dg.InputContext) -> pl.DataFrame:
        if not context.has_asset_partitions:
            raise ValueError(f"{context.asset_key.to_user_string()}: loading needs an iteration partition")
        keys = list(context.asset_partition_keys)
        store = self._store()
        table = self._table(context)
        if len(keys) == 1:
            return store.read_parquet(table, keys[0])
        return pl.concat([store.read_parquet(table, k) for k in keys], how="diagonal_relaxed")
