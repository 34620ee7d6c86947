"""W4S's history-relative reward and state advance (core/methods/w4s.py), by hand from the rule W4S publishes: 1 for
beating the best accuracy so far, 0.5 for beating the previous state, 0 otherwise, 0.1 less below 0.3."""

from __future__ import annotations

import math

import pytest

from spogw_dagster.core.methods.w4s import Candidate, history_rewards, pick_state, w4s_reward


def test_reward_rule_by_hand():
    assert w4s_reward(0.9, best_so_far=0.8, previous=0.5) == 1.0
    assert w4s_reward(0.6, best_so_far=0.8, previous=0.5) == 0.5
    assert w4s_reward(0.4, best_so_far=0.8, previous=0.5) == 0.0
    assert w4s_reward(0.2, best_so_far=0.1, previous=0.3) == pytest.approx(0.9)  # beats the best, but < 0.3
    assert w4s_reward(0.0, best_so_far=0.0, previous=0.0) == pytest.approx(-0.1)
    assert w4s_reward(0.3, best_so_far=0.3, previous=0.3) == 0.0  # equal is no improvement; 0.3 is not < 0.3


def test_history_of_one_query_by_hand():
    # turn 0 (no history: best = previous = 0): 0 -> 0.5 earns 1, 1 -> 0.25 earns 1 - 0.1.
    # turn 1 from state 0 (0.5): best so far 0.5; 2 -> 0.75 beats it (1), 3 -> 0.4 beats neither (0).
    # turn 2 from state 3 (0.4, picked by validation accuracy, not by answer): best so far is the best *state*,
    #   max(0.5, 0.4) = 0.5 (candidate 2's 0.75 never advanced, so W4S never compares with it);
    #   4 -> 0.6 beats it (1), 5 -> 0.1 neither, and is below 0.3 (-0.1).
    cands = [Candidate("q", 0, 0, None, 0.5), Candidate("q", 0, 1, None, 0.25),
             Candidate("q", 1, 2, 0, 0.75), Candidate("q", 1, 3, 0, 0.4),
             Candidate("q", 2, 4, 3, 0.6), Candidate("q", 2, 5, 3, 0.1)]
    got = history_rewards(reversed(cands))  # input order does not matter
    assert [(r.candidate.sample_idx, r.best_so_far, r.previous) for r in got] == [
        (0, 0.0, 0.0), (1, 0.0, 0.0), (2, 0.5, 0.5), (3, 0.5, 0.5), (4, 0.5, 0.4), (5, 0.5, 0.4)]
    assert [r.reward for r in got] == pytest.approx([1.0, 0.9, 1.0, 0.0, 1.0, -0.1])


def test_queries_have_separate_histories_and_unscored_rows_are_skipped():
    cands = [Candidate("a", 0, 0, None, 1.0), Candidate("b", 0, 0, None, 0.0),
             Candidate("b", 0, 1, None, None),  # an executor error: no reward, not in the history
             Candidate("b", 1, 2, 1, 0.5)]  # its state was unscored: previous counts as 0
    got = {(r.candidate.query_id, r.candidate.sample_idx): r for r in history_rewards(cands)}
    assert set(got) == {("a", 0), ("b", 0), ("b", 2)}
    assert got[("a", 0)].reward == 1.0 and got[("b", 0)].reward == pytest.approx(-0.1)
    # b's best so far is 0 (a's 1.0 is another query's), previous 0: 0.5 beats both
    assert (got[("b", 2)].best_so_far, got[("b", 2)].previous, got[("b", 2)].reward) == (0.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="names parent 7"):
        history_rewards([Candidate("a", 0, 0, None, 1.0), Candidate("a", 1, 1, 7, 1.0)])


def test_state_advances_with_the_best_validation_accuracy_lowest_index_on_ties():
    assert pick_state([(3, 0.5), (1, 0.5), (2, 0.2)]) == 1
    assert pick_state([(3, 0.5), (1, 0.25), (2, 0.75)]) == 2
    with pytest.raises(ValueError):
        pick_state([])


