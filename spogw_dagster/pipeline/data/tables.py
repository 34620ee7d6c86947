"""Pure table builders behind the assets (no Dagster, no model): one function per asset output.

Every frame has a fixed schema (also when empty) and an `iteration` column, so the Parquet files of all
iterations union cleanly in the DuckDB views.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import polars as pl

from spogw_dagster.contracts import Status
from spogw_dagster.core import registry
from spogw_dagster.seeds import offset_seed
from spogw_dagster.core.curation import SCREENED_SCHEMA as CORE_SCREENED_SCHEMA

from spogw_dagster.pipeline.domain.rewards import Ladder, executes_share, is_trivial, ladder_reward

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
    "turn": pl.Int64(),  # W4S refinement turn (0: the first sample; see pipeline/domain/refinement.py)
    "parent_sample_idx": pl.Int64(),  # the turn-(t-1) state this one was sampled from; null at turn 0
    "repair_of": pl.Int64(),  # a self-check repair: the unparsed candidate it rewrites; null otherwise
    "feedback_accuracy": pl.Float64(),  # W4S: validation accuracy on the feedback queries; null if not run
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
    "trivial": pl.Boolean(),  # valid, but its answer is no solution-writing operator's output (no executes credit)
}


def execution_row(iteration: int, query_id: str, sample_idx: int, parse_status: str, result, ladder: Ladder,
                  *, workflow: str | None = None, max_answer_chars: int = 2000) -> dict[str, Any]:
    """One execution_scores row from an `evaluation.EvalResult` (or a rejected result with no runs).
    `workflow`: the validated code (None when rejected), to tell trivial workflows apart."""
    answer_score = float(result.score)
    trivial = is_trivial(workflow, parse_status == Status.OK.value)
    return {
        "iteration": iteration, "query_id": query_id, "sample_idx": sample_idx,
        "status": result.status.value, "trivial": trivial,
        "score": ladder_reward(ladder, parse_status, list(result.run_statuses), answer_score, trivial,
                               getattr(result, "run_produced", ())),
        "answer_score": answer_score, "runs": len(result.run_statuses),
        "run_statuses": list(result.run_statuses),
        "run_scores": [float(x) for x in result.run_scores],
        "llm_calls": result.usage.llm_calls, "cached_calls": result.usage.cached_calls,
        "prompt_tokens": result.usage.prompt_tokens, "completion_tokens": result.usage.completion_tokens,
        "wall_s": float(result.wall_s), "error": (result.error or "")[:2000],
        "answer": (result.answer or "")[:max_answer_chars], "isolation": result.isolation,
    }


def internal_error_rows(scores: pl.DataFrame) -> pl.DataFrame:
    """The execution_scores rows of runs that tripped a bug of ours (`runtime.INTERNAL_ERROR`)."""
    from spogw_dagster.workflow.runtime import INTERNAL_ERROR

    return scores.filter(pl.col("error").fill_null("").str.starts_with(INTERNAL_ERROR))


def execution_frame(rows: Iterable[dict[str, Any]]) -> pl.DataFrame:
    return _frame(list(rows), EXECUTION_SCHEMA).sort(["iteration", "query_id", "sample_idx"])


def prompt_groups(sampled: pl.DataFrame) -> pl.Series:
    """`core.curation`'s prompt_group of each sampled row: null for the prompt of its query's lowest sample_idx
    (single-shot sampling: every row), else "p" + the first 10 hex digits of the prompt's sha256 (the prompts
    of W4S refinement turns), so no group or pair mixes completions of two prompts."""
    import hashlib

    first = {}
    for r in sampled.sort(["iteration", "query_id", "sample_idx"]).iter_rows(named=True):
        first.setdefault((r["iteration"], r["query_id"]), r["prompt"])
    out = [None if p == first[(it, q)] else "p" + hashlib.sha256((p or "").encode()).hexdigest()[:10]
           for it, q, p in zip(sampled["iteration"].to_list(), sampled["query_id"].to_list(),
                               sampled["prompt"].to_list())]
    return pl.Series("prompt_group", out, dtype=pl.String())


def curation_input(sampled: pl.DataFrame, scores: pl.DataFrame) -> pl.DataFrame:
    """The frame `core.curation` expects: one row per sampled workflow with its code, score, status and prompt
    group (`prompt_groups`).

    Every sampled row must have a score row (an inner join would silently lose rows)."""
    key = ["iteration", "query_id", "sample_idx"]
    left = sampled.select(key + ["workflow"]).with_columns(prompt_groups(sampled))
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


# ------------------------------------------------------------------------------------------------
# lora_checkpoint: the data path of each objective, and the rows it used (the training_rows side table)
#
# spogw / grpo / grpo_nokl train on the sharpened groups (`training_examples`, unchanged). The baselines are
# fed as their papers feed them, from the iteration's full scored candidate set (sampled_workflows joined with
# execution_scores, executor errors excluded, near-duplicates kept: `core.curation.scored_candidates`):
#   score_dpo  ScoreFlow's pairs, drawn once per iteration ∝ (s_w − s_l)^power, a fixed budget
#              (`dpo_num_pairs`); each draw is two examples, "chosen" and "rejected", sharing group_id.
#   rwr        W4S: every candidate once, weight exp(r / T).

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

_SAMPLED_TRAIN_COLS = ["prompt", "completion", "completion_token_ids", "logprobs"]
_KEY = ["iteration", "query_id", "sample_idx"]


def pair_seed(seed: int, iteration: int) -> int:
    """The seed of iteration k's pair draw (another draw each iteration, the same on a rerun)."""
    return offset_seed(seed, iteration)


