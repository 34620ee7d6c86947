"""The data layer: where materialized tables and adapters live (atomic Parquet per asset and partition), the
DuckDB catalog over them, the table schemas and pure frame builders, and the checkpoints (the parent lookup, carrying one forward)."""
