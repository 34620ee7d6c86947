"""Pure table builders behind the assets (no Dagster, no model): one function per asset output.

Every frame has a fixed schema (also when empty) and an `iteration` column, so the Parquet files of all
iterations union cleanly in the DuckDB views.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import polars as pl

from spogw_dagster.contracts import Status
from spogw_dagster.core.curation import SCREENED_SCHEMA as CORE_SCREENED_SCHEMA
from spogw_dagster.core.rewards import Ladder, executes_share, is_trivial, ladder_reward
from spogw_dagster.workflow.parser import WorkflowRejected, parse_workflow
from spogw_dagster.workflow.runtime import INTERNAL_ERROR
from spogw_dagster.workflow.template import assemble_workflow

# ------------------------------------------------------------------------------------------------
# sampled_workflows

# finish_reason of a row the sampler did not write: the prompt's own workflow, added by `generator.anchors`
ANCHOR_FINISH = "anchor"

SAMPLED_SCHEMA: dict[str, pl.DataType] = {
    "iteration": pl.Int64(),
    "query_id": pl.String(),
    "sample_idx": pl.Int64(),
    "prompt": pl.String(),
    "completion": pl.String(),
    "workflow": pl.String(),  # validated code, or the assembled text when rejected
    "parse_status": pl.String(),  # ok | format_error | invalid
    "parse_error": pl.String(),
    "finish_reason": pl.String(),
    "n_tokens": pl.Int64(),
    "completion_token_ids": pl.List(pl.Int64()),
    "logprobs": pl.List(pl.Float64()),  # per sampled token under π_{k-1} (π_old)
    "sum_logprob": pl.Float64(),
    "parent_iteration": pl.Int64(),  # null at iteration 0 (the base model)
    "parent_adapter_sha256": pl.String(),
    "generator": pl.String(),
    "turn": pl.Int64(),  # W4S refinement turn (0: the first sample; see pipeline/domain/refinement.py)
    "parent_sample_idx": pl.Int64(),  # the turn-(t-1) state this one was sampled from; null at turn 0
    "repair_of": pl.Int64(),  # a self-check repair: the unparsed candidate it rewrites; null otherwise
    "feedback_accuracy": pl.Float64(),  # W4S: validation accuracy on the feedback queries; null if not run
}


@dataclass
class Sample:
    """What the sampler returned for one workflow (a subset of `core.inference.sampling.SampleResult`)."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str = "stop"


def parse_completion(text: str, family: str) -> tuple[str, str, str]:
    """(workflow code, parse status, error) for a completion of the generator prompt."""

    try:
        parsed = parse_workflow(text, family, completion=True)
        return parsed.code, Status.OK.value, ""
    except WorkflowRejected as e:
        return assemble_workflow(text or ""), e.status.value, e.reason


def sampled_frame(
    iteration: int,
    query_ids: Sequence[str],
    prompts: Sequence[str],
    samples: Sequence[Sequence[Sample]],
    family: str,
    *,
    parent_iteration: int | None,
    parent_sha256: str | None,
    generator: str,
    turn: int = 0,
    sample_idx: Sequence[Sequence[int]] | None = None,
    parent_sample_idx: Sequence[Sequence[int | None]] | None = None,
    repair_of: Sequence[Sequence[int | None]] | None = None,
) -> pl.DataFrame:
    """Rows of sampled_workflows. `sample_idx[i][j]` numbers sample j of query i (default j),
    `parent_sample_idx[i][j]` the state it was sampled from (refinement turns > 0; default none) and
    `repair_of[i][j]` the candidate it repairs (default none)."""
    if not (len(query_ids) == len(prompts) == len(samples)):
        raise ValueError("query_ids, prompts and samples must have the same length")
    rows: list[dict[str, Any]] = []
    for i, (qid, prompt, outs) in enumerate(zip(query_ids, prompts, samples)):
        for j, s in enumerate(outs):
            code, status, err = parse_completion(s.text, family)
            rows.append({
                "iteration": iteration, "query_id": qid, "sample_idx": sample_idx[i][j] if sample_idx else j,
                "turn": turn, "parent_sample_idx": parent_sample_idx[i][j] if parent_sample_idx else None,
                "repair_of": repair_of[i][j] if repair_of else None,
                "prompt": prompt[j] if isinstance(prompt, (list, tuple)) else prompt,
                "completion": s.text, "workflow": code, "parse_status": status, "parse_error": err,
                "finish_reason": s.finish_reason, "n_tokens": len(s.token_ids),
                "completion_token_ids": [int(t) for t in s.token_ids],
                "logprobs": [float(v) for v in s.logprobs], "sum_logprob": float(sum(s.logprobs)),
                "parent_iteration": parent_iteration, "parent_adapter_sha256": parent_sha256,
                "generator": generator,
            })
    return typed_frame(rows, SAMPLED_SCHEMA)