def training_data(objective: str, sharpened: pl.DataFrame, sampled: pl.DataFrame, scores: pl.DataFrame,
                  ocfg, iteration: int) -> tuple[list, pl.DataFrame]:
    """(training examples, training_rows) of `objective` (`ocfg`: a `core.hyperparams.ObjectiveConfig`)."""
    data = registry.get(objective).data  # what the objective trains on (core.registry)
    if data == "pairs":
        return score_dpo_training_data(sampled, scores, ocfg, iteration, objective=objective)
    if data == "candidates":
        return rwr_training_data(sampled, scores, ocfg, iteration, objective=objective)
    return sharpened_training_data(sharpened, sampled, objective, iteration)


def sharpened_training_data(sharpened: pl.DataFrame, sampled: pl.DataFrame, objective: str,
                            iteration: int) -> tuple[list, pl.DataFrame]:
    """The GRPO family's data: `training_examples` (one example per sharpened member and group) and its rows."""
    examples = training_examples(sharpened, sampled)
    rows = sharpened.sort(["group_id", "rank"]) if sharpened.height else sharpened
    out = [{"iteration": iteration, "objective": objective, "example_idx": i, "query_id": r["query_id"],
            "sample_idx": r["sample_idx"], "role": r["role"], "group_id": r["group_id"],
            "advantage": float(r["advantage"]), "score": float(r["score"])}
           for i, r in enumerate(rows.iter_rows(named=True))]
    return examples, _frame(out, TRAINING_ROWS_SCHEMA)


def training_candidates(sampled: pl.DataFrame, scores: pl.DataFrame) -> pl.DataFrame:
    """The iteration's full scored candidate set with what training needs: `core.curation.scored_candidates`
    of the joined tables (executor errors out, near-duplicates kept, as ScoreFlow), joined back with the
    sampled prompt, completion, tokens and log-probs. A row whose completion has no tokens is left out (there
    is nothing to train on; the trainer refuses empty completions)."""
    from spogw_dagster.core.curation import scored_candidates as core_candidates

    usable, _ = core_candidates(curation_input(sampled, scores))
    j = usable.join(sampled.select(_KEY + _SAMPLED_TRAIN_COLS), on=_KEY, how="left")
    return j.filter(pl.col("completion_token_ids").list.len() > 0).sort(_KEY)


def _example(r: dict[str, Any], *, group_id: Any, role: str | None = None, advantage: float = 0.0):
    from spogw_dagster.core.trainer import TrainExample

    return TrainExample(prompt=r["prompt"], completion=r["completion"], advantage=advantage,
                        score=float(r["score"]), old_logprobs=list(r["logprobs"]),
                        completion_token_ids=list(r["completion_token_ids"]), group_id=group_id, role=role)


