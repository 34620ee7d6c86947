"""The six software-defined assets, all partitioned by iteration, one module each. Each module defines its
asset the way Dagster projects do: a function named after the asset, decorated with `@dg.asset` (its UI group,
description and kinds beside it), that reads its inputs, calls the domain and core, and returns a Polars frame
(stored by the Parquet IO manager) with its metadata. `common.versioned` sends that frame out as `dg.Output`
with a data version of its content (`common.frame_data_version`): Dagster then marks downstream partitions stale
after a rerun that changed data, and nothing after one that reproduced it. `build_assets(cfg)` adds each
asset's code version, which depends on the config; `ASSET_MODULES` is the one list of them. The groups show the stages in the UI:

    sampling     sampled_workflows(k)   m workflows per training query from π_{k-1}, with token log-probs
    execution    execution_scores(k)    every workflow run in the sandbox against the executor, scored
    curation     screened_groups(k)     exclusions, groups of n, screening by score std
                 sharpened_groups(k)    top-t / bottom-t of each kept group with advantages
    training     lora_checkpoint(k)     the LoRA adapter trained with the configured objective
    evaluation   benchmark_report(k)    held-out metrics of checkpoint k beside π_{k-1} and static baselines
                                        (its per-sample side table: heldout_results)
                 objective_comparison(k) on demand: the methods of comparison.methods trained side by side
                                        from lora_checkpoint(k-1) on iteration k's data, scored like the report
"""

from __future__ import annotations

import dagster as dg

from spogw_dagster.pipeline.defs.assets import (
    benchmark_report,
    execution_scores,
    lora_checkpoint,
    objective_comparison,
    sampled_workflows,
    screened_groups,
    sharpened_groups,
)
from spogw_dagster.pipeline.defs.versions import code_version
from spogw_dagster.pipeline.settings import SpogwConfig

# The one list of the assets: everything else that names them derives from it (the loop's job and chain, the
# definitions, the code versions; tests/test_asset_list.py checks that no other list exists). Each module
# declares beside its asset the config sections it reads (`SECTIONS`, `SECTIONS_WHEN_ON`).
#: The loop's chain, in dependency order: one iteration materializes these (`spogw run`, the job, the sensor).
LOOP_MODULES = (sampled_workflows, execution_scores, screened_groups, sharpened_groups, lora_checkpoint,
                benchmark_report)
#: Materialized on demand (`spogw compare --iteration`, the UI), never by the loop's job.
ON_DEMAND_MODULES = (objective_comparison,)
ASSET_MODULES = LOOP_MODULES + ON_DEMAND_MODULES
ASSET_NAMES = tuple(m.NAME for m in LOOP_MODULES)
ON_DEMAND_ASSETS = tuple(m.NAME for m in ON_DEMAND_MODULES)


def build_assets(cfg: SpogwConfig) -> list[dg.AssetsDefinition]:
    """The assets, each with its code version: a hash of its source closure and of the config sections it reads
    (`versions.py`), so `cfg` sets it (the resource supplies the same config at run time)."""

    def with_version(m) -> dg.AssetsDefinition:
        asset = getattr(m, m.NAME)
        return asset.map_asset_specs(lambda s: s.replace_attributes(code_version=code_version(m.NAME, cfg)))

    return [with_version(m) for m in ASSET_MODULES]
