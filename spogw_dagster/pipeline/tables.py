"""Pure table builders behind the assets (no Dagster, no model): one function per asset output.

Every frame has a fixed schema (also when empty) and an `iteration` column, so the Parquet files of all
iterations union cleanly in the DuckDB views.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import polars as pl

from spogw_dagster.types import Status

from .rewards import Ladder, ladder_reward

# ------------------------------------------------------------------------------------------------
# sampled_workflows

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
}


@dataclass
class Sample:
    """What the sampler returned for one workflow (a subset of `core.sampling.SampleResult`)."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str = "stop"


def parse_completion(text: str, family: str) -> tuple[str, str, str]:
    """(workflow code, parse status, error) for a completion of the generator prompt."""
    from spogw_dagster.workflow.parser import WorkflowRejected, parse_workflow
    from spogw_dagster.workflow.template import assemble_workflow

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
) -> pl.DataFrame:
    if not (len(query_ids) == len(prompts) == len(samples)):
        raise ValueError("query_ids, prompts and samples must have the same length")
    rows: list[dict[str, Any]] = []
    for qid, prompt, outs in zip(query_ids, prompts, samples):
        for j, s in enumerate(outs):
            code, status, err = parse_completion(s.text, family)
            rows.append({
                "iteration": iteration, "query_id": qid, "sample_idx": j, "prompt": prompt,
                "completion": s.text, "workflow": code, "parse_status": status, "parse_error": err,
                "finish_reason": s.finish_reason, "n_tokens": len(s.token_ids),
                "completion_token_ids": [int(t) for t in s.token_ids],
                "logprobs": [float(v) for v in s.logprobs], "sum_logprob": float(sum(s.logprobs)),
                "parent_iteration": parent_iteration, "parent_adapter_sha256": parent_sha256,
                "generator": generator,
            })
    return _frame(rows, SAMPLED_SCHEMA)


# ------------------------------------------------------------------------------------------------
# execution_scores

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
}


def execution_row(iteration: int, query_id: str, sample_idx: int, parse_status: str, result, ladder: Ladder,
                  *, max_answer_chars: int = 2000) -> dict[str, Any]:
    """One execution_scores row from an `evaluation.EvalResult` (or a rejected result with no runs)."""
    answer_score = float(result.score)
    return {
        "iteration": iteration, "query_id": query_id, "sample_idx": sample_idx,
        "status": result.status.value,
        "score": ladder_reward(ladder, parse_status, list(result.run_statuses), answer_score),
        "answer_score": answer_score, "runs": len(result.run_statuses),
        "run_statuses": list(result.run_statuses),
        "run_scores": [float(x) for x in result.run_scores],
        "llm_calls": result.usage.llm_calls, "cached_calls": result.usage.cached_calls,
        "prompt_tokens": result.usage.prompt_tokens, "completion_tokens": result.usage.completion_tokens,
        "wall_s": float(result.wall_s), "error": (result.error or "")[:2000],
        "answer": (result.answer or "")[:max_answer_chars], "isolation": result.isolation,
    }


def execution_frame(rows: Iterable[dict[str, Any]]) -> pl.DataFrame:
    return _frame(list(rows), EXECUTION_SCHEMA).sort(["iteration", "query_id", "sample_idx"])


def curation_input(sampled: pl.DataFrame, scores: pl.DataFrame) -> pl.DataFrame:
    """The frame `core.curation` expects: one row per sampled workflow with its code, score and status.

    Every sampled row must have a score row (an inner join would silently lose rows)."""
    key = ["iteration", "query_id", "sample_idx"]
    joined = sampled.select(key + ["workflow"]).join(scores.select(key + ["score", "status"]), on=key, how="left")
    missing = joined.filter(pl.col("status").is_null())
    if missing.height:
        r = missing.row(0, named=True)
        raise ValueError(f"{missing.height} sampled workflow(s) have no execution score, e.g. "
                         f"query {r['query_id']!r} sample {r['sample_idx']}; rematerialize execution_scores")
    return joined


# ------------------------------------------------------------------------------------------------
# screened_groups

SCREENED_SCHEMA: dict[str, pl.DataType] = {
    "iteration": pl.Int64(),
    "query_id": pl.String(),
    "group_id": pl.String(),  # null for a query that formed no group (too_few_workflows)
    "members": pl.List(pl.Int64()),
    "scores": pl.List(pl.Float64()),
    "score_mean": pl.Float64(),
    "score_std": pl.Float64(),
    "kept": pl.Boolean(),
    "reason": pl.String(),  # why a group was dropped; null when kept
}


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
    from spogw_dagster.core.curation import SCREENED_SCHEMA as CORE_SCREENED

    return screened.filter(pl.col("kept")).select(list(CORE_SCREENED)).cast(CORE_SCREENED)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------