# ------------------------------------------------------------------------------------------------
# execution_scores

MAX_ANSWER_CHARS = 2000  # an answer longer than a solution needs is kept cut, not whole

EXECUTION_SCHEMA: dict[str, pl.DataType] = {
    "iteration": pl.Int64(),
    "query_id": pl.String(),
    "sample_idx": pl.Int64(),
    "status": pl.String(),
    "score": pl.Float64(),  # the training reward (the ladder; = answer_score with default weights)
    "answer_score": pl.Float64(),  # the benchmark metric, mean over runs
    "runs": pl.Int64(),
    "run_statuses": pl.List(pl.String()),
    "run_scores": pl.List(pl.Float64()),
    "llm_calls": pl.Int64(),
    "cached_calls": pl.Int64(),
    "prompt_tokens": pl.Int64(),
    "completion_tokens": pl.Int64(),
    "wall_s": pl.Float64(),
    "error": pl.String(),
    "answer": pl.String(),
    "isolation": pl.String(),
    "trivial": pl.Boolean(),  # valid, but its answer is no solution-writing operator's output (no executes credit)
    # whose the answer is (workflow/provenance.py): executor | workflow | none (nothing scorable); null: no answer
    "answer_origin": pl.String(),
    "workflow_answer": pl.Boolean(),  # answer_origin == "workflow": the workflow's own text, scored 0
    "executor_share": pl.Float64(),  # the executor-credited share of the answer's tokens (lowest over runs)
}


def execution_row(iteration: int, query_id: str, sample_idx: int, parse_status: str, result, ladder: Ladder,
                  *, workflow: str | None = None, max_answer_chars: int = MAX_ANSWER_CHARS) -> dict[str, Any]:
    """One execution_scores row from an `evaluation.EvalResult` (or a rejected result with no runs).
    `workflow`: the validated code (None when rejected), to tell trivial workflows apart."""
    answer_score = float(result.score)
    trivial = is_trivial(workflow, parse_status == Status.OK.value)
    return {
        "iteration": iteration, "query_id": query_id, "sample_idx": sample_idx,
        "status": result.status.value, "trivial": trivial, **origin_columns(result),
        "score": ladder_reward(ladder, parse_status, list(result.run_statuses), answer_score, trivial,
                               getattr(result, "run_produced", ()), result.usage.llm_calls),
        "answer_score": answer_score, "runs": len(result.run_statuses),
        "run_statuses": list(result.run_statuses),
        "run_scores": [float(x) for x in result.run_scores],
        "llm_calls": result.usage.llm_calls, "cached_calls": result.usage.cached_calls,
        "prompt_tokens": result.usage.prompt_tokens, "completion_tokens": result.usage.completion_tokens,
        "wall_s": float(result.wall_s), "error": (result.error or "")[:2000],
        "answer": (result.answer or "")[:max_answer_chars], "isolation": result.isolation,
    }


def origin_columns(result) -> dict[str, Any]:
    """answer_origin, workflow_answer and executor_share of an `evaluation.EvalResult` (None when rejected)."""
    origin = getattr(result, "answer_origin", None)
    return {"answer_origin": origin, "workflow_answer": origin == "workflow",
            "executor_share": getattr(result, "executor_share", None)}


