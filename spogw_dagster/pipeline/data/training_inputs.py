"""What each objective trains on, from the iteration's tables (no Dagster, no model): the sharpened groups'
examples for spogw and grpo, ScoreFlow's pairs for score_dpo, W4S's weighted candidates for rwr, and the rows
each used (the training_rows table, whose schema is in tables.py)."""

from __future__ import annotations

import math
from typing import Any, Sequence

import polars as pl

from spogw_dagster.contracts import Status
from spogw_dagster.core.curation import sample_preference_pairs, score_dpo_candidates, w4s_kept_candidates
from spogw_dagster.core.curation import scored_candidates as core_candidates
from spogw_dagster.core.methods.w4s import Candidate, history_rewards
from spogw_dagster.core.training import TrainExample, registry
from spogw_dagster.pipeline.data.tables import ANCHOR_FINISH, TRAINING_ROWS_SCHEMA, curation_input, typed_frame
from spogw_dagster.seeds import offset_seed

# ------------------------------------------------------------------------------------------------
# lora_checkpoint: training examples from sharpened groups


def training_examples(sharpened: pl.DataFrame, sampled: pl.DataFrame, mark_off_policy: bool = False) -> list:
    """One `TrainExample` per sharpened member: the prompt, the sampled tokens and log-probs (π_old) and the
    group-normalised advantage. Ordered by (group_id, rank) so the dataset (and its hash) is deterministic.
    With `mark_off_policy`, an anchor's examples (finish_reason "anchor") are marked off-policy (for
    `training.off_policy_loss`; unmarked, the data hash is the one from before the option).

    A member that occurs in several groups yields one example per group (the paper weights workflows that
    are extreme in many groups more). A member with no sampled row is an error."""

    if sharpened.height == 0:
        return []
    key = ["iteration", "query_id", "sample_idx"]
    cols = key + ["prompt", "completion", "completion_token_ids", "logprobs"] + (["finish_reason"] * mark_off_policy)
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
            off_policy=mark_off_policy and r.get("finish_reason") == ANCHOR_FINISH,
        ))
    return out

_SAMPLED_TRAIN_COLS = ["prompt", "completion", "completion_token_ids", "logprobs"]
# what the baselines' filters read of execution_scores: the answer, and whether the workflow ran
_SCORE_TRAIN_COLS = ["answer_score", "trivial", "run_statuses"]
_KEY = ["iteration", "query_id", "sample_idx"]


def pair_seed(seed: int, iteration: int) -> int:
    """The seed of iteration k's pair draw (another draw each iteration, the same on a rerun)."""
    return offset_seed(seed, iteration)


def training_data(objective: str, sharpened: pl.DataFrame, sampled: pl.DataFrame, scores: pl.DataFrame,
                  ocfg, iteration: int, mark_anchors: bool = False) -> tuple[list, pl.DataFrame]:
    """(training examples, training_rows) of `objective` (`ocfg`: a `core.hyperparams.ObjectiveConfig`).
    The anchors are marked off-policy where their loss differs (`off_policy_loss`) or `mark_anchors` asks
    (the trainer's `anchor_stop` finds them by the mark)."""
    data = registry.get(objective).data  # what the objective trains on (core.training.registry)
    if data == "pairs":
        return score_dpo_training_data(sampled, scores, ocfg, iteration, objective=objective)
    if data == "candidates":
        return rwr_training_data(sampled, scores, ocfg, iteration, objective=objective)
    return sharpened_training_data(sharpened, sampled, objective, iteration,
                                   mark_off_policy=ocfg.off_policy_loss != "clipped" or mark_anchors)


def iteration_training_data(tcfg, min_queries: int, sharpened: pl.DataFrame, sampled: pl.DataFrame,
                            scores: pl.DataFrame, iteration: int) -> tuple[list, pl.DataFrame, str | None]:
    """What iteration `iteration` trains on under `tcfg` (a `TrainConfig`): its objective's `training_data`, kept
    only if it covers `min_queries` queries (`require_queries`). Returns (examples, rows, why there are none)."""
    examples, rows = training_data(tcfg.objective, sharpened, sampled, scores, tcfg.objective_config(), iteration,
                                   mark_anchors=tcfg.anchor_stop is not None)
    return require_queries(examples, rows, min_queries)


def require_queries(examples: list, rows: pl.DataFrame, min_queries: int) -> tuple[list, pl.DataFrame, str | None]:
    """The training data unchanged, or none (with the reason) when its rows cover fewer than `min_queries`
    distinct queries: a few groups of one query are too narrow a signal to move the whole policy on
    (`training.min_queries`). No rows at all is the objective's own no-data case and passes through."""
    k = rows["query_id"].n_unique()
    if 0 < k < min_queries:
        what = "query" if k == 1 else "queries"
        return [], rows.clear(), (f"training data on {k} {what} only, fewer than training.min_queries = "
                                  f"{min_queries}")
    return examples, rows, None