def score_dpo_training_data(sampled: pl.DataFrame, scores: pl.DataFrame, ocfg, iteration: int,
                            objective: str = "score_dpo") -> tuple[list, pl.DataFrame]:
    """ScoreFlow's data: `ocfg.dpo_num_pairs` draws (None: as many as candidate pairs) with replacement over all
    candidate pairs of all queries, ∝ (s_w − s_l)^`dpo_pair_power`, seeded by `pair_seed`. Each draw gives two
    examples, chosen then rejected, with group_id "pair:<draw>" (the trainer pairs them and keeps them in one
    micro-batch); a pair drawn twice trains twice, as in ScoreFlow."""
    from spogw_dagster.core.curation import sample_preference_pairs

    cands = training_candidates(sampled, scores)
    pairs = sample_preference_pairs(cands, ocfg.dpo_num_pairs, power=ocfg.dpo_pair_power,
                                    seed=pair_seed(ocfg.seed, iteration))
    by_key = {(r["query_id"], r["sample_idx"]): r for r in cands.iter_rows(named=True)}
    examples, rows = [], []
    for p in pairs.iter_rows(named=True):
        gid = f"pair:{p['draw']}"
        for role, idx in (("chosen", p["chosen_idx"]), ("rejected", p["rejected_idx"])):
            r = by_key[(p["query_id"], idx)]
            rows.append({"iteration": iteration, "objective": objective, "example_idx": len(examples),
                         "query_id": p["query_id"], "sample_idx": idx, "role": role, "group_id": gid,
                         "draw": p["draw"], "weight": p["weight"], "probability": p["probability"],
                         "score": float(r["score"])})
            examples.append(_example(r, group_id=gid, role=role))
    return examples, _frame(rows, TRAINING_ROWS_SCHEMA)


def rwr_training_data(sampled: pl.DataFrame, scores: pl.DataFrame, ocfg, iteration: int,
                      objective: str = "rwr") -> tuple[list, pl.DataFrame]:
    """W4S's data: every scored candidate once (all turns and repairs), in key order, with reward r and weight
    exp(r / `rwr_temperature`) (the loss computes the same weight from r). r is `w4s_rewards` (W4S's
    history-relative reward, `ocfg.rwr_reward = "w4s"`) or the row's ladder score ("score")."""
    import math

    cands = training_candidates(sampled, scores)
    if getattr(ocfg, "rwr_reward", "w4s") == "w4s":
        reward = w4s_rewards(sampled, scores)
        r_of = [reward[(r["query_id"], r["sample_idx"])] for r in cands.iter_rows(named=True)]
    else:
        r_of = [float(v) for v in cands["score"].to_list()]
    examples, rows = [], []
    for r, rew in zip(cands.iter_rows(named=True), r_of):
        w = math.exp(rew / ocfg.rwr_temperature)
        rows.append({"iteration": iteration, "objective": objective, "example_idx": len(examples),
                     "query_id": r["query_id"], "sample_idx": r["sample_idx"], "role": "candidate",
                     "weight": w, "score": rew})
        examples.append(_example({**r, "score": rew}, group_id=r["query_id"]))
    return examples, _frame(rows, TRAINING_ROWS_SCHEMA)


def w4s_rewards(sampled: pl.DataFrame, scores: pl.DataFrame) -> dict[tuple[str, int], float]:
    """(query_id, sample_idx) → W4S's reward (`core.w4s.history_rewards`) of every scored row: its answer score
    against the best answer of earlier turns of its query and against the state it was sampled from
    (`parent_sample_idx`). Executor errors have no accuracy: no reward, and left out of the history."""
    from spogw_dagster.core.w4s import Candidate, history_rewards

    cols = [c for c in ("turn", "parent_sample_idx") if c in sampled.columns]
    j = sampled.select(_KEY + cols).join(scores.select(_KEY + ["answer_score", "status"]), on=_KEY, how="left")
    cands = []
    for r in j.iter_rows(named=True):
        unscored = r["status"] is None or r["status"] == Status.EXECUTOR_ERROR.value
        cands.append(Candidate(r["query_id"], int(r.get("turn") or 0), int(r["sample_idx"]), r.get("parent_sample_idx"),
                               None if unscored else float(r["answer_score"] or 0.0)))
    return {(x.candidate.query_id, x.candidate.sample_idx): x.reward for x in history_rewards(cands)}


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
    "finish_reason": pl.String(),
    "n_tokens": pl.Int64(),  # generated tokens (0 for baselines)
    "llm_calls": pl.Int64(),
    "cached_calls": pl.Int64(),
    "prompt_tokens": pl.Int64(),
    "completion_tokens": pl.Int64(),
    "checkpoint_iteration": pl.Int64(),  # whose checkpoint generated the workflow (null: base / baseline)
    "adapter_sha256": pl.String(),
    "workflow": pl.String(),
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

