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
import hashlib
import json
import math
import shutil
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl

from spogw_dagster.adapter_files import ADAPTER_WEIGHTS, STATS_FILE
from spogw_dagster.contracts import Status
from spogw_dagster.core import curation, stats
from spogw_dagster.core.methods.catalog import method_overrides, own_data
from spogw_dagster.core.training import config_identity, data_hash, registry
from spogw_dagster.core.training.launch import fit_adapter
from spogw_dagster.fsutil import replace_dir
from spogw_dagster.pipeline.data import report_stats, tables, training_inputs
from spogw_dagster.pipeline.data.checkpoints import adapter_sha256, carry_forward
from spogw_dagster.pipeline.data.storage import AssetStore
from spogw_dagster.pipeline.defs import failures, versions
from spogw_dagster.pipeline.defs.assets.common import common_metadata, parent_or_fail, say, versioned
from spogw_dagster.pipeline.defs.partitions import iterations, key_to_int
from spogw_dagster.pipeline.defs.plots import method_bars
from spogw_dagster.pipeline.defs.resources import PipelineResource
from spogw_dagster.pipeline.domain import heldout as ho
from spogw_dagster.pipeline.domain.iteration_samples import sample_iteration
from spogw_dagster.pipeline.domain.jobs import evaluate_jobs, jobs_for
from spogw_dagster.pipeline.domain.lineage import check_sampled_from_parent
from spogw_dagster.pipeline.domain.outage import executed_rows
from spogw_dagster.pipeline.settings import SpogwConfig, deep_merge, parse_config
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


@dataclass
class MethodRun:
    method: str
    objective: str
    adapter: Path
    adapter_sha256: str
    n_examples: int
    examples_sha256: str
    seed: int
    train_seconds: float | None
    reused: str  # "" | "lora_checkpoint" (the loop's own checkpoint k: same config and data)
    rows_sha256: str = ""  # the candidate rows it started from: the loop's, or its own (ScoreFlow's scoring)


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
        run = _train(context, cfg, name, mframes, store, key, parent, lora_checkpoint.row(0, named=True))
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


def scoring_config(cfg: SpogwConfig) -> SpogwConfig:
    """The config the methods are scored with: the report's, on `comparison.split` (validation by default, so
    that choosing between methods never looks at the test split). On another split than the report's, none of
    the report's held-out rows are reused (the config hash differs)."""
    if cfg.comparison.split == cfg.report.split:
        return cfg
    return parse_config(deep_merge(cfg.canonical(), {"report": {"split": cfg.comparison.split}}))


def method_config(cfg: SpogwConfig, name: str) -> SpogwConfig:
    """The loop's config with method `name`'s curation/training overrides applied (validated as any config). The
    anchors' own loss (`training.off_policy_loss`) goes only to a method that trains the GRPO family on anchors;
    the others train as their papers do (the clipped default, which they never read)."""
    c = cfg.comparison
    d = deep_merge(cfg.canonical(), method_overrides(
        name, cfg.curation.n, cfg.curation.t, w4s_turns=c.w4s_turns, w4s_feedback_queries=c.w4s_feedback_queries))
    if not d["generator"].get("anchors") or registry.get(d["training"]["objective"]).data != "groups":
        d["training"]["off_policy_loss"] = "clipped"
    return parse_config(d)


def candidate_rows_sha256(sampled: pl.DataFrame, scores: pl.DataFrame) -> str:
    """One hash of the iteration's data every method starts from: each workflow's tokens and its score."""
    cols = ["iteration", "query_id", "sample_idx"]
    j = sampled.select(cols + ["completion_token_ids"]).join(scores.select(cols + ["status", "score"]), on=cols,
                                                             how="left").sort(cols)
    return hashlib.sha256(json.dumps(j.to_dicts(), sort_keys=True, default=str).encode()).hexdigest()


