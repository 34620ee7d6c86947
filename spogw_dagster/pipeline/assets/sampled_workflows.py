"""sampled_workflows(k): m workflows per training query from π_{k-1} (the base model at k = 0), with the
sampled tokens and their log-probs (π_old for the trainer). With W4S refinement (refinement.turns = T > 1)
each workflow is revised T−1 times from the feedback of running it on validation queries: m·T rows per
query, each with its turn and the sample it revises (`pipeline/refinement.py`)."""

import time
from collections import Counter
from typing import Any

import dagster as dg
import polars as pl

from ...seeds import derive_seed
from .. import tables
from ..partitions import key_to_int
from ..resources import PipelineResource
from .common import common_metadata, md_table, parent_or_fail, say

NAME = "sampled_workflows"
GROUP = "sampling"
KINDS = {"python", "parquet"}
DESCRIPTION = ("m workflows per training query sampled from π_{k-1} (the base model at k = 0) with per-token "
               "log-probs; fails fast when lora_checkpoint(k-1) is missing.")


def compute(context: dg.AssetExecutionContext, pipeline: PipelineResource) -> pl.DataFrame:
    from ..heldout import generate_samples

    t0 = time.monotonic()
    cfg = pipeline.config()
    key = context.partition_key
    k = key_to_int(key)
    parent = parent_or_fail(pipeline.store(), key)
    problems = pipeline.train_queries()
    seed = derive_seed(cfg.generator.seed, "sample", k)
    say(context, f"iteration {key}: sampling {cfg.curation.m} workflows for each of {len(problems)} queries from "
                 f"{'lora_checkpoint[' + parent.partition + ']' if parent else 'the base model'}")
    prompts, samples, tps = generate_samples(pipeline, parent.path if parent else None, problems, n=cfg.curation.m,
                                             temperature=cfg.generator.temperature, seed=seed)
    df = tables.sampled_frame(
        k, [p.id for p in problems], prompts, samples, problems[0].family,
        parent_iteration=parent.iteration if parent else None, parent_sha256=parent.sha256 if parent else None,
        generator=cfg.generator.model,
    )
    if cfg.refinement.enabled:
        df = _refine(context, pipeline, cfg, k, parent, problems[0].family, df)
    context.add_output_metadata({**common_metadata(cfg, NAME, t0),
                                 **_metadata(df, parent, len(problems), tps, seed, problems[0].family)})
    say(context, f"{df.height} workflows, parse status {dict(Counter(df['parse_status'].to_list()))}, "
                 f"{tps:.1f} tokens/s, {time.monotonic() - t0:.1f} s")
    return df


def _metadata(df: pl.DataFrame, parent, queries: int, tps: float, seed: int, family: str) -> dict[str, Any]:
    parse = dict(Counter(df["parse_status"].to_list()))
    return {
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
    from spogw_dagster.workflow.copies import copied_from, distinct_count

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


def _refine(context, pipeline: PipelineResource, cfg, k: int, parent, family: str, first: pl.DataFrame) -> pl.DataFrame:
    """Turns 1..T−1: each workflow of the last turn runs on the feedback queries, and the generator (π_{k-1}
    again) writes one revision of it from the workflow and its feedback. Rows of turn t: sample_idx t·m + j."""
    from spogw_dagster.workflow.template import refinement_prompt

    from ..heldout import sample_prompts
    from ..refinement import feedback_problems, run_feedback

    fb_problems = feedback_problems(cfg)
    m = cfg.curation.m
    turns, last = [first], first.sort(["query_id", "sample_idx"])
    for t in range(1, cfg.refinement.turns):
        rows = last.to_dicts()
        say(context, f"turn {t}: running {len(rows)} workflows on {len(fb_problems)} validation queries for feedback")
        feedback = run_feedback(pipeline, [(r["workflow"] if r["parse_status"] == "ok" else None, r["parse_status"],
                                            r["parse_error"] or "") for r in rows], fb_problems, cfg,
                                seed=derive_seed(cfg.execution.seed, "feedback", k, t))
        prompts = [refinement_prompt(r["prompt"], r["workflow"] or "", fb) for r, fb in zip(rows, feedback)]
        samples, tps = sample_prompts(pipeline, parent.path if parent else None, prompts, n=1,
                                      temperature=cfg.generator.temperature,
                                      seed=derive_seed(cfg.generator.seed, "sample", k, "turn", t))
        last = tables.sampled_frame(
            k, [r["query_id"] for r in rows], prompts, samples, family,
            parent_iteration=parent.iteration if parent else None, parent_sha256=parent.sha256 if parent else None,
            generator=cfg.generator.model, turn=t,
            sample_idx=[[t * m + r["sample_idx"] % m] for r in rows], parent_sample_idx=[[r["sample_idx"]] for r in rows])
        turns.append(last)
        say(context, f"turn {t}: {dict(Counter(last['parse_status'].to_list()))}, {tps:.1f} tokens/s")
    return pl.concat(turns).sort(["query_id", "sample_idx"])
