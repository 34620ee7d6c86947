"""objective_comparison(k): the methods of `comparison.methods` (`core.methods.catalog`: spogw, grpo, grpo_nokl,
score_dpo, rwr and SPOGW's ablations) each trained from the same parent adapter, lora_checkpoint(k-1), on the
same iteration's sampled and scored workflows with the same seeds, then scored on the report's held-out
queries with the report's seeds, metrics and intervals. One row per method, mode and metric with the paired
difference to the reference method (`spogw` when selected, else the first); per-sample rows go to the side
table comparison_heldout. Not part of the loop's job: materialize it for an iteration whose report exists
(`spogw compare --iteration K --methods ...`, or the UI).

What each method trained on is recorded beside it: the hash of the iteration's candidate rows (identical for
every method: the same data), the seed, the parent adapter's hash, and the hash of its own examples (its data
path: sharpened groups, ScoreFlow pairs or W4S candidates)."""

import asyncio
import json
import time
from dataclasses import replace
from typing import Any

import dagster as dg
import polars as pl

from spogw_dagster.adapter_files import ADAPTER_WEIGHTS
from spogw_dagster.core.methods.catalog import own_data
from spogw_dagster.pipeline.data import report_stats, tables
from spogw_dagster.pipeline.data.comparison_store import own_data_dir, store_own_data, stored_own_data
from spogw_dagster.pipeline.data.storage import AssetStore
from spogw_dagster.pipeline.defs import failures, versions
from spogw_dagster.pipeline.defs.assets.common import common_metadata, parent_or_fail, say, versioned
from spogw_dagster.pipeline.defs.partitions import iterations, key_to_int
from spogw_dagster.pipeline.defs.plots import method_bars
from spogw_dagster.pipeline.defs.resources import PipelineResource
from spogw_dagster.pipeline.domain import heldout as ho
from spogw_dagster.pipeline.domain.comparison_methods import (
    candidate_rows_sha256,
    method_config,
    scoring_config,
    train_method,
)
from spogw_dagster.pipeline.domain.comparison_stats import MethodRun, comparison_frame
from spogw_dagster.pipeline.domain.iteration_samples import sample_iteration
from spogw_dagster.pipeline.domain.jobs import evaluate_jobs, jobs_for
from spogw_dagster.pipeline.domain.lineage import check_sampled_from_parent
from spogw_dagster.pipeline.domain.outage import executed_rows
from spogw_dagster.pipeline.settings import SpogwConfig
from spogw_dagster.seeds import derive_seed

NAME = "objective_comparison"
GROUP = "evaluation"
KINDS = {"pytorch", "parquet"}
DESCRIPTION = ("SPOGW, GRPO, Score-DPO, RWR and SPOGW's ablations (comparison.methods) trained from the same "
               "parent adapter on iteration k's data with the same seeds, scored on the report's held-out queries: "
               "metrics with 95% intervals and the paired difference to spogw. On demand, not in the loop's job.")
# The config sections it reads (its code version and `config_section_hash` cover them).
SECTIONS = ("benchmark", "generator", "executor", "execution", "reward", "curation", "training", "report",
            "comparison")
SIDE_TABLE = "comparison_heldout"
DATA_TABLE = "comparison_candidates"  # the scored candidates of methods that sample and score their own


@dg.asset(group_name=GROUP, description=DESCRIPTION, kinds=KINDS, partitions_def=iterations,
          io_manager_key="io_manager")