def test_rwr_weight_of_the_w4s_reward():
    # the trainer weighs a row exp(r / 0.4): W4S's rewards 1, 0.5, 0, -0.1 give e^2.5, e^1.25, 1, e^-0.25
    assert [math.exp(r / 0.4) for r in (1.0, 0.5, 0.0, -0.1)] == pytest.approx(
        [12.182494, 3.490343, 1.0, 0.778801], abs=1e-6)


def test_feedback_queries_are_never_scored_on_validation():
    """W4S picks its states on the feedback queries and shows their answers in its prompts: a validation score
    that included them would score it where it was tuned. With `feedback_split: validation` they are the
    split's last queries, left out; by default they come from the train split, after the queries trained on,
    and every validation query is scored."""
    from spogw_dagster.pipeline.domain.heldout import heldout_problems
    from spogw_dagster.pipeline.domain.refinement import feedback_problems
    from spogw_dagster.pipeline.defs.resources import PipelineResource
    from spogw_dagster.pipeline.settings import load_config

    plain = load_config("tiny", overrides={"report": {"split": "validation"}})
    assert plain.reserved_validation() == 0 and len(heldout_problems(plain)[0]) == 16  # all of HumanEval's
    for over in ({"comparison": {"methods": ["spogw", "w4s"], "w4s_feedback_queries": 2}},
                 {"refinement": {"turns": 2}}):
        val = load_config("tiny", overrides={"report": {"split": "validation"},
                                             **over, "refinement": {**over.get("refinement", {}),
                                                                    "feedback_split": "validation"}})
        scored = {p.id for p in heldout_problems(val)[0]}
        fb = {p.id for p in feedback_problems(val)}
        assert len(fb) == val.feedback_queries() == 2 and len(scored) == 14 and not scored & fb
        # the default: the train split's last 2 (HumanEval's train split holds 65; the first 16 are trained on)
        cfg = load_config("tiny", overrides={"report": {"split": "validation"}, **over})
        train = {p.id for p in PipelineResource.from_config(cfg, "/tmp").train_queries()}
        fb = {p.id for p in feedback_problems(cfg)}
        assert cfg.reserved_validation() == 0 and len(heldout_problems(cfg)[0]) == 16
        assert len(fb) == 2 and not fb & train and not fb & {p.id for p in heldout_problems(cfg)[0]}
        assert all(i.startswith("HumanEval/") for i in fb)


def test_feedback_queries_that_do_not_fit_the_train_split_name_the_fix():
    from spogw_dagster.pipeline.domain.refinement import feedback_problems
    from spogw_dagster.pipeline.runs.preflight import split_problems
    from spogw_dagster.pipeline.settings import load_config

    cfg = load_config("tiny", overrides={"benchmark": {"train_queries": 60}, "refinement": {"turns": 2,
                                                                                         "feedback_queries": 6}})
    with pytest.raises(ValueError, match=r"lower refinement.feedback_queries .* to <= 5"):
        feedback_problems(cfg)
    found = split_problems(cfg)  # `spogw check` says so before anything runs
    assert len(found) == 1 and "train_queries + W4S's feedback queries" in found[0].text
    assert "=66 but the train split of humaneval has 65" in found[0].text


def test_w4s_is_compared_at_its_papers_turns_unless_set():
    from spogw_dagster.pipeline.domain.comparison_methods import method_config
    from spogw_dagster.pipeline.defs.versions import section_hash
    from spogw_dagster.pipeline.settings import load_config

    cfg = load_config("tiny")
    w4s = method_config(cfg, "w4s").refinement
    assert (w4s.turns, w4s.feedback_queries, w4s.feedback_split) == (10, 33, "train")
    small = load_config("tiny", overrides={"comparison": {"w4s_turns": 2, "w4s_feedback_queries": 4}})
    assert (method_config(small, "w4s").refinement.turns, method_config(small, "w4s").refinement.feedback_queries) \
        == (2, 4)
    # the comparison's own code version follows them; the loop's assets do not
    assert section_hash(small, "objective_comparison") != section_hash(cfg, "objective_comparison")
    assert small.hash == cfg.hash and section_hash(small, "sampled_workflows") == section_hash(cfg, "sampled_workflows")
    assert method_config(cfg, "spogw").refinement.turns == 1  # no other method takes turns