# metric -> heldout column; rates get (design-effect) Wilson intervals, means a query bootstrap
RATE_METRICS = {"valid_rate": "valid", "executes_rate": "executes", "trivial_rate": "trivial",
                "near_copy_rate": "near_copy"}
MEAN_METRICS = {"answer_score": "answer_score", "mean_reward": "reward"}
# the headline: the benchmark's own metric (pass@1 / exact answer); the others are diagnostics
HEADLINE_METRIC = "answer_score"
COST_METRICS = {"executor_calls": "llm_calls", "cached_calls": "cached_calls", "prompt_tokens": "prompt_tokens",
                "completion_tokens": "completion_tokens"}
METRICS = ("answer_score", *RATE_METRICS, "mean_reward", "distinct_per_query", "executor_errors", *COST_METRICS)
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
        "reward": ladder_reward(ladder, s.parse_status, runs, answer, trivial, produced), "answer_score": answer,
        "trivial": trivial, "copied_from": s.copied_from, "near_copy": s.copied_from is not None,
        "finish_reason": s.finish_reason, "n_tokens": s.n_tokens,
        "llm_calls": result.usage.llm_calls, "cached_calls": result.usage.cached_calls,
        "prompt_tokens": result.usage.prompt_tokens, "completion_tokens": result.usage.completion_tokens,
        "checkpoint_iteration": s.checkpoint_iteration, "adapter_sha256": s.adapter_sha256,
        "workflow": s.workflow, "error": (result.error or "")[:1000],
    }


