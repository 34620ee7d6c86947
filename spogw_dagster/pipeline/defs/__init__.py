"""The Dagster definitions: the six iteration-partitioned assets (`assets/`, one module each), their checks,
the loop's sensor, the Parquet IO manager, the pipeline resource, the partitions, the executors' step
container variant, code versions, the outage rule and the metadata plots; `wiring` builds the Definitions."""