def method_examples(mcfg: SpogwConfig, cfg: SpogwConfig, sampled: pl.DataFrame, scores: pl.DataFrame,
                    sharpened: pl.DataFrame, iteration: int) -> tuple[list, pl.DataFrame, str | None]:
    """A method's training examples, the rows they used, and why there are none when its rows covered fewer than
    training.min_queries queries: the loop's sharpened groups when the method keeps the loop's curation, else
    curated again from the same scored rows with the method's curation."""
    if mcfg.curation != cfg.curation:
        cc = mcfg.curation_config()
        sharpened = curation.sharpen(curation.screen(tables.curation_input(sampled, scores), cc).groups, cc).members
    return training_inputs.iteration_training_data(mcfg.train_config(), mcfg.training.min_queries, sharpened,
                                                   sampled, scores, iteration)  # as the loop


def _train(context, cfg: SpogwConfig, name: str, frames, store: AssetStore, key: str, parent,
           checkpoint: dict[str, Any]) -> MethodRun:
    mcfg = method_config(cfg, name)
    tcfg = mcfg.train_config()
    examples, _, narrow = method_examples(mcfg, cfg, *frames, key_to_int(key))
    common = dict(method=name, objective=tcfg.objective, n_examples=len(examples),
                  examples_sha256=data_hash(examples), seed=tcfg.seed)
    path = store.adapter_dir(key)  # this assets directory's (the row's path may name where it was written)
    if checkpoint["trained"] and _trained_the_same(path, tcfg, common["examples_sha256"]):
        # the loop trained exactly this at k: same training config, data (hence seed) and parent
        say(context, f"{name}: the loop's lora_checkpoint[{key}] (same config and data)")
        return MethodRun(adapter=path, adapter_sha256=adapter_sha256(path), train_seconds=None,
                         reused="lora_checkpoint", **common)
    out = store.root / "comparison" / key / name
    if examples:
        say(context, f"{name}: training {tcfg.objective} on {len(examples)} examples")
        res = fit_adapter(examples, tcfg, out, base_model=cfg.generator.model,
                          previous_adapter=parent.path if parent else None, processes=cfg.training.processes)
        secs = res.stats.get("summary", {}).get("train_seconds")
    else:
        why = narrow or tcfg.spec.no_data  # the objective's own words, as lora_checkpoint says them
        context.log.warning(f"{name}: {why}; the parent policy stands in for it")
        carry_forward(out, parent.path if parent else None, tcfg, cfg.generator.model, reason=f"{name}: {why}")
        secs = None
    if not (out / ADAPTER_WEIGHTS).is_file():  # pragma: no cover - train_lora and carry_forward both write it
        raise dg.Failure(f"{name}: no adapter was written to {out}")
    return MethodRun(adapter=out, adapter_sha256=adapter_sha256(out), train_seconds=secs, reused="", **common)


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


def own_data_dir(store: AssetStore, key: str, name: str) -> Path:
    """Where method `name` keeps its own sampled and scored candidates of partition `key` (beside its adapter):
    sampling and scoring them takes hours on CPU for W4S's turns, and must not be redone when training or
    held-out scoring fails after."""
    return store.root / "comparison" / key / f"{name}.candidates"


def own_data_fingerprint(mcfg: SpogwConfig, parent, k: int) -> str:
    """What the candidates depend on: the sections of the method's config that sampling and scoring read
    (generator, executor, seeds, queries, turns; not `training`, so a learning rate does not sample them again),
    the parent adapter, the iteration, and the code that samples and scores them (a fix there makes them again)."""

    assets = ("sampled_workflows", "execution_scores")
    return json.dumps({"sections": {a: versions.section_hash(mcfg, a) for a in assets},
                       "parent_sha256": parent.sha256 if parent else None, "iteration": k,
                       "code": {a: versions.source_hash(a)[:16] for a in assets}}, sort_keys=True)


def stored_own_data(folder: Path, fingerprint: str) -> tuple[pl.DataFrame, pl.DataFrame] | None:
    """The stored (sampled, scores) when they were made with this fingerprint, else None (missing, another
    config or parent, or unreadable: they are made again)."""
    try:
        if (folder / "fingerprint.json").read_text() != fingerprint:
            return None
        return pl.read_parquet(folder / "sampled.parquet"), pl.read_parquet(folder / "scores.parquet")
    except (OSError, pl.exceptions.PolarsError):
        return None