def internal_error_rows(scores: pl.DataFrame) -> pl.DataFrame:
    """The execution_scores rows of runs that tripped a bug of ours (`runtime.INTERNAL_ERROR`)."""

    return scores.filter(pl.col("error").fill_null("").str.starts_with(INTERNAL_ERROR))


def execution_frame(rows: Iterable[dict[str, Any]]) -> pl.DataFrame:
    return typed_frame(list(rows), EXECUTION_SCHEMA).sort(["iteration", "query_id", "sample_idx"])


def prompt_groups(sampled: pl.DataFrame) -> pl.Series:
    """`core.curation`'s prompt_group of each sampled row: null for the prompt of its query's lowest sample_idx
    (single-shot sampling: every row), else "p" + the first 10 hex digits of the prompt's sha256 (the prompts
    of W4S refinement turns), so no group or pair mixes completions of two prompts."""
    first = {}
    for r in sampled.sort(["iteration", "query_id", "sample_idx"]).iter_rows(named=True):
        first.setdefault((r["iteration"], r["query_id"]), r["prompt"])
    out = [None if p == first[(it, q)] else "p" + hashlib.sha256((p or "").encode()).hexdigest()[:10]
           for it, q, p in zip(sampled["iteration"].to_list(), sampled["query_id"].to_list(),
                               sampled["prompt"].to_list())]
    return pl.Series("prompt_group", out, dtype=pl.String())


def curation_input(sampled: pl.DataFrame, scores: pl.DataFrame) -> pl.DataFrame:
    """The frame `core.curation` expects: one row per sampled workflow with its code, score, status, prompt
    group (`prompt_groups`) and whether it is an anchor (one of the prompt's own workflows).

    Every sampled row must have a score row (an inner join would silently lose rows)."""
    key = ["iteration", "query_id", "sample_idx"]
    anchor = (pl.col("finish_reason") == ANCHOR_FINISH) if "finish_reason" in sampled.columns else pl.lit(False)
    left = sampled.select(*key, "workflow", prompt_groups(sampled), anchor.alias("anchor"))
    joined = left.join(scores.select(key + ["score", "status"]), on=key, how="left")
    missing = joined.filter(pl.col("status").is_null())
    if missing.height:
        r = missing.row(0, named=True)
        raise ValueError(f"{missing.height} sampled workflow(s) have no execution score, e.g. "
                         f"query {r['query_id']!r} sample {r['sample_idx']}; rematerialize execution_scores")
    return joined


# ------------------------------------------------------------------------------------------------
# screened_groups

# the core's kept groups (group_id null for a query that formed no group: too_few_workflows) and whether each
# was kept, with why not
SCREENED_SCHEMA: dict[str, pl.DataType] = {**CORE_SCREENED_SCHEMA, "kept": pl.Boolean(), "reason": pl.String()}


def screened_frame(kept: pl.DataFrame, dropped: pl.DataFrame) -> pl.DataFrame:
    """Kept screened groups and dropped groups in one table (kept flag + reason)."""
    k = kept.with_columns(pl.lit(True).alias("kept"), pl.lit(None, dtype=pl.String()).alias("reason"))
    d = dropped.with_columns(
        pl.lit(None, dtype=pl.List(pl.Float64())).alias("scores"),
        pl.lit(None, dtype=pl.Float64()).alias("score_mean"),
        pl.lit(False).alias("kept"),
    )
    cols = list(SCREENED_SCHEMA)
    out = pl.concat([k.select(cols).cast(SCREENED_SCHEMA), d.select(cols).cast(SCREENED_SCHEMA)])  # type: ignore[arg-type]
    return out.sort(["iteration", "query_id", "kept", "group_id"], descending=[False, False, True, False],
                    nulls_last=True)


def kept_groups(screened: pl.DataFrame) -> pl.DataFrame:
    """The kept groups in the shape `core.curation.sharpen_groups` takes."""
    return screened.filter(pl.col("kept")).select(list(CORE_SCREENED_SCHEMA)).cast(CORE_SCREENED_SCHEMA)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------