def heldout_frame(rows: Iterable[dict[str, Any]]) -> pl.DataFrame:
    return _frame(list(rows), HELDOUT_SCHEMA).sort(
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


def _per_query(rows: pl.DataFrame, col: str) -> list[list[float]]:
    g = rows.group_by("query_id", maintain_order=True).agg(pl.col(col).cast(pl.Float64()).alias("v"))
    return [list(v) for v in g.sort("query_id")["v"].to_list()]


def _paired(rows: pl.DataFrame, prev: pl.DataFrame, col: str) -> tuple[list[list[float]], list[list[float]]]:
    """Per-query lists of (this, previous) values over samples present in both, matched on (query, sample)."""
    j = rows.select("query_id", "sample_idx", pl.col(col).cast(pl.Float64()).alias("a")).join(
        prev.select("query_id", "sample_idx", pl.col(col).cast(pl.Float64()).alias("b")),
        on=["query_id", "sample_idx"], how="inner").sort(["query_id", "sample_idx"])
    g = j.group_by("query_id", maintain_order=True).agg("a", "b")
    return [list(x) for x in g["a"].to_list()], [list(x) for x in g["b"].to_list()]


def summarize_heldout(heldout: pl.DataFrame, *, iteration: int, config_hash: str, split_ids_sha256: str,
                      resamples: int = 2000, seed: int = 0) -> pl.DataFrame:
    """The long-format report: one row per (system, mode, metric) with its 95% interval and, for systems
    other than π_{k-1}, the paired difference to π_{k-1} in the same mode with a paired bootstrap interval.

    Executor-error samples are our infrastructure failing, not the workflow: they are left out of every
    metric and pair (counted in `executor_errors`)."""
    from spogw_dagster.core import stats

    out: list[dict[str, Any]] = []
    scored_all = heldout.filter(pl.col("status") != Status.EXECUTOR_ERROR.value)
    for (system, mode), rows in heldout.group_by(["system", "mode"], maintain_order=True):
        first = rows.row(0, named=True)
        scored = rows.filter(pl.col("status") != Status.EXECUTOR_ERROR.value)
        prev = scored_all.filter((pl.col("kind") == "previous") & (pl.col("mode") == mode))
        has_prev = first["kind"] != "previous" and prev.height > 0
        base = {"iteration": iteration, "split": first["split"], "system": system, "kind": first["kind"],
                "mode": mode, "n": scored.height, "n_queries": scored["query_id"].n_unique(),
                "checkpoint_iteration": first["checkpoint_iteration"], "adapter_sha256": first["adapter_sha256"],
                "config_hash": config_hash, "split_ids_sha256": split_ids_sha256}
        for metric, col in {**RATE_METRICS, **MEAN_METRICS}.items():
            clusters = _per_query(scored, col)
            if metric in RATE_METRICS:
                v, lo, hi, _ = stats.clustered_wilson(clusters)
                method = "wilson" if all(len(c) == 1 for c in clusters) else "wilson_deff"
            else:
                v, lo, hi = stats.cluster_bootstrap_mean(clusters, resamples=resamples, seed=seed)
                method = "cluster_bootstrap"
            row = {**base, "metric": metric, "value": v, "ci_low": lo, "ci_high": hi, "ci_method": method}
            if has_prev:
                a, b = _paired(scored, prev, col)
                if a:
                    d, dlo, dhi = stats.paired_bootstrap_diff(a, b, resamples=resamples, seed=seed)
                    row.update(diff_vs_prev=d, diff_ci_low=dlo, diff_ci_high=dhi, n_pairs=sum(map(len, a)))
            out.append(row)
        out.append({**base, "metric": "distinct_per_query", "value": distinct_per_query(rows), "ci_method": "none"})
        out.append({**base, "metric": "executor_errors", "value": float(rows.height - scored.height),
                    "ci_method": "none"})
        for metric, col in COST_METRICS.items():
            out.append({**base, "metric": metric, "value": float(rows[col].sum()), "ci_method": "none"})
    return report_frame(out)


def distinct_per_query(rows: pl.DataFrame) -> float | None:
    """Mean over queries of how many different valid workflows (names and layout normalised) were written."""
    from spogw_dagster.workflow.copies import distinct_count

    valid = rows.filter(pl.col("valid"))
    if valid.height == 0:
        return 0.0
    per_q = valid.group_by("query_id").agg(pl.col("workflow"))["workflow"].to_list()
    return sum(distinct_count(list(w)) for w in per_q) / rows["query_id"].n_unique()


def report_frame(rows: Sequence[dict[str, Any]]) -> pl.DataFrame:
    order = {m: i for i, m in enumerate(METRICS)}
    rows = sorted(rows, key=lambda r: (KIND_ORDER.get(r["kind"], 9), r["system"], r["mode"],
                                       order.get(r["metric"], 99)))
    return _frame(list(rows), REPORT_SCHEMA)


def metric_row(report: pl.DataFrame, kind: str, metric: str, mode: str | None = None) -> dict[str, Any] | None:
    """The row of `metric` for the (first) system of `kind`, in `mode` (default: sampled if present)."""
    rows = report.filter((pl.col("kind") == kind) & (pl.col("metric") == metric))
    if mode is None:
        mode = "sampled" if rows.filter(pl.col("mode") == "sampled").height else "greedy"
    rows = rows.filter(pl.col("mode") == mode)
    return rows.row(0, named=True) if rows.height else None


def reusable_previous(prev_report: pl.DataFrame | None, prev_heldout: pl.DataFrame | None, system: str,
                      adapter_sha256: str, config_hash: str, iteration: int, expected_rows: int) -> pl.DataFrame | None:
    """Held-out rows of `system` (checkpoint k-1) from report k-1, relabelled to `iteration` as the previous
    system, when they were made with the same config and adapter (the seeds do not depend on k, so
    generating them again would give the same rows); else None."""
    if prev_report is None or prev_heldout is None or "metric" not in prev_report.columns:
        return None
    row = prev_report.filter((pl.col("kind") == "checkpoint") & (pl.col("system") == system))
    if row.height == 0:
        return None
    r = row.row(0, named=True)
    if r["adapter_sha256"] != adapter_sha256 or r["config_hash"] != config_hash:
        return None
    rows = prev_heldout.filter(pl.col("system") == system)
    if rows.height != expected_rows or set(HELDOUT_SCHEMA) - set(rows.columns):  # older rows lack new columns
        return None
    return relabel(rows, iteration, "previous")


def _ci(v: float | None, lo: float | None, hi: float | None, signed: bool = False) -> str:
    if v is None:
        return "-"
    f = "+.3f" if signed else ".3f"
    return f"{v:{f}} [{lo:{f}}, {hi:{f}}]" if lo is not None else f"{v:{f}}"


# the answer score first: it is the measure; the rest say why it moved (or did not)
CURVE_METRICS = ("answer_score", "valid_rate", "executes_rate", "trivial_rate", "near_copy_rate", "mean_reward",
                 "distinct_per_query")


def report_table_text(report: pl.DataFrame) -> str:
    """Markdown: per system and mode the metrics with 95% intervals, then the paired differences."""
    head = "| system | mode | n | " + " | ".join(CURVE_METRICS) + " | executor calls (cached) |"
    lines = [head, "|" + "---|" * (len(CURVE_METRICS) + 4)]
    diffs = []
    for (system, mode), g in report.group_by(["system", "mode"], maintain_order=True):
        m = {r["metric"]: r for r in g.iter_rows(named=True)}
        cells = [_ci(m[x]["value"], m[x]["ci_low"], m[x]["ci_high"]) if x in m else "-" for x in CURVE_METRICS]
        calls = f"{int(m['executor_calls']['value'])} ({int(m['cached_calls']['value'])})" if "executor_calls" in m else "-"
        n = m.get("valid_rate", {}).get("n", "-")
        lines.append(f"| {system} | {mode} | {n} | " + " | ".join(cells) + f" | {calls} |")
        if any(m[x]["diff_vs_prev"] is not None for x in CURVE_METRICS if x in m):
            diffs.append(f"| {system} | {mode} | " + " | ".join(
                _ci(m[x]["diff_vs_prev"], m[x]["diff_ci_low"], m[x]["diff_ci_high"], True) if x in m else "-"
                for x in CURVE_METRICS) + " |")
    if diffs:
        lines += ["", "paired difference to π_{k-1} (same queries and seeds; bootstrap over queries, 95%)", "",
                  "| system | mode | " + " | ".join(CURVE_METRICS) + " |", "|" + "---|" * (len(CURVE_METRICS) + 2)]
        lines += diffs
    return "\n".join(lines)


def learning_curve(reports: pl.DataFrame) -> pl.DataFrame:
    """Checkpoint rows of every iteration plus the base model (π_{-1}, the previous system of iteration 0) as
    step -1: what the learning-curve plot and `spogw run`'s table read."""
    ck = reports.filter(pl.col("kind") == "checkpoint").with_columns(pl.col("iteration").alias("step"))
    base = reports.filter((pl.col("kind") == "previous") & (pl.col("system") == "base")
                          & (pl.col("iteration") == reports["iteration"].min())) \
        .with_columns(pl.lit(-1, dtype=pl.Int64()).alias("step"))
    return pl.concat([base, ck], how="diagonal_relaxed").sort(["step", "mode", "metric"])


def curve_table_text(reports: pl.DataFrame) -> str:
    """`spogw run`'s final table: per iteration and system the held-out metrics with 95% intervals and the
    checkpoint's paired difference to π_{k-1}."""
    names = {"answer_score": "answer score", "valid_rate": "valid", "executes_rate": "executes",
             "near_copy_rate": "near copy", "mean_reward": "mean reward"}
    w = 26
    lines = [f"{'iter':>4}  {'system':<16} {'mode':<8}" + "".join(f"{v:>{w}}" for v in names.values())]
    order = pl.col("kind").replace_strict(KIND_ORDER, default=9)
    for (it, _, system, mode), g in reports.sort(["iteration", order, "system", "mode"]).group_by(
            ["iteration", order.alias("o"), "system", "mode"], maintain_order=True):
        m = {r["metric"]: r for r in g.iter_rows(named=True)}
        lines.append(f"{it:>4}  {system:<16} {mode:<8}" + "".join(
            f"{_ci(m[x]['value'], m[x]['ci_low'], m[x]['ci_high']) if x in m else '-':>{w}}" for x in names))
        if g["kind"][0] == "checkpoint" and any(m[x]["diff_vs_prev"] is not None for x in names if x in m):
            lines.append(f"{'':>4}  {'  Δ vs previous':<16} {mode:<8}" + "".join(
                f"{_ci(m[x]['diff_vs_prev'], m[x]['diff_ci_low'], m[x]['diff_ci_high'], True) if x in m else '-':>{w}}"
                for x in names))
    return "\n".join(lines)


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


def paired_comparison(a: pl.DataFrame, b: pl.DataFrame, *, resamples: int = 2000, seed: int = 0,
                      generator_seeds: bool = True) -> list[dict[str, Any]]:
    """System A against system B on the same held-out queries and seeds: per mode and metric, both values and
    the mean paired difference A - B with a paired bootstrap 95% interval over queries.

    `a` and `b` are heldout_results rows of one system each. Samples pair on (mode, query_id, sample_idx);
    a pair whose sampler or executor seeds differ is not a pair, and is an error (the comparison would be
    between different draws). `generator_seeds=False` pairs a policy with a static baseline, which has no
    generator: then only the executor seeds must agree. Executor-error samples are left out, as in the report."""
    from spogw_dagster.core import stats

    key = ["mode", "query_id", "sample_idx"]
    ok = pl.col("status") != Status.EXECUTOR_ERROR.value
    # rows written before a metric existed (near_copy) lack its column: that metric is left out, not guessed
    # (absent, or null where partitions of both kinds were concatenated)
    metrics = {m: c for m, c in {**RATE_METRICS, **MEAN_METRICS}.items()
               if c in a.columns and c in b.columns and a[c].null_count() == 0 and b[c].null_count() == 0}
    cols = key + ["seed", "exec_seed", *metrics.values()]
    j = a.filter(ok).select(cols).join(b.filter(ok).select(cols), on=key, how="inner", suffix="_b")
    differs = pl.col("exec_seed") != pl.col("exec_seed_b")
    if generator_seeds:
        differs = differs | (pl.col("seed").fill_null(-1) != pl.col("seed_b").fill_null(-1))
    bad = j.filter(differs)
    if bad.height:
        r = bad.row(0, named=True)
        raise ValueError(f"{bad.height} samples have different seeds in the two systems (first: {r['mode']} "
                         f"{r['query_id']} #{r['sample_idx']}): they are not paired; compare systems scored with "
                         "the same report seed and sample count")
    out = []
    for mode in sorted(j["mode"].unique().to_list()):
        m = j.filter(pl.col("mode") == mode).sort(["query_id", "sample_idx"])
        g = m.group_by("query_id", maintain_order=True)
        for metric, col in metrics.items():
            per_q = g.agg(pl.col(col).cast(pl.Float64()).alias("a"), pl.col(f"{col}_b").cast(pl.Float64()).alias("b"))
            xa, xb = [list(x) for x in per_q["a"].to_list()], [list(x) for x in per_q["b"].to_list()]
            d, lo, hi = stats.paired_bootstrap_diff(xa, xb, resamples=resamples, seed=seed)
            n = sum(map(len, xa))
            out.append({"mode": mode, "metric": metric, "a": sum(map(sum, xa)) / n, "b": sum(map(sum, xb)) / n,
                        "diff": d, "diff_ci_low": lo, "diff_ci_high": hi, "n_pairs": n, "n_queries": len(xa)})
    return out


def system_rows(heldout: pl.DataFrame, system: str) -> pl.DataFrame:
    """The held-out rows of `system` from the first report partition that scored it (a policy reused as
    π_{k-1} by the next report carries the same rows)."""
    rows = heldout.filter(pl.col("system") == system)
    if rows.height == 0:
        known = ", ".join(sorted(heldout["system"].unique().to_list())) or "(none)"
        raise ValueError(f"no held-out results for system {system!r}; systems in heldout_results: {known}")
    first = rows["iteration"].min()
    return rows.filter(pl.col("iteration") == first)