def store_own_data(folder: Path, fingerprint: str, sampled: pl.DataFrame, scores: pl.DataFrame) -> None:
    """Written whole or not at all: built in a temp folder, then swapped in."""
    tmp = folder.parent / f".tmp-{folder.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        sampled.write_parquet(tmp / "sampled.parquet")
        scores.write_parquet(tmp / "scores.parquet")
        (tmp / "fingerprint.json").write_text(fingerprint)
        replace_dir(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _trained_the_same(adapter: Path, tcfg, examples_sha256: str) -> bool:
    """Whether the adapter's training record shows this config and these examples (the parent is checkpoint
    k-1 for both, by lineage)."""

    try:
        stats = json.loads((adapter / STATS_FILE).read_text())
    except (OSError, ValueError):
        return False
    same_config = (json.loads(json.dumps(config_identity(stats.get("config") or {})))
                   == json.loads(json.dumps(tcfg.identity())))  # the forward path taken is no difference
    return same_config and stats.get("hashes", {}).get("data") == examples_sha256


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


def comparison_frame(heldout: pl.DataFrame, runs: list[MethodRun], *, reference: str, iteration: int,
                     parent_sha256: str | None, config_hash: str, split_ids_sha256: str,
                     resamples: int, seed: int) -> pl.DataFrame:
    """The report's long format over methods (the reference labelled as the report's "previous", so each other
    system's diff is its paired difference to the reference), with what each method trained on."""
    labelled = heldout.with_columns(
        pl.when(pl.col("system") == reference).then(pl.lit("previous")).otherwise(pl.col("kind")).alias("kind"))
    rep = report_stats.summarize_heldout(labelled, iteration=iteration, config_hash=config_hash,
                                   split_ids_sha256=split_ids_sha256, resamples=resamples, seed=seed)
    rep = rep.with_columns(
        pl.when(pl.col("system") == reference).then(pl.lit("method")).otherwise(pl.col("kind")).alias("kind"),
        pl.lit(reference).alias("reference"))
    info = pl.DataFrame([{"system": r.method, "objective": r.objective, "n_examples": r.n_examples,
                          "examples_sha256": r.examples_sha256, "seed": r.seed, "train_seconds": r.train_seconds,
                          "reused": r.reused, "rows_sha256": r.rows_sha256 or None} for r in runs],
                        schema={"system": pl.String(), "objective": pl.String(), "n_examples": pl.Int64(),
                                "examples_sha256": pl.String(), "seed": pl.Int64(), "train_seconds": pl.Float64(),
                                "reused": pl.String(), "rows_sha256": pl.String()})
    out = (rep.rename({"system": "method", "diff_vs_prev": "diff_vs_reference"})
           .join(info.rename({"system": "method"}), on="method", how="left")
           .with_columns(pl.when(pl.col("kind") == "baseline").then(None).otherwise(pl.lit(parent_sha256))
                         .alias("parent_adapter_sha256")))
    return with_holm(out, labelled, reference=reference, resamples=resamples, seed=seed)


HOLM_COLUMNS = {"p_value": pl.Float64(), "p_holm": pl.Float64(), "holm_level": pl.Float64(),
                "holm_ci_low": pl.Float64(), "holm_ci_high": pl.Float64(), "family_size": pl.Int64(),
                "p_resamples": pl.Int64(), "test_role": pl.String()}
# The headline family: the benchmark's own metric (the answer score) of the trained methods, each in each mode,
# against the reference; Holm controls the family-wise error over it alone. The other metrics (validity,
# executes, trivial rates, reward) are diagnostics: an unadjusted p-value, no correction, labelled
# test_role = "diagnostic", never in the family, so they neither dilute the answer's test nor count as findings.
# The family's B is chosen so that Holm's first step can reject: a bootstrap p is at least 2/(B + 1) (two-sided;
# about 1/(B + 1) a side), so B = max(report.bootstrap_resamples, ⌈10·m/α⌉) (`stats.resamples_for_family`) puts
# the smallest attainable p near a fifth of α/m. E.g. the default methods (spogw, grpo, score_dpo, rwr) in two
# modes: m = 3 × 2 = 6, B = max(2000, 1200) = 2000, 2/2001 ≈ 0.0010 < 0.05/6 ≈ 0.0083. The family before issue
# 38 (every method × mode × metric, 72 members at B = 2000) could not reject anything: 2/2001 > 0.05/72.
FAMILY_METRIC = report_stats.HEADLINE_METRIC
HEADLINE, DIAGNOSTIC = report_stats.TEST_HEADLINE, report_stats.TEST_DIAGNOSTIC


def with_holm(table: pl.DataFrame, heldout: pl.DataFrame, *, reference: str, resamples: int, seed: int,
              alpha: float = 0.05) -> pl.DataFrame:
    """Paired-bootstrap p-values of every trained method's difference to the reference, and family-wise error
    control over the headline family: the answer score (`FAMILY_METRIC`) of each trained method in each mode
    (the static baselines' rows are context, not members). A family member gets its two-sided p-value
    (`stats.paired_bootstrap_p`, never 0), its Holm-adjusted p-value and its interval at Holm's level for its
    rank (`core.stats.holm_levels`), all with B = `stats.resamples_for_family(m, resamples)` so that the
    smallest attainable p is below α/m (with 2000 resamples and a family of 72 no difference could ever be
    significant). Diagnostics (every other metric) get an unadjusted p-value at `resamples` and no Holm
    columns; `test_role` says which a row is ("headline" or "diagnostic"; null: not tested). A member is
    significant under Holm when p_holm < α. `heldout`: the held-out rows with the reference labelled kind
    "previous"."""

    scored = heldout.filter(pl.col("status") != Status.EXECUTOR_ERROR.value)
    cols = {**report_stats.RATE_METRICS, **report_stats.MEAN_METRICS}
    rows = table.with_row_index("_i")
    tested = rows.filter(pl.col("diff_vs_reference").is_not_null() & pl.col("metric").is_in(list(cols))
                         & (pl.col("kind") == "method"))
    members, diagnostics = [], []
    for r in tested.iter_rows(named=True):
        mine = scored.filter((pl.col("system") == r["method"]) & (pl.col("mode") == r["mode"]))
        ref = scored.filter((pl.col("system") == reference) & (pl.col("mode") == r["mode"]))
        a, b = report_stats.paired_per_query(mine, ref, cols[r["metric"]])
        if not all(v is not None and math.isfinite(v) for x in (*a, *b) for v in x):
            continue  # a metric some rows lack (older partitions): no difference, not tested
        (members if r["metric"] == FAMILY_METRIC else diagnostics).append((r, a, b))
    add: dict[str, list] = {c: [None] * table.height for c in HOLM_COLUMNS}
    for r, a, b in diagnostics:
        add["p_value"][r["_i"]] = stats.paired_bootstrap_p(a, b, resamples=resamples, seed=seed)
        add["p_resamples"][r["_i"]] = resamples
        add["test_role"][r["_i"]] = DIAGNOSTIC
    big_b = stats.resamples_for_family(len(members), resamples, alpha)
    ps = [stats.paired_bootstrap_p(a, b, resamples=big_b, seed=seed) for _, a, b in members]
    adj, levels = stats.holm(ps), stats.holm_levels(ps, alpha)
    for (r, a, b), p, q, lv in zip(members, ps, adj, levels):
        _, lo, hi = stats.paired_bootstrap_diff(a, b, resamples=big_b, seed=seed, level=lv)
        for c, v in (("p_value", p), ("p_holm", q), ("holm_level", lv), ("holm_ci_low", lo), ("holm_ci_high", hi),
                     ("family_size", len(ps)), ("p_resamples", big_b), ("test_role", HEADLINE)):
            add[c][r["_i"]] = v
    return table.with_columns(*[pl.Series(c, add[c], dtype=t) for c, t in HOLM_COLUMNS.items()])


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
