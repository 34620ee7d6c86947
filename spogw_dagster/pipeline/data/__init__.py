"""The data layer: where materialized tables and adapters live (atomic Parquet per asset and partition), the
DuckDB catalog over them, the table schemas and pure frame builders, the checkpoint lineage and adapters."""
