"""screened_groups(k): executor errors (with `curation.valid_only`, workflows that never ran) and near-duplicate
workflows out, groups of n formed per query and screened by score std (`core.curation.screen`); one row per
group with its kept flag and reason."""

import time

import dagster as dg
import polars as pl

from spogw_dagster.core import curation
from spogw_dagster.pipeline.data import tables
from spogw_dagster.pipeline.defs.assets.common import common_metadata, ints, md_table, say, versioned
from spogw_dagster.pipeline.defs.partitions import iterations
from spogw_dagster.pipeline.defs.resources import PipelineResource

NAME = "screened_groups"
GROUP = "curation"
KINDS = {"python", "parquet"}
DESCRIPTION = ("Executor errors (with curation.valid_only, workflows that never ran) and near-duplicate workflows "
               "removed, groups of n formed per query and screened by score std (kept flag + reason for every group).")
# The config sections it reads (its code version and `config_section_hash` cover them).
SECTIONS = ("curation",)


@dg.asset(group_name=GROUP, description=DESCRIPTION, kinds=KINDS, partitions_def=iterations,
          io_manager_key="io_manager")
@versioned
def screened_groups(context: dg.AssetExecutionContext, pipeline: PipelineResource, sampled_workflows: pl.DataFrame,
                    execution_scores: pl.DataFrame) -> pl.DataFrame:
    t0 = time.monotonic()
    cfg = pipeline.config()
    try:
        sc = curation.screen(tables.curation_input(sampled_workflows, execution_scores), cfg.curation_config())
    except ValueError as e:
        raise dg.Failure(description=str(e)) from None
    summary = sc.summary()
    context.add_output_metadata({
        **common_metadata(cfg, NAME, t0),
        **ints({k: v for k, v in summary.items() if not k.startswith("dropped")}),
        "rows_dropped": md_table(summary["dropped_rows"] or {"(none)": 0}, ("reason", "workflows")),
        "groups_dropped": md_table(summary["dropped_groups"] or {"(none)": 0}, ("reason", "groups")),
        "mean_group_std": dg.MetadataValue.float(round(float(sc.groups["score_std"].mean() or 0.0), 4)
                                                 if sc.groups.height else 0.0),
    })
    say(context, f"{sc.groups.height} groups kept of {sc.groups_formed} formed; dropped rows "
                 f"{summary['dropped_rows']}, dropped or unformed groups {summary['dropped_groups']}")
    return tables.screened_frame(sc.groups, sc.dropped_groups)