# lora_checkpoint: training examples from sharpened groups


def training_examples(sharpened: pl.DataFrame, sampled: pl.DataFrame) -> list:
    """One `TrainExample` per sharpened member: the prompt, the sampled tokens and log-probs (π_old) and the
    group-normalised advantage. Ordered by (group_id, rank) so the dataset (and its hash) is deterministic.

    A member that occurs in several groups yields one example per group (the paper weights workflows that
    are extreme in many groups more). A member with no sampled row is an error."""
    from spogw_dagster.core.trainer import TrainExample

    if sharpened.height == 0:
        return []
    key = ["iteration", "query_id", "sample_idx"]
    cols = key + ["prompt", "completion", "completion_token_ids", "logprobs"]
    j = sharpened.join(sampled.select(cols), on=key, how="left").sort(["group_id", "rank"])
    missing = j.filter(pl.col("prompt").is_null())
    if missing.height:
        r = missing.row(0, named=True)
        raise ValueError(f"sharpened member {r['query_id']!r}/{r['sample_idx']} has no sampled workflow")
    out = []
    for r in j.iter_rows(named=True):
        out.append(TrainExample(
            prompt=r["prompt"], completion=r["completion"], advantage=float(r["advantage"]),
            score=float(r["score"]), old_logprobs=list(r["logprobs"]),
            completion_token_ids=list(r["completion_token_ids"]), group_id=r["group_id"],
        ))
    return out


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
}


def checkpoint_frame(row: dict[str, Any]) -> pl.DataFrame:
    return _frame([row], CHECKPOINT_SCHEMA)


def step_curve(steps: Sequence[dict[str, Any]], key: str) -> list[float]:
    return [float(s[key]) for s in steps if s.get(key) is not None]


# ------------------------------------------------------------------------------------------------
# benchmark_report

HELDOUT_SCHEMA: dict[str, pl.DataType] = {
    "iteration": pl.Int64(),
    "system": pl.String(),
    "query_id": pl.String(),
    "status": pl.String(),
    "score": pl.Float64(),
    "llm_calls": pl.Int64(),
    "cached_calls": pl.Int64(),
    "prompt_tokens": pl.Int64(),
    "completion_tokens": pl.Int64(),
    "workflow": pl.String(),
    "error": pl.String(),
}

REPORT_SCHEMA: dict[str, pl.DataType] = {
    "iteration": pl.Int64(),
    "system": pl.String(),  # "spogw@0001", "base", "baseline:io", ...
    "kind": pl.String(),  # checkpoint | previous | baseline
    "checkpoint_iteration": pl.Int64(),  # whose checkpoint generated the workflows (null: base / baseline)
    "adapter_sha256": pl.String(),  # that checkpoint's adapter hash
    "n": pl.Int64(),
    "scored": pl.Int64(),
    "solve_rate": pl.Float64(),
    "ci_low": pl.Float64(),
    "ci_high": pl.Float64(),
    "valid_rate": pl.Float64(),  # share of queries whose generated workflow parsed and validated
    "executor_errors": pl.Int64(),
    "llm_calls": pl.Int64(),
    "cached_calls": pl.Int64(),
    "prompt_tokens": pl.Int64(),
    "completion_tokens": pl.Int64(),
    "statuses": pl.String(),  # JSON {status: count}
    "delta_vs_previous": pl.Float64(),  # checkpoint row only
    "config_hash": pl.String(),
}


def heldout_rows(iteration: int, system: str, results: Sequence, workflows: Sequence[str]) -> list[dict[str, Any]]:
    return [{
        "iteration": iteration, "system": system, "query_id": r.query_id, "status": r.status.value,
        "score": float(r.score), "llm_calls": r.usage.llm_calls, "cached_calls": r.usage.cached_calls,
        "prompt_tokens": r.usage.prompt_tokens, "completion_tokens": r.usage.completion_tokens,
        "workflow": w, "error": (r.error or "")[:1000],
    } for r, w in zip(results, workflows)]


def heldout_frame(rows: Iterable[dict[str, Any]]) -> pl.DataFrame:
    return _frame(list(rows), HELDOUT_SCHEMA)


