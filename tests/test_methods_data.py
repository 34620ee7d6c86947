"""The baselines' training data hold only workflows that ran (issue 38): W4S's RWR keeps a candidate only if it
ran and scored above 0.05 on the answer (W4S's meta_agent drops the rest), and ScoreFlow's Score-DPO pairs only
workflows that ran, ordered and weighted by the answer score, never by the ladder. Rows built by hand, the
expected sets and values worked out by hand below. Pure: polars and the core, no model."""

from __future__ import annotations

import math

import polars as pl
import pytest

from spogw_dagster.core import curation as C
from spogw_dagster.core.hyperparams import ObjectiveConfig
from spogw_dagster.pipeline.data import tables, training_inputs

# (query, sample_idx, status, run_statuses, trivial, answer_score, ladder score). The ladder scores are made up so
# that the ladder orders the rows differently from the answer (a paper's filter must read the answer).
W4S_ROWS = [
    ("q", 0, "ok", ["ok"], False, 1.0, 0.6),  # kept
    ("q", 1, "ok", ["ok"], False, 0.06, 0.3),  # kept: 0.06 > 0.05
    ("q", 2, "ok", ["ok"], False, 0.05, 0.3),  # out: W4S drops accuracy <= 0.05, 0.05 included
    ("q", 3, "ok", ["ok"], False, 0.0, 0.3),  # out: ran, but answered nothing
    ("q", 4, "ok", ["ok"], True, 1.0, 0.9),  # out: trivial (no solution-writing operator answered)
    ("q", 5, "runtime_error", ["runtime_error"], False, 0.0, 0.2),  # out: raised
    ("q", 6, "timeout", ["timeout"], False, 0.0, 0.2),  # out
    ("q", 7, "sandbox_violation", ["sandbox_violation"], False, 0.0, 0.2),  # out
    ("q", 8, "invalid", [], False, 0.0, 0.1),  # out: the validator refused it
    ("q", 9, "format_error", [], False, 0.0, 0.0),  # out: no code
    ("q", 10, "executor_error", ["executor_error"], False, None, None),  # out: no score at all
    ("q", 11, "ok", ["sandbox_violation", "ok"], False, 0.5, 0.5),  # out: one run tried to leave the sandbox
    ("q", 12, "ok", ["runtime_error", "ok"], False, 0.5, 0.4),  # kept: ran (one run finished), answer 0.5
    ("r", 0, "ok", ["ok"], False, 0.3, 0.5),  # kept
    ("r", 1, "runtime_error", ["runtime_error"], False, 0.0, 0.3),  # out
]
W4S_KEPT = [("q", 0), ("q", 1), ("q", 12), ("r", 0)]


def _frames(rows) -> tuple[pl.DataFrame, pl.DataFrame]:
    """sampled_workflows and execution_scores rows (what lora_checkpoint and the comparison read)."""
    sampled, scores = [], []
    for q, i, st, runs, triv, ans, ladder in rows:
        sampled.append({"iteration": 0, "query_id": q, "sample_idx": i, "prompt": f"prompt {q}",
                        "completion": f"completion {q}{i}", "workflow": f"return await self.w{i}()",
                        "parse_status": st if st in ("invalid", "format_error") else "ok",
                        "completion_token_ids": [100 + i, 200 + i], "logprobs": [-1.0, -2.0], "n_tokens": 2})
        scores.append({"iteration": 0, "query_id": q, "sample_idx": i, "status": st, "run_statuses": runs,
                       "runs": len(runs), "trivial": triv, "answer_score": ans, "score": ladder})
    return tables.typed_frame(sampled, tables.SAMPLED_SCHEMA), tables.execution_frame(scores)


# ----------------------------------------------------------------------------------------------------------------
# W4S


def test_w4s_keeps_only_candidates_that_ran_and_scored_above_0_05():
    sampled, scores = _frames(W4S_ROWS)
    cands = training_inputs.training_candidates(sampled, scores)
    assert C.w4s_kept_candidates(cands).select("query_id", "sample_idx").rows() == W4S_KEPT


def test_w4s_rwr_training_data_holds_no_broken_trivial_or_low_scoring_candidate():
    sampled, scores = _frames(W4S_ROWS)
    examples, rows = training_inputs.rwr_training_data(sampled, scores, ObjectiveConfig(objective="rwr"), iteration=0)
    assert rows.select("query_id", "sample_idx").rows() == W4S_KEPT
    assert [e.completion for e in examples] == ["completion q0", "completion q1", "completion q12", "completion r0"]
    # every row trained on ran and answered above 0.05: checked against execution_scores, row by row
    j = rows.join(scores, on=["query_id", "sample_idx"], how="left")
    assert j["status"].to_list() == ["ok"] * 4 and not any(j["trivial"].to_list())
    assert all("sandbox_violation" not in r for r in j["run_statuses"].to_list())
    assert min(j["answer_score"].to_list()) > 0.05
    # W4S's reward, one turn (no history: best so far = previous = 0): every kept answer beats 0, so 1, less 0.1
    # below 0.3: q0 (1.0) 1, q1 (0.06) 0.9, q12 (0.5) 1, r0 (0.3, not below 0.3) 1; weights exp(r / 0.4)
    assert rows["score"].to_list() == pytest.approx([1.0, 0.9, 1.0, 1.0])
    assert rows["weight"].to_list() == pytest.approx([math.exp(2.5), math.exp(2.25), math.exp(2.5), math.exp(2.5)])
    # the ladder as r ("score"): the kept rows' ladder scores 0.6, 0.3, 0.4, 0.5, nothing else
    _, lad = training_inputs.rwr_training_data(sampled, scores, ObjectiveConfig(objective="rwr", rwr_reward="score"), 0)
    assert lad.select("query_id", "sample_idx").rows() == W4S_KEPT
    assert lad["score"].to_list() == pytest.approx([0.6, 0.3, 0.4, 0.5])