# lora_checkpoint: the data path of each objective, and the rows it used (the training_rows side table)
#
# spogw / grpo / grpo_nokl train on the sharpened groups (`training_examples`, unchanged). The baselines are
# fed as their papers feed them, from the iteration's full scored candidate set (sampled_workflows joined with
# execution_scores, executor errors excluded, near-duplicates kept: `core.curation.scored_candidates`):
#   score_dpo  ScoreFlow's pairs, drawn once per iteration ∝ (s_w − s_l)^power, a fixed budget
#              (`dpo_num_pairs`); each draw is two examples, "chosen" and "rejected", sharing group_id.
#              Only workflows that ran pair (`core.curation.ran_mask`: status ok, no run a sandbox violation,
#              not trivial), compared on answer_score (ScoreFlow regenerates until a workflow runs and scores
#              the answer).
#   rwr        W4S: each candidate that ran (the same `ran_mask`) with an answer score above 0.05, once,
#              weight exp(r / T).

TRAINING_ROWS_SCHEMA: dict[str, pl.DataType] = {
    "iteration": pl.Int64(),
    "objective": pl.String(),
    "example_idx": pl.Int64(),  # position in the trainer's example list
    "query_id": pl.String(),
    "sample_idx": pl.Int64(),
    "role": pl.String(),  # top | bottom (sharpened member), chosen | rejected (score_dpo), candidate (rwr)
    "group_id": pl.String(),  # the sharpened group; the pair (score_dpo); null for rwr
    "draw": pl.Int64(),  # score_dpo: the pair's draw index; null otherwise
    "weight": pl.Float64(),  # rwr: exp(r/T); score_dpo: the pair's (s_w − s_l)^power; null otherwise
    "probability": pl.Float64(),  # score_dpo: the pair's probability per draw; null otherwise
    "advantage": pl.Float64(),  # spogw / grpo / grpo_nokl: Â; null otherwise
    "score": pl.Float64(),  # the row's score (the reward r)
}


CHECKPOINT_SCHEMA: dict[str, pl.DataType] = {
    "iteration": pl.Int64(),
    "adapter_path": pl.String(),
    "adapter_sha256": pl.String(),
    "parent_iteration": pl.Int64(),
    "parent_adapter_sha256": pl.String(),
    "trained": pl.Boolean(),  # False: no training data, the parent's policy was carried forward unchanged
    "reused": pl.Boolean(),  # True: an identical earlier run (same run hash) was reused
    "n_examples": pl.Int64(),
    "optimizer_steps": pl.Int64(),
    "first_loss": pl.Float64(),
    "last_loss": pl.Float64(),
    "loss_curve": pl.List(pl.Float64()),
    "kl_curve": pl.List(pl.Float64()),
    "train_seconds": pl.Float64(),
    "run_hash": pl.String(),
    "objective": pl.String(),
    # checkpoint selection (`selection.enabled`; null when off): whether the trained adapter became this
    # checkpoint (False: π_{k-1} carried forward), and both greedy validation answer scores it was judged on
    "selected": pl.Boolean(),
    "validation_answer": pl.Float64(),
    "validation_parent_answer": pl.Float64(),
    "selected_epochs": pl.Int64(),  # the training length the gate judged (the best on validation of selection.epochs)
}


def checkpoint_frame(row: dict[str, Any]) -> pl.DataFrame:
    return typed_frame([row], CHECKPOINT_SCHEMA)


# ------------------------------------------------------------------------------------------------
# benchmark_report: per-sample held-out rows (heldout_results) and the long-format report
#
# A *system* is this checkpoint ("spogw@0001", kind checkpoint), π_{k-1} ("spogw@0000" or "base", kind
# previous) or a static baseline ("baseline:io", kind baseline); a *mode* is greedy (one workflow per query,
# sample_idx 0) or sampled (sample_idx 0..k-1 at the training temperature). Sample j of query q has the same
# sampler call and executor seed for every system, so rows pair on (mode, query_id, sample_idx).