@versioned
def objective_comparison(context: dg.AssetExecutionContext, pipeline: PipelineResource, sampled_workflows: pl.DataFrame,
                         execution_scores: pl.DataFrame, sharpened_groups: pl.DataFrame, lora_checkpoint: pl.DataFrame,
                         benchmark_report: pl.DataFrame) -> pl.DataFrame:
    t0 = time.monotonic()
    cfg = pipeline.config()
    key = context.partition_key
    k = key_to_int(key)
    store = pipeline.store()
    parent = parent_or_fail(store, key)
    with failures.as_failure():  # π_old of every method is recomputed from this parent
        check_sampled_from_parent(key, parent, sampled_workflows)
    rows_sha = candidate_rows_sha256(sampled_workflows, execution_scores)
    frames = (sampled_workflows, execution_scores, sharpened_groups)
    runs, own = [], []
    for name in cfg.comparison.methods:
        mframes, mrows_sha = frames, rows_sha
        if own_data(name):  # ScoreFlow: its own sampling and scoring settings, same parent and seeds
            mcfg = method_config(cfg, name)
            folder, fingerprint = own_data_dir(store, key, name), own_data_fingerprint(mcfg, parent, k)
            stored = stored_own_data(folder, fingerprint)
            if stored is not None:
                say(context, f"{name}: its own sampled and scored candidates from {folder} (same config and parent)")
                s, sc = stored
            else:
                s, sc = _own_data(context, pipeline, mcfg, parent, k, name)
                try:  # a rerun (after a crash in training) starts here; not keeping them costs time, not data
                    store_own_data(folder, fingerprint, s, sc)
                except OSError as e:
                    context.log.warning(f"{name}: could not keep its candidates in {folder} ({e}); a rerun "
                                        "samples and scores them again")
            own.append(sc.with_columns(pl.lit(name).alias("method")))
            mframes, mrows_sha = (s, sc, sharpened_groups), candidate_rows_sha256(s, sc)
        run = train_method(cfg, name, mframes, store, key, parent, lora_checkpoint.row(0, named=True),
                           say=lambda m: say(context, m), warn=context.log.warning)
        if not run.reused and not (run.adapter / ADAPTER_WEIGHTS).is_file():  # pragma: no cover - train_lora
            raise dg.Failure(f"{name}: no adapter was written to {run.adapter}")  # and carry_forward both write it
        runs.append(replace(run, rows_sha256=mrows_sha))
    if own:
        store.write_parquet(DATA_TABLE, key, pl.concat(own, how="diagonal_relaxed"))
    scfg = scoring_config(cfg)
    with failures.as_failure():
        problems, split_info = ho.heldout_problems(scfg)
    heldout = _score(context, pipeline, scfg, runs, problems, store, key, benchmark_report)
    store.write_parquet(SIDE_TABLE, key, heldout)
    reference = "spogw" if "spogw" in cfg.comparison.methods else cfg.comparison.methods[0]
    table = comparison_frame(heldout, runs, reference=reference, iteration=k,
                             parent_sha256=parent.sha256 if parent else None, config_hash=cfg.hash,
                             split_ids_sha256=split_info["ids_sha256"], resamples=cfg.report.bootstrap_resamples,
                             seed=cfg.report.seed)
    context.add_output_metadata({**common_metadata(cfg, NAME, t0), **_metadata(table, reference)})
    say(context, f"{len(runs)} methods compared on {len(problems)} {scfg.report.split} queries, "
                 f"{time.monotonic() - t0:.1f} s")
    return table