def summarize_system(iteration: int, system: str, kind: str, checkpoint_iteration: int | None,
                     heldout: pl.DataFrame, config_hash: str, adapter_sha256: str | None = None) -> dict[str, Any]:
    """A report row from one system's held-out rows: solve rate over scored queries (executor errors
    excluded) with a 95% Wilson interval, validity and cost."""
    from spogw_dagster.evaluation import wilson_interval

    rows = heldout.filter(pl.col("system") == system)
    statuses = rows["status"].to_list()
    scored = rows.filter(pl.col("status") != Status.EXECUTOR_ERROR.value)
    total = float(scored["score"].sum()) if scored.height else 0.0
    lo, hi = wilson_interval(total, scored.height)
    invalid = sum(s in (Status.FORMAT_ERROR.value, Status.INVALID.value) for s in statuses)
    return {
        "iteration": iteration, "system": system, "kind": kind, "checkpoint_iteration": checkpoint_iteration,
        "adapter_sha256": adapter_sha256, "n": rows.height, "scored": scored.height,
        "solve_rate": (total / scored.height) if scored.height else 0.0,
        "ci_low": round(lo, 4), "ci_high": round(hi, 4),
        "valid_rate": (1 - invalid / rows.height) if rows.height else 0.0,
        "executor_errors": rows.height - scored.height,
        "llm_calls": int(rows["llm_calls"].sum()), "cached_calls": int(rows["cached_calls"].sum()),
        "prompt_tokens": int(rows["prompt_tokens"].sum()), "completion_tokens": int(rows["completion_tokens"].sum()),
        "statuses": json.dumps(dict(sorted(Counter(statuses).items()))),
        "delta_vs_previous": None, "config_hash": config_hash,
    }


def reusable_previous(prev_report: pl.DataFrame | None, prev_heldout: pl.DataFrame | None, system: str,
                      adapter_sha256: str, config_hash: str, iteration: int) -> pl.DataFrame | None:
    """Held-out rows of `system` (checkpoint k-1) from report k-1, relabelled to `iteration`, when they were
    made with the same config and the same adapter (so generating them again would give the same rows);
    else None."""
    if prev_report is None or prev_heldout is None:
        return None
    row = prev_report.filter((pl.col("kind") == "checkpoint") & (pl.col("system") == system))
    if row.height != 1:
        return None
    r = row.row(0, named=True)
    if r["adapter_sha256"] != adapter_sha256 or r["config_hash"] != config_hash:
        return None
    rows = prev_heldout.filter(pl.col("system") == system)
    if rows.height != r["n"]:
        return None
    return rows.with_columns(pl.lit(iteration, dtype=pl.Int64()).alias("iteration"))


def report_frame(rows: Sequence[dict[str, Any]]) -> pl.DataFrame:
    """Report rows with delta_vs_previous filled in on the checkpoint row."""
    rows = [dict(r) for r in rows]
    prev = next((r for r in rows if r["kind"] == "previous"), None)
    for r in rows:
        if r["kind"] == "checkpoint" and prev is not None:
            r["delta_vs_previous"] = r["solve_rate"] - prev["solve_rate"]
    order = {"checkpoint": 0, "previous": 1, "baseline": 2}
    rows.sort(key=lambda r: (order.get(r["kind"], 9), r["system"]))
    return _frame(rows, REPORT_SCHEMA)


def report_table_text(report: pl.DataFrame) -> str:
    """A small fixed-width table for terminals and markdown metadata."""
    lines = ["| system | kind | solve rate | 95% CI | valid | executor calls (cached) |",
             "|---|---|---|---|---|---|"]
    for r in report.iter_rows(named=True):
        lines.append(f"| {r['system']} | {r['kind']} | {r['solve_rate']:.3f} ({_frac(r)}) | "
                     f"{r['ci_low']:.3f}-{r['ci_high']:.3f} | {r['valid_rate']:.2f} | "
                     f"{r['llm_calls']} ({r['cached_calls']}) |")
    return "\n".join(lines)


def _frac(r: dict[str, Any]) -> str:
    return f"{r['solve_rate'] * r['scored']:.4g}/{r['scored']}"


# ------------------------------------------------------------------------------------------------
# helpers


def _frame(rows: list[dict[str, Any]], schema: dict[str, pl.DataType]) -> pl.DataFrame:
    if not rows:
        return pl.DataFrame({k: [] for k in schema}, schema=schema)
    return pl.DataFrame({k: [r.get(k) for r in rows] for k in schema}, schema=schema)


def score_distribution(scores: Sequence[float], bins: int = 5) -> dict[str, int]:
    """Counts of scores in equal-width bins over [0, 1] (the last bin includes 1.0)."""
    out: dict[str, int] = {}
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        label = f"[{lo:.1f},{hi:.1f}{']' if b == bins - 1 else ')'}"
        out[label] = 0
    for s in scores:
        if s is None or (isinstance(s, float) and math.isnan(s)):
            continue
        b = min(bins - 1, max(0, int(float(s) * bins)))
        out[list(out)[b]] += 1
    return out
