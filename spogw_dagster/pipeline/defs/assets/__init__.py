"""The six software-defined assets, all partitioned by iteration, one module each. Each module holds the
asset's name, UI group, description and a top-level `compute` function that reads its inputs, calls the core
and returns a Polars frame (stored by the Parquet IO manager) with its metadata; `build_assets` applies
Dagster's decorator, and wraps each `compute` so that its frame goes out as `dg.Output` with a data version
of the frame's content (`common.frame_data_version`): Dagster then marks downstream partitions stale after a
rerun that changed data, and nothing after one that reproduced it. The groups show the stages in the UI:

    sampling     sampled_workflows(k)   m workflows per training query from π_{k-1}, with token log-probs
    execution    execution_scores(k)    every workflow run in the sandbox against the executor, scored
    curation     screened_groups(k)     exclusions, groups of n, screening by score std
                 sharpened_groups(k)    top-t / bottom-t of each kept group with advantages
    training     lora_checkpoint(k)     the LoRA adapter trained with the configured objective
    evaluation   benchmark_report(k)    held-out metrics of checkpoint k beside π_{k-1} and static baselines
                                        (its per-sample side table: heldout_results)
                 objective_comparison(k) on demand: the methods of comparison.objectives trained side by side
                                        from lora_checkpoint(k-1) on iteration k's data, scored like the report
"""

from __future__ import annotations

import functools
import inspect
import warnings
from typing import Any, Callable

import dagster as dg
import polars as pl

from spogw_dagster.pipeline.settings import SpogwConfig
from spogw_dagster.pipeline.defs.partitions import iterations
from spogw_dagster.pipeline.defs.versions import code_version
from spogw_dagster.pipeline.defs.assets.common import frame_data_version, peak_rss_mb, reset_peak_rss
from spogw_dagster.pipeline.defs.assets import (
    benchmark_report,
    execution_scores,
    lora_checkpoint,
    objective_comparison,
    sampled_workflows,
    screened_groups,
    sharpened_groups,
)

#: In dependency order; the loop's job runs the first six, objective_comparison is materialized on demand.
ASSET_MODULES = (sampled_workflows, execution_scores, screened_groups, sharpened_groups, lora_checkpoint,
                 benchmark_report, objective_comparison)


def versioned(compute: Callable[..., Any]) -> Callable[..., Any]:
    """`compute` returning `dg.Output(frame, data_version=<hash of the frame>)`. Dagster reads the parameters
    (names, the `context` annotation) through `functools.wraps`; the return annotation becomes
    `dg.Output[pl.DataFrame]`, as Dagster requires of a function that returns an Output. The step's peak
    resident memory (this process: models, trainer, frames; sandboxed children are capped by their cgroups)
    goes into the metadata as `peak_rss_mb`."""

    @functools.wraps(compute)
    def with_data_version(*args: Any, **kwargs: Any) -> Any:
        measured = reset_peak_rss()  # steps run one after another in one process: this step's own peak
        out = compute(*args, **kwargs)
        if isinstance(out, pl.DataFrame):
            peak = peak_rss_mb() if measured else None
            md = {"peak_rss_mb": dg.MetadataValue.float(peak)} if peak is not None else {}
            with warnings.catch_warnings():  # `data_version=` is marked beta in 1.13; it is what the UI reads
                warnings.simplefilter("ignore", dg.BetaWarning)
                return dg.Output(out, metadata=md, data_version=frame_data_version(out))
        return out

    returns = dg.Output[pl.DataFrame]
    with_data_version.__annotations__ = {**compute.__annotations__, "return": returns}
    with_data_version.__signature__ = inspect.signature(compute).replace(  # type: ignore[attr-defined]
        return_annotation=returns)
    return with_data_version


def build_assets(cfg: SpogwConfig) -> list[dg.AssetsDefinition]:
    """The assets; `cfg` sets their code versions (the resource supplies the same config at run time)."""
    return [
        dg.asset(name=m.NAME, partitions_def=iterations, group_name=m.GROUP, code_version=code_version(m.NAME, cfg),
                 description=m.DESCRIPTION, kinds=m.KINDS, io_manager_key="io_manager")(versioned(m.compute))
        for m in ASSET_MODULES
    ]