HELDOUT_SCHEMA: dict[str, pl.DataType] = {
    "iteration": pl.Int64(),
    "split": pl.String(),  # test | validation
    "system": pl.String(),
    "kind": pl.String(),  # checkpoint | previous | baseline
    "mode": pl.String(),  # greedy | sampled
    "greedy": pl.Boolean(),
    "query_id": pl.String(),
    "sample_idx": pl.Int64(),
    # the generator sampler call's seed, the same for every policy: one call per policy and mode with the
    # same prompts in the same order and n, so sample j of query q gets the same per-row seed (the sampler
    # derives it from (seed, query index, j)) under both policies (null: baselines)
    "seed": pl.Int64(),
    "exec_seed": pl.Int64(),  # the executor seed of this sample's runs (same for every system)
    "temperature": pl.Float64(),  # generator temperature (null for baselines)
    "parse_status": pl.String(),  # ok | format_error | invalid
    "status": pl.String(),  # the run's status (ok, runtime_error, ..., or the parse status when rejected)
    "valid": pl.Boolean(),  # parsed and passed the validator
    "executes": pl.Float64(),  # share of runs that finished with a result (0 when invalid or trivial)
    "reward": pl.Float64(),  # the configured ladder, as execution_scores.score
    "answer_score": pl.Float64(),  # the benchmark metric, mean over runs
    "trivial": pl.Boolean(),  # valid, but its answer is no solution-writing operator's output (rewards.is_trivial)
    # a generated workflow equal, after normalising names and layout, to one the prompt shows (workflow/copies.py):
    # "template", "example 1", ...; null when it is not one, and for baselines
    "copied_from": pl.String(),
    "near_copy": pl.Boolean(),
    "answer_origin": pl.String(),  # as execution_scores: executor | workflow | none; null when no run answered
    "workflow_answer": pl.Boolean(),  # the answer was the workflow's own text (scored 0; workflow_answer_rate)
    "executor_share": pl.Float64(),
    "finish_reason": pl.String(),
    "n_tokens": pl.Int64(),  # generated tokens (0 for baselines)
    "llm_calls": pl.Int64(),
    "cached_calls": pl.Int64(),
    "prompt_tokens": pl.Int64(),
    "completion_tokens": pl.Int64(),
    "checkpoint_iteration": pl.Int64(),  # whose checkpoint generated the workflow (null: base / baseline)
    "adapter_sha256": pl.String(),
    "workflow": pl.String(),
    # what the workflow answered (its first run's answer, as execution_scores keeps it; "" when it did not
    # answer), so a checkpoint's answers can be read and scored again
    "answer": pl.String(),
    "error": pl.String(),
}

REPORT_SCHEMA: dict[str, pl.DataType] = {
    "iteration": pl.Int64(),
    "split": pl.String(),
    "system": pl.String(),
    "kind": pl.String(),
    "mode": pl.String(),
    "metric": pl.String(),  # see METRICS
    "value": pl.Float64(),
    "ci_low": pl.Float64(),  # 95% interval (null for cost totals)
    "ci_high": pl.Float64(),
    "ci_method": pl.String(),  # wilson | wilson_deff | cluster_bootstrap | none
    "n": pl.Int64(),  # samples scored (executor errors excluded)
    "n_queries": pl.Int64(),
    "diff_vs_prev": pl.Float64(),  # mean paired difference to π_{k-1} on the same queries and seeds
    "diff_ci_low": pl.Float64(),  # paired bootstrap over queries, percentile 95%
    "diff_ci_high": pl.Float64(),
    "n_pairs": pl.Int64(),
    "checkpoint_iteration": pl.Int64(),
    "adapter_sha256": pl.String(),
    "config_hash": pl.String(),
    "split_ids_sha256": pl.String(),
}
KIND_ORDER = {"checkpoint": 0, "previous": 1, "baseline": 2}
@dataclass(frozen=True)
class HeldoutSample:
    """Where one held-out workflow came from (everything heldout_results records besides the result)."""

    system: str
    kind: str
    mode: str
    query_id: str
    sample_idx: int
    seed: int | None
    exec_seed: int
    temperature: float | None
    parse_status: str
    workflow: str
    finish_reason: str = ""
    n_tokens: int = 0
    checkpoint_iteration: int | None = None
    adapter_sha256: str | None = None
    copied_from: str | None = None  # what it is a near copy of (generated workflows only)


