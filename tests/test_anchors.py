"""`generator.anchors`: the prompt's own workflows added to every training query's samples, as completions the
generator would write, scored teacher-forced under π_{k-1}, after the m samples, and off by default (no hash
change)."""

from __future__ import annotations

import math

import polars as pl
import pytest

from spogw_dagster.contracts import Problem
from spogw_dagster.pipeline.domain.anchors import ANCHOR_FINISH, anchor_completions, anchor_rows
from spogw_dagster.pipeline.settings import ConfigValidationError, config_hash, load_config
from spogw_dagster.pipeline.data.tables import parse_completion
from spogw_dagster.workflow.template import generator_prompt

IO = ' solution = await self.code_generate(instruction="Write the function.")\n         return solution\n'
GEN_TEST = (' solution = await self.code_generate(instruction="Write the function.")\n'
            '         return await self.test(solution=solution)\n')


def test_the_anchored_prompts_workflows_are_completions_as_the_generator_writes_them():
    got = anchor_completions("code", "anchored")
    assert len(got) == 3  # the starting workflow and the two built from it
    assert got[0] == IO and got[1] == GEN_TEST
    assert got[2].startswith(" solutions = []\n         for i in range(3):\n             solutions.append(")
    for c in got:
        assert parse_completion(c, "code")[1] == "ok"


def test_a_prompt_without_shared_workflows_has_nothing_to_anchor_on():
    assert len(anchor_completions("math", "examples")) == 3
    with pytest.raises(ValueError, match="set generator.prompt to 'anchored' or 'examples'"):
        anchor_completions("code", "operators")


def _problem(i: int) -> Problem:
    return Problem(benchmark="humaneval", id=f"HumanEval/{i}", family="code",
                   question=f'def f{i}(x):\n    """Return x plus {i}."""\n')


def test_anchor_rows_follow_the_m_samples_with_the_scorers_tokens_and_logprobs():
    cfg = load_config("answers", overrides={"generator": {"anchors": True}})
    seen = []

    def score(prompts, completions):
        seen.extend(zip(prompts, completions))
        return [[7] * (i + 1) for i in range(len(prompts))], [[-0.5] * (i + 1) for i in range(len(prompts))]

    problems = [_problem(1), _problem(2)]
    df = anchor_rows(cfg, 0, None, problems, first_idx=8, score=score)
    assert df.height == 6
    assert df["sample_idx"].to_list() == [8, 9, 10, 8, 9, 10]
    assert set(df["finish_reason"]) == {ANCHOR_FINISH} and set(df["parse_status"]) == {"ok"}
    assert df["prompt"][0] == generator_prompt("code", problems[0].question, "anchored")
    # scored with the generator's end (a blank line, then the next example's `#`), stored as the workflow's text
    assert seen[0] == (df["prompt"][0], IO + "\n#") and seen[4] == (df["prompt"][3], GEN_TEST + "\n#")
    assert df["completion"][0] == IO
    assert df["n_tokens"].to_list() == [1, 2, 3, 4, 5, 6]
    assert df["sum_logprob"][5] == pytest.approx(-3.0)
    assert df["parent_iteration"].to_list() == [None] * 6


def test_anchors_off_keeps_the_hash_and_bad_combinations_are_refused():
    base = load_config("tiny")
    assert "anchors" not in base.canonical()["generator"]  # off: not in the hashed form, so older hashes hold
    assert config_hash(base) == config_hash(load_config("tiny", overrides={"generator": {"anchors": False}}))
    assert config_hash(base) != config_hash(load_config("tiny", overrides={"generator": {"anchors": True}}))
    with pytest.raises(ConfigValidationError, match="anchors"):
        load_config("answers", overrides={"generator": {"anchors": True, "prompt": "one_example"}})
    with pytest.raises(ConfigValidationError, match="refinement"):
        load_config("answers", overrides={"generator": {"anchors": True}, "refinement": {"turns": 2}})


def test_teacher_forced_anchor_logprobs_on_the_bundled_model():
    """The default scorer on the real bundled generator: one finite, negative log-prob per completion token."""
    from spogw_dagster.pipeline.domain.anchors import _teacher_forced

    cfg = load_config("tiny", overrides={"generator": {"anchors": True}})
    prompt = generator_prompt("code", _problem(1).question, cfg.generator.prompt)
    ids, lps = _teacher_forced(cfg.generator, None)([prompt, prompt], [IO + "\n#", GEN_TEST + "\n#"])
    assert [len(i) for i in ids] == [len(lp) for lp in lps] and len(ids[1]) > len(ids[0])
    assert all(math.isfinite(v) and v <= 0 for lp in lps for v in lp) and sum(lps[0]) < -1
    assert ids[0][:10] == ids[1][:10]  # the same first line, tokenized alike
    from spogw_dagster.models import load_tokenizer, resolve_model

    tok = load_tokenizer(resolve_model(cfg.generator.model))
    assert tok.decode(ids[0]) == IO + "\n#"  # the scored tokens carry the end (a blank line, then `#`)
    assert lps[0][:10] == pytest.approx(lps[1][:10], abs=1e-4)  # and scored alike (one prompt, teacher-forced)


def test_an_anchor_longer_than_the_budget_is_refused():
    cfg = load_config("answers", overrides={"generator": {"anchors": True, "max_new_tokens": 40}})
    def score(prompts, completions):
        return [[1] * 41 for _ in prompts], [[-0.1] * 41 for _ in prompts]

    with pytest.raises(ValueError, match="generator.max_new_tokens=40"):
        anchor_rows(cfg, 0, None, [_problem(1)], first_idx=8, score=score)
    cut = load_config("answers", overrides={"generator": {"anchors": True}, "training": {"max_completion_tokens": 30}})
    with pytest.raises(ValueError, match="training.max_completion_tokens=30"):
        anchor_rows(cut, 0, None, [_problem(1)], first_idx=8, score=score)


def test_methods_that_sample_their_own_data_sample_without_anchors():
    from spogw_dagster.pipeline.domain.comparison_methods import method_config

    cfg = load_config("answers", overrides={"generator": {"anchors": True}})
    assert method_config(cfg, "spogw").generator.anchors  # trained on the loop's rows, anchors among them
    assert not method_config(cfg, "score_dpo").generator.anchors  # ScoreFlow samples its own, as its paper
    assert not method_config(cfg, "w4s").generator.anchors  # W4S's turns (refused with anchors) run


def test_execution_metadata_tells_the_policys_samples_from_anchors():
    from spogw_dagster.pipeline.defs.assets.execution_scores import _sampled_metadata

    sampled = pl.DataFrame({"query_id": ["a", "a", "a", "b", "b"], "sample_idx": [0, 1, 2, 0, 1],
                            "finish_reason": ["stop", "stop", ANCHOR_FINISH, "length", ANCHOR_FINISH]})
    executed = pl.DataFrame({"query_id": ["a", "a", "a", "b", "b"], "sample_idx": [0, 1, 2, 0, 1],
                             "status": ["ok", "invalid", "ok", "format_error", "ok"],
                             "answer_score": [1.0, 0.0, 1.0, 0.0, 1.0]})
    md = _sampled_metadata(executed, sampled)
    # own samples: a/0 (1.0, valid), a/1 (0.0, invalid), b/0 (0.0, format_error); anchors a/2 and b/1
    assert md["anchor_rows"].value == 2
    assert md["sampled_mean_answer_score"].value == round(1 / 3, 4)
    assert md["sampled_valid_rate"].value == round(1 / 3, 4)
