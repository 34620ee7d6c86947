"""The Dagster layer: six iteration-partitioned assets that run the SPOGW (ioGRPO + mKL) loop.

    sampled_workflows -> execution_scores -> screened_groups -> sharpened_groups -> lora_checkpoint
                                                                                  -> benchmark_report

Module map (the Dagster-free modules come first; they hold the logic and are unit-tested on their own):

- `settings`, `profiles`  typed, validated configuration (curation/training sections derived from the core's
                          dataclasses) and the shipped profiles (tiny, ci, paper)
- `partitions`          the "iteration" partitions definition and key helpers
- `storage`, `catalog`  atomic Parquet files per asset and partition, adapter folders, the DuckDB catalog
- `rewards`, `tables`   the reward ladder and the pure table builders (rows, training examples, report)
- `plots`, `versions`   PNG-in-markdown metadata, code versions
- `lineage`             the cross-iteration checkpoint lookup (fails fast when the parent is missing)
- `io_manager`, `resources`  the Parquet IO manager and the resource (resolved config, executor, sandbox)
- `heldout`, `adapters` the held-out scoring behind the report and `spogw evaluate`; carrying an adapter forward
- `assets/` (one module per asset), `checks`, `sensors`, `wiring` (the Definitions), `loop` (`spogw run`),
  `commands` (the pipeline's CLI subcommands)
"""