def heldout_row(iteration: int, split: str, s: HeldoutSample, result, ladder: Ladder) -> dict[str, Any]:
    """One heldout_results row from a sample's origin and its `evaluation.EvalResult`."""
    valid = s.parse_status == Status.OK.value
    runs = list(result.run_statuses)
    produced = list(getattr(result, "run_produced", ()))
    answer = float(result.score) if valid else 0.0
    trivial = is_trivial(s.workflow, valid)
    return {
        "iteration": iteration, "split": split, "system": s.system, "kind": s.kind, "mode": s.mode,
        "greedy": s.mode == "greedy", "query_id": s.query_id, "sample_idx": s.sample_idx, "seed": s.seed,
        "exec_seed": s.exec_seed, "temperature": s.temperature, "parse_status": s.parse_status,
        "status": result.status.value, "valid": valid,
        # the reward's executes rung exactly: a trivial workflow (its answer is no operator's output) earns none
        "executes": executes_share(runs, produced, valid=valid, trivial=trivial),
        "reward": ladder_reward(ladder, s.parse_status, runs, answer, trivial, produced, result.usage.llm_calls),
        "answer_score": answer,
        "trivial": trivial, "copied_from": s.copied_from, "near_copy": s.copied_from is not None,
        **origin_columns(result), "finish_reason": s.finish_reason, "n_tokens": s.n_tokens,
        "llm_calls": result.usage.llm_calls, "cached_calls": result.usage.cached_calls,
        "prompt_tokens": result.usage.prompt_tokens, "completion_tokens": result.usage.completion_tokens,
        "checkpoint_iteration": s.checkpoint_iteration, "adapter_sha256": s.adapter_sha256,
        "workflow": s.workflow, "answer": (result.answer or "")[:MAX_ANSWER_CHARS],
        "error": (result.error or "")[:1000],
    }


def heldout_frame(rows: Iterable[dict[str, Any]]) -> pl.DataFrame:
    return typed_frame(list(rows), HELDOUT_SCHEMA).sort(
        [pl.col("kind").replace_strict(KIND_ORDER, default=9), "system", "mode", "query_id", "sample_idx"])


def with_baseline_columns(rows: pl.DataFrame) -> pl.DataFrame:
    """Baseline rows cached before the copy columns existed: a static baseline is never a copy of the prompt
    (it has no generator), so the values are known. Other missing columns stay missing (not reused)."""
    add = []
    if "copied_from" not in rows.columns:
        add.append(pl.lit(None, dtype=pl.String()).alias("copied_from"))
    if "near_copy" not in rows.columns:
        add.append(pl.lit(False).alias("near_copy"))
    rows = rows.with_columns(add) if add else rows
    if set(HELDOUT_SCHEMA) <= set(rows.columns):  # the schema's order, so it concatenates with fresh rows
        rows = rows.select(list(HELDOUT_SCHEMA))
    return rows


def relabel(rows: pl.DataFrame, iteration: int, kind: str | None = None) -> pl.DataFrame:
    """Reused rows (π_{k-1}'s from report k-1, cached baselines) under this report's iteration (and kind)."""
    out = rows.with_columns(pl.lit(iteration, dtype=pl.Int64()).alias("iteration"))
    return out.with_columns(pl.lit(kind).alias("kind")) if kind else out


# ------------------------------------------------------------------------------------------------
# helpers


def typed_frame(rows: list[dict[str, Any]], schema: dict[str, pl.DataType]) -> pl.DataFrame:
    if not rows:
        return pl.DataFrame({k: [] for k in schema}, schema=schema)
    return pl.DataFrame({k: [r.get(k) for r in rows] for k in schema}, schema=schema)