def sharpened_training_data(sharpened: pl.DataFrame, sampled: pl.DataFrame, objective: str,
                            iteration: int, mark_off_policy: bool = False) -> tuple[list, pl.DataFrame]:
    """The GRPO family's data: `training_examples` (one example per sharpened member and group) and its rows."""
    examples = training_examples(sharpened, sampled, mark_off_policy)
    rows = sharpened.sort(["group_id", "rank"]) if sharpened.height else sharpened
    out = [{"iteration": iteration, "objective": objective, "example_idx": i, "query_id": r["query_id"],
            "sample_idx": r["sample_idx"], "role": r["role"], "group_id": r["group_id"],
            "advantage": float(r["advantage"]), "score": float(r["score"])}
           for i, r in enumerate(rows.iter_rows(named=True))]
    return examples, typed_frame(out, TRAINING_ROWS_SCHEMA)


def training_candidates(sampled: pl.DataFrame, scores: pl.DataFrame) -> pl.DataFrame:
    """The iteration's full scored candidate set with what training needs: `core.curation.scored_candidates`
    of the joined tables (executor errors out, near-duplicates kept, as ScoreFlow), joined back with the
    sampled prompt, completion, tokens and log-probs and the row's answer score, trivial flag and run statuses
    (what `core.curation.ran_mask` reads: whether the workflow ran). A row whose completion has no tokens is
    left out (there is nothing to train on; the trainer refuses empty completions)."""

    usable, _ = core_candidates(curation_input(sampled, scores))
    extra = [c for c in _SCORE_TRAIN_COLS if c in scores.columns]  # a missing one: ran_mask asks for it by name
    j = (usable.join(sampled.select(_KEY + _SAMPLED_TRAIN_COLS), on=_KEY, how="left")
         .join(scores.select(_KEY + extra), on=_KEY, how="left"))
    return j.filter(pl.col("completion_token_ids").list.len() > 0).sort(_KEY)


def _example(r: dict[str, Any], *, group_id: Any, role: str | None = None, advantage: float = 0.0):
    return TrainExample(prompt=r["prompt"], completion=r["completion"], advantage=advantage,
                        score=float(r["score"]), old_logprobs=list(r["logprobs"]),
                        completion_token_ids=list(r["completion_token_ids"]), group_id=group_id, role=role)


def score_dpo_training_data(sampled: pl.DataFrame, scores: pl.DataFrame, ocfg, iteration: int,
                            objective: str = "score_dpo") -> tuple[list, pl.DataFrame]:
    """ScoreFlow's data: `ocfg.dpo_num_pairs` draws (None: as many as candidate pairs) with replacement over all
    candidate pairs of all queries, among workflows that ran (`core.curation.ran_mask`), compared on their
    answer score (`core.curation.score_dpo_candidates`), ∝ (s_w − s_l)^`dpo_pair_power`, seeded by
    `pair_seed`. Each draw gives two examples, chosen then rejected, with group_id "pair:<draw>" (the trainer pairs them and keeps them in one
    micro-batch); a pair drawn twice trains twice, as in ScoreFlow."""

    cands = score_dpo_candidates(training_candidates(sampled, scores))  # ran, compared on the answer
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
    return examples, typed_frame(rows, TRAINING_ROWS_SCHEMA)


def rwr_training_data(sampled: pl.DataFrame, scores: pl.DataFrame, ocfg, iteration: int,
                      objective: str = "rwr") -> tuple[list, pl.DataFrame]:
    """W4S's data: every candidate W4S keeps (`core.curation.w4s_kept_candidates`: it ran, i.e. status ok, no
    sandbox violation, not trivial, and its answer score is above 0.05; all turns and repairs), once, in key
    order, with reward r and weight exp(r / `rwr_temperature`) (the loss computes the same weight from r). The
    reward's history still counts every scored candidate. r is `w4s_rewards` (W4S's history-relative reward,
    `ocfg.rwr_reward = "w4s"`) or the row's ladder score ("score")."""
    cands = w4s_kept_candidates(training_candidates(sampled, scores))
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
    return examples, typed_frame(rows, TRAINING_ROWS_SCHEMA)


def w4s_rewards(sampled: pl.DataFrame, scores: pl.DataFrame) -> dict[tuple[str, int], float]:
    """(query_id, sample_idx) → W4S's reward (`core.methods.w4s.history_rewards`) of every scored row: its answer score
    against the best answer of earlier turns of its query and against the state it was sampled from
    (`parent_sample_idx`). Executor errors have no accuracy: no reward, and left out of the history."""

    cols = [c for c in ("turn", "parent_sample_idx") if c in sampled.columns]
    j = sampled.select(_KEY + cols).join(scores.select(_KEY + ["answer_score", "status"]), on=_KEY, how="left")
    cands = []
    for r in j.iter_rows(named=True):
        unscored = r["status"] is None or r["status"] == Status.EXECUTOR_ERROR.value
        cands.append(Candidate(r["query_id"], int(r.get("turn") or 0), int(r["sample_idx"]), r.get("parent_sample_idx"),
                               None if unscored else float(r["answer_score"] or 0.0)))
    return {(x.candidate.query_id, x.candidate.sample_idx): x.reward for x in history_rewards(cands)}


def step_curve(steps: Sequence[dict[str, Any]], key: str) -> list[float]:
    return [float(s[key]) for s in steps if s.get(key) is not None]