def _own_data(context, pipeline: PipelineResource, mcfg: SpogwConfig, parent, k: int,
              name: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Iteration k's training data sampled and scored with method `name`'s own settings (ScoreFlow: generator
    T = 0.2 and top-p 0.95, each workflow the mean of 3 executor runs at T = 0; W4S: its turns): the same parent
    adapter, training queries and seeds as the loop's sampled_workflows and execution_scores."""
    mpipe = PipelineResource(assets_dir=pipeline.assets_dir, config_json=json.dumps(mcfg.canonical(), default=str))
    g = mcfg.generator
    problems = mpipe.train_queries()
    say(context, f"{name}: sampling {mcfg.curation.m} workflows for each of {len(problems)} queries at T = "
                 f"{g.temperature}, top-p {g.top_p}"
                 + (f", {mcfg.refinement.turns} W4S turns" if mcfg.refinement.enabled else ""))
    sampled, _ = sample_iteration(mpipe, mcfg, k, parent, problems, derive_seed(g.seed, "sample", k),
                                  say=lambda m: say(context, m))
    with failures.as_failure():
        jobs = jobs_for(sampled, {p.id: p for p in problems}, f"{k:04d}")
    iso = mpipe.isolation()

    async def run():
        async with mpipe.executor() as ex:
            res = await evaluate_jobs(jobs, ex.executor, iso, mcfg, seed=mcfg.execution.seed)
            return res, {**ex.counters(), "failed_calls": int(getattr(ex.executor, "failures", 0))}

    say(context, f"{name}: scoring each workflow as the mean of {mcfg.execution.runs} executor runs at T = "
                 f"{mcfg.executor.temperature}")
    results, counters = asyncio.run(run())
    ladder = mcfg.reward.core()
    scores = tables.execution_frame(tables.execution_row(k, j.tag[0], j.tag[1], j.tag[2], r, ladder, workflow=j.code)
                                    for j, r in zip(jobs, results))
    failures.fail_on_outage(mcfg, executed_rows(scores), counters, asset=NAME,
                            partition_key=f"{k:04d}", cache_path=mpipe.cache_path())
    return sampled, scores


def own_data_fingerprint(mcfg: SpogwConfig, parent, k: int) -> str:
    """What the candidates depend on: the sections of the method's config that sampling and scoring read
    (generator, executor, seeds, queries, turns; not `training`, so a learning rate does not sample them again),
    the parent adapter, the iteration, and the code that samples and scores them (a fix there makes them again)."""

    assets = ("sampled_workflows", "execution_scores")
    return json.dumps({"sections": {a: versions.section_hash(mcfg, a) for a in assets},
                       "parent_sha256": parent.sha256 if parent else None, "iteration": k,
                       "code": {a: versions.source_hash(a)[:16] for a in assets}}, sort_keys=True)


def _score(context, pipeline: PipelineResource, cfg: SpogwConfig, runs: list[MethodRun], problems, store: AssetStore,
           key: str, report: pl.DataFrame) -> pl.DataFrame:
    """Held-out rows of every method (system = method name) beside the report's baselines; the loop's own
    checkpoint's rows come from heldout_results(k) when the report scored the same adapter with this config."""
    k = key_to_int(key)
    per_policy = len(problems) * sum(n for _, n, _ in ho.modes(cfg))
    reused, policies = [], []
    for r in runs:
        rows = None
        if r.reused and store.exists("heldout_results", key):
            rows = report_stats.reusable_previous(report, store.read_parquet("heldout_results", key), f"spogw@{key}",
                                            r.adapter_sha256, cfg.hash, k, per_policy)
        if rows is not None:
            reused.append(rows.with_columns(pl.lit(r.method).alias("system"), pl.lit("method").alias("kind")))
        else:
            policies.append(ho.Policy(r.method, "method", r.adapter, k, r.adapter_sha256))
    scored = ho.score(pipeline, policies, problems, cfg, iteration=k, split=cfg.report.split, reused=reused,
                      say=lambda m: say(context, m))
    failures.fail_on_outage(cfg, scored.executed, scored.counters, asset=NAME, partition_key=key,
                          cache_path=pipeline.cache_path())
    return scored.heldout


def _metadata(table: pl.DataFrame, reference: str) -> dict[str, Any]:
    note, cells = report_stats.comparison_cells(table, ["valid_rate", "mean_reward", "answer_score"])
    lines = [note, "", "| method | mode | metric | value [95% CI] | Δ vs " + reference + " [95% CI] | Δ [Holm CI] | p |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {c['method']} | {c['mode']} | {c['metric']} | {c['value']} | {c['diff']} | {c['holm']} | {c['p']} |"
              for c in cells]
    return {
        "comparison": dg.MetadataValue.md("\n".join(lines)),
        "plot": dg.MetadataValue.md(method_bars(table, reference)),
        "methods": dg.MetadataValue.json(sorted(table["method"].unique().to_list())),
        "rows_sha256": dg.MetadataValue.json({r["method"]: r["rows_sha256"] for r in
                                              table.filter(pl.col("kind") != "baseline").iter_rows(named=True)}),
    }
