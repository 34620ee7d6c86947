"""The six software-defined assets, all partitioned by iteration, one module each. Each module holds the
asset's name, UI group, description and a top-level `compute` function that reads its inputs, calls the core
and returns a Polars frame (stored by the Parquet IO manager) with its metadata; `build_assets` only applies
Dagster's decorator. The groups show the stages in the UI:

    sampling     sampled_workflows(k)   m workflows per training query from π_{k-1}, with token log-probs
    execution    execution_scores(k)    every workflow run in the sandbox against the executor, scored
    curation     screened_groups(k)     exclusions, groups of n, screening by score std
                 sharpened_groups(k)    top-t / bottom-t of each kept group with advantages
    training     lora_checkpoint(k)     the LoRA adapter trained with the configured objective
    evaluation   benchmark_report(k)    held-out metrics of checkpoint k beside π_{k-1} and static baselines
                                        (its per-sample side table: heldout_results)
"""

from __future__ import annotations

import dagster as dg

from ..settings import SpogwConfig
from ..partitions import iterations
from ..versions import code_version
from . import (
    benchmark_report,
    execution_scores,
    lora_checkpoint,
    sampled_workflows,
    screened_groups,
    sharpened_groups,
)

#: In dependency order.
ASSET_MODULES = (sampled_workflows, execution_scores, screened_groups, sharpened_groups, lora_checkpoint,
                 benchmark_report)


def build_assets(cfg: SpogwConfig) -> list[dg.AssetsDefinition]:
    """The six assets; `cfg` sets their code versions (the resource supplies the same config at run time)."""
    return [
        dg.asset(name=m.NAME, partitions_def=iterations, group_name=m.GROUP, code_version=code_version(m.NAME, cfg),
                 description=m.DESCRIPTION, kinds=m.KINDS, io_manager_key="io_manager")(m.compute)
        for m in ASSET_MODULES
    ]
