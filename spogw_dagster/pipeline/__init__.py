"""The Dagster layer: six iteration-partitioned assets that run the SPOGW (ioGRPO + mKL) loop.

    sampled_workflows -> execution_scores -> screened_groups -> sharpened_groups -> lora_checkpoint
                                                                                  -> benchmark_report

Module map (the Dagster-free modules come first; they hold the logic and are unit-tested on their own):

- `config`, `profiles`  typed, validated configuration and the shipped profiles (tiny, ci, paper)
- `partitions`          the "iteration" partitions definition and key helpers
- `storage`, `catalog`  atomic Parquet files per asset and partition, adapter folders, the DuckDB catalog
- `rewards`, `tables`   the reward ladder and the pure table builders (rows, training examples, report)
- `plots`, `versions`   PNG-in-markdown metadata, code versions
- `lineage`             the cross-iteration checkpoint lookup (fails fast when the parent is missing)
- `io`, `resources`     the Parquet IO manager and the resources (config, executor, sandbox)
- `assets`, `checks`, `sensors`, `definitions`, `loop`   the Dagster objects and the in-process loop
"""

