"""sharpened_groups(k): the top-t and bottom-t workflows of each kept group with their group-normalised
advantages (`core.curation.sharpen`), one row per member."""

import time

import dagster as dg
import polars as pl

from spogw_dagster.core import curation
from spogw_dagster.pipeline.data import tables
from spogw_dagster.pipeline.defs.assets.common import common_metadata, ints, say, versioned
from spogw_dagster.pipeline.defs.partitions import iterations
from spogw_dagster.pipeline.defs.resources import PipelineResource

NAME = "sharpened_groups"
GROUP = "curation"
KINDS = {"python", "parquet"}
DESCRIPTION = "Top-t and bottom-t workflows of each kept group, with group-normalised advantages (one row per member)."
# The config sections it reads (its code version and `config_section_hash` cover them).
SECTIONS = ("curation",)


@dg.asset(group_name=GROUP, description=DESCRIPTION, kinds=KINDS, partitions_def=iterations,
          io_manager_key="io_manager")
@versioned
def sharpened_groups(context: dg.AssetExecutionContext, pipeline: PipelineResource, screened_groups: pl.DataFrame) -> pl.DataFrame:
    t0 = time.monotonic()
    cfg = pipeline.config()
    cc = cfg.curation_config()
    sh = curation.sharpen(tables.kept_groups(screened_groups), cc)
    summary = sh.summary()
    context.add_output_metadata({**common_metadata(cfg, NAME, t0), **ints(summary),
                                 "group_size": dg.MetadataValue.int(cc.sharpened_size)})
    say(context, f"{summary['members']} sharpened members in {summary['groups']} groups")
    return sh.members