def test_the_filters_need_the_columns_that_say_a_workflow_ran():
    sampled, scores = _frames(W4S_ROWS)
    cands = training_inputs.training_candidates(sampled, scores)
    for f in (C.w4s_kept_candidates, C.score_dpo_candidates):
        with pytest.raises(ValueError, match="trivial"):
            f(cands.drop("trivial"))
        with pytest.raises(ValueError, match="answer_score"):
            f(cands.drop("answer_score"))
        # without run statuses a sandbox violation could not be seen: refused, not guessed
        with pytest.raises(ValueError, match="run_statuses.*rematerialize execution_scores"):
            f(cands.drop("run_statuses"))
    with pytest.raises(ValueError, match="trivial, run_statuses"):
        C.ran_mask(cands.drop("trivial", "run_statuses"))


# ----------------------------------------------------------------------------------------------------------------
# ScoreFlow

# One query; the ladder would rank the broken workflow (2, ladder 0.95) first and the wrong answer (1, ladder 0.9)
# above the right one (0, ladder 0.6). Ran: 0 (answer 1.0), 1 (0.0), 4 (0.5). The rest did not run.
DPO_ROWS = [
    ("q", 0, "ok", ["ok"], False, 1.0, 0.6),
    ("q", 1, "ok", ["ok"], False, 0.0, 0.9),
    ("q", 2, "runtime_error", ["runtime_error"], False, 0.0, 0.95),
    ("q", 3, "ok", ["ok"], True, 0.0, 0.5),  # trivial
    ("q", 4, "ok", ["ok"], False, 0.5, 0.2),
    ("q", 5, "invalid", [], False, 0.0, 0.1),
    ("q", 6, "ok", ["sandbox_violation", "ok"], False, 0.5, 0.5),
    ("q", 7, "timeout", ["timeout"], False, 0.0, 0.7),
]
# pairs of the workflows that ran, by answer: (0 over 1) gap 1, (0 over 4) gap 0.5, (4 over 1) gap 0.5; weights
# (s_w - s_l)^3 = 1, 0.125, 0.125, total 1.25, probabilities 0.8, 0.1, 0.1
DPO_PAIRS = {(0, 1): (1.0, 0.0, 1.0, 0.8), (0, 4): (1.0, 0.5, 0.125, 0.1), (4, 1): (0.5, 0.0, 0.125, 0.1)}


def test_score_dpo_pairs_hold_only_workflows_that_ran_ordered_by_the_answer():
    sampled, scores = _frames(DPO_ROWS)
    cands = C.score_dpo_candidates(training_inputs.training_candidates(sampled, scores))
    assert cands["sample_idx"].to_list() == [0, 1, 4]
    assert cands["score"].to_list() == [1.0, 0.0, 0.5] and cands["ladder_score"].to_list() == [0.6, 0.9, 0.2]
    cand = C.preference_pair_candidates(cands, power=3.0)
    got = {(r["chosen_idx"], r["rejected_idx"]): (r["chosen_score"], r["rejected_score"], r["weight"],
                                                  r["probability"]) for r in cand.iter_rows(named=True)}
    assert got.keys() == DPO_PAIRS.keys()
    for k, want in DPO_PAIRS.items():
        assert got[k] == pytest.approx(want)


def test_score_dpo_training_data_pairs_ran_workflows_with_the_higher_answer_chosen():
    sampled, scores = _frames(DPO_ROWS)
    ocfg = ObjectiveConfig(objective="score_dpo", dpo_num_pairs=30)
    examples, rows = training_inputs.score_dpo_training_data(sampled, scores, ocfg, iteration=0)
    assert rows.height == len(examples) == 60 and rows["role"].to_list() == ["chosen", "rejected"] * 30
    assert set(rows["sample_idx"].to_list()) <= {0, 1, 4}  # never 2, 3, 5, 6, 7: they did not run
    answer = {i: a for _, i, _, _, _, a, _ in DPO_ROWS}
    for k in range(30):
        w, l = rows.row(2 * k, named=True), rows.row(2 * k + 1, named=True)
        assert (w["sample_idx"], l["sample_idx"]) in DPO_PAIRS
        assert answer[w["sample_idx"]] > answer[l["sample_idx"]]  # ordered by the answer, not the ladder
        assert (w["score"], l["score"]) == (answer[w["sample_idx"]], answer[l["sample_idx"]])
        assert examples[2 * k].score == w["score"] and examples[2 * k + 1].score == l["score"]
    # the ladder would have chosen 1 over 0 (0.9 > 0.6): that pair never appears
    assert all(not (w == 1 and l == 0) for w, l in zip(rows["sample_idx"][::2], rows["sample_idx"][1::2]))


def test_the_profiles_pair_budget_is_scoreflows_per_query_rate():
    """ScoreFlow draws 600 pairs for its 33 HumanEval queries (about 18.2 a query); a profile's budget is that
    rate times its training queries: 600 / 33 x 16 = 290.9 -> 291, 600 / 33 x 65 = 1181.8 -> 1182."""
    from spogw_dagster.pipeline.profiles import get_profile

    want = {"tiny": 291, "answers": 291, "paper": 1182}
    for name, pairs in want.items():
        p = get_profile(name)
        assert p["training"]["dpo_num_pairs"] == pairs == round(600 / 33 * p["benchmark"]["train_queries"]), name
