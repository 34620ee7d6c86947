"""The Dagster layer: six iteration-partitioned assets that run the SPOGW (ioGRPO + mKL) loop.

    sampled_workflows -> execution_scores -> screened_groups -> sharpened_groups -> lora_checkpoint
                                                                                  -> benchmark_report

Subpackages by concern (imports go from run control to definitions to the domain and data layers, never back):

- `settings/`, `profiles`  typed, validated configuration by concern (sections; curation/training/reward
                          sections derived from the core's dataclasses; the whole config; hashing; loading) and
                          the shipped profiles (tiny, answers, ci, paper)
- `defs/`     the Dagster definitions: `assets/` (one module per asset), checks, sensors, the IO manager, the
              resource, partitions, the run executors, the step-container executor, code versions,
              `failures` (domain errors as `dg.Failure`), plots, and `wiring` (the Definitions)
- `runs/`     run control: `loop` (`spogw run`), `container_steps`, `commands` (the CLI
              subcommands), `preflight` (`spogw check`), `plan`, `cleanup` (`spogw gc`)
- `domain/`   domain logic without Dagster: `generation` (sampling the generator), `iteration_samples`
              (an iteration's rows, W4S's turns), `refinement` (W4S's feedback), `jobs` (executing and scoring
              workflows), `heldout` (the report's scoring), `lineage`, `outage`, `errors`, `headline`,
              `comparison_methods` and `comparison_stats` (objective_comparison's methods and table)
- `data/`     the data layer: `storage` (atomic Parquet, adapter folders), `catalog` (DuckDB), `tables`
              (schemas and pure frame builders), `checkpoints` (the parent lookup, a carried-forward adapter),
              `iteration_keys`, `locks` (the assets directory's lock), `heldout_results`, `comparison_store`

Order: runs -> defs -> domain -> data -> settings/profiles; only defs and runs import Dagster
(tests/test_layers.py).
"""
