"""sampled_workflows(k): m workflows per training query from π_{k-1} (the base model at k = 0), with the
sampled tokens and their log-probs (π_old for the trainer). With W4S refinement (refinement.turns = T > 1)
each workflow is revised T−1 times from the feedback of running it on validation queries: m·T rows per
query, each with its turn and the sample it revises (`pipeline/domain/refinement.py`)."""

import time
from collections import Counter
from typing import Any

import dagster as dg
import polars as pl

from spogw_dagster.pipeline.defs.assets.common import common_metadata, md_table, parent_or_fail, say, versioned
from spogw_dagster.models import resolve_dtype
from spogw_dagster.pipeline.defs.partitions import iterations, key_to_int
from spogw_dagster.pipeline.defs.resources import PipelineResource
from spogw_dagster.pipeline.domain.anchors import ANCHOR_FINISH
from spogw_dagster.pipeline.domain.iteration_samples import sample_iteration
from spogw_dagster.seeds import derive_seed
from spogw_dagster.workflow.copies import copied_from, distinct_count

NAME = "sampled_workflows"
GROUP = "sampling"
KINDS = {"python", "parquet"}
DESCRIPTION = ("m workflows per training query sampled from π_{k-1} (the base model at k = 0) with per-token "
               "log-probs; fails fast when lora_checkpoint(k-1) is missing.")
# The config sections it reads (its code version and `config_section_hash` cover them): with W4S refinement on,
# sampling also runs workflows for feedback.
SECTIONS = ("benchmark", "generator", "curation", "refinement")
SECTIONS_WHEN_ON = {"refinement": ("executor", "execution", "reward")}


@dg.asset(group_name=GROUP, description=DESCRIPTION, kinds=KINDS, partitions_def=iterations,
          io_manager_key="io_manager")
@versioned
def sampled_workflows(context: dg.AssetExecutionContext, pipeline: PipelineResource) -> pl.DataFrame:
    t0 = time.monotonic()
    cfg = pipeline.config()
    key = context.partition_key
    k = key_to_int(key)
    parent = parent_or_fail(pipeline.store(), key)
    problems = pipeline.train_queries()
    seed = derive_seed(cfg.generator.seed, "sample", k)
    say(context, f"iteration {key}: sampling {cfg.curation.m} workflows for each of {len(problems)} queries from "
                 f"{'lora_checkpoint[' + parent.partition + ']' if parent else 'the base model'}")
    timing: dict[str, float] = {}
    df, tps = sample_iteration(pipeline, cfg, k, parent, problems, seed, say=lambda m: say(context, m),
                               timing=timing)
    context.add_output_metadata({**common_metadata(cfg, NAME, t0),
                                 **_metadata(df, parent, len(problems), tps, seed, problems[0].family),
                                 "generator_dtype": dg.MetadataValue.text(resolve_dtype(cfg.generator.dtype)),
                                 "sampling_time": dg.MetadataValue.json(timing)})
    say(context, f"{df.height} workflows, parse status {dict(Counter(df['parse_status'].to_list()))}, "
                 f"{tps:.1f} tokens/s, {time.monotonic() - t0:.1f} s")
    return df


def _metadata(df: pl.DataFrame, parent, queries: int, tps: float, seed: int, family: str) -> dict[str, Any]:
    anchors = df.filter(pl.col("finish_reason") == ANCHOR_FINISH).height
    df = df.filter(pl.col("finish_reason").ne_missing(ANCHOR_FINISH))  # the rates describe the policy, not the prompt
    parse = dict(Counter(df["parse_status"].to_list()))
    return {
        "anchor_rows": dg.MetadataValue.int(anchors),
        "parent_checkpoint": dg.MetadataValue.json(
            parent.as_metadata() if parent else {"partition": None, "path": None, "adapter_sha256": None,
                                                 "note": "iteration 0 samples from the base model"}),
        "parent_partition": dg.MetadataValue.text(parent.partition if parent else "base"),
        "queries": dg.MetadataValue.int(queries),
        "workflows": dg.MetadataValue.int(df.height),
        "parse_status": md_table(parse, ("parse status", "workflows")),
        "valid_rate": dg.MetadataValue.float(round(parse.get("ok", 0) / max(1, df.height), 4)),
        # valid workflows that copy what the prompt shows (names and layout normalised): a policy that only copies
        # cannot improve on its examples
        **_copies(df, family),
        "mean_tokens": dg.MetadataValue.float(round(float(df["n_tokens"].mean() or 0), 2)),
        "generation_tokens_per_s": dg.MetadataValue.float(round(tps, 2)),
        "seed": dg.MetadataValue.int(seed),
    }


def _copies(df: pl.DataFrame, family: str) -> dict[str, Any]:
    valid = df.filter(pl.col("parse_status") == "ok")
    if valid.height == 0:
        return {"near_copy_rate": dg.MetadataValue.float(0.0), "distinct_per_query": dg.MetadataValue.float(0.0)}
    copies = Counter(copied_from(w, family) for w in valid["workflow"].to_list())
    per_q = valid.group_by("query_id").agg(pl.col("workflow"))["workflow"].to_list()
    # over all samples, as the report's near_copy_rate (an invalid sample is no copy)
    return {"near_copy_rate": dg.MetadataValue.float(round(sum(v for k, v in copies.items() if k) / df.height, 4)),
            "near_copies": dg.MetadataValue.json({k: v for k, v in copies.items() if k}),
            "distinct_per_query": dg.MetadataValue.float(round(sum(distinct_count(list(w)) for w in per_q)
                                                               / df["query_id"].n_unique(), 3))}
