"""Pure pipeline logic: the reward ladder, the asset tables, training examples and the report (no model)."""

from __future__ import annotations

import json

import polars as pl
import pytest

from spogw_dagster.evaluation import EvalResult
from spogw_dagster.pipeline import tables
from spogw_dagster.pipeline.rewards import Ladder, ladder_reward
from spogw_dagster.types import Status, Usage

VALID_BODY = 'solution = await self.code_generate(instruction="Write it.")\n        return solution\n'
NO_RETURN = 'solution = await self.code_generate(instruction="Write it.")\n'


def test_ladder_reward_by_hand():
    lad = Ladder(format=0.1, valid=0.2, executes=0.2, answer=0.5)
    assert ladder_reward(lad, "format_error", [], 0.0) == 0.0
    assert ladder_reward(lad, "invalid", [], 0.0) == pytest.approx(0.1)
    assert ladder_reward(lad, "ok", ["runtime_error"], 0.0) == pytest.approx(0.3)
    assert ladder_reward(lad, "ok", ["ok", "runtime_error"], 0.5) == pytest.approx(0.1 + 0.2 + 0.1 + 0.25)
    assert ladder_reward(lad, "ok", ["ok"], 1.0) == pytest.approx(1.0)
    assert ladder_reward(Ladder(), "ok", ["ok"], 0.75) == 0.75  # default: the plain benchmark score
    assert ladder_reward(Ladder(), "invalid", [], 0.0) == 0.0
    with pytest.raises(ValueError):
        Ladder(format=0.6, answer=0.6)


def _sampled(n_q=2, m=3):
    samples, qids, prompts = [], [], []
    for q in range(n_q):
        qids.append(f"Q/{q}")
        prompts.append(f"prompt {q}")
        row = []
        for j in range(m):
            text = VALID_BODY if j == 0 else (NO_RETURN if j == 1 else "")
            row.append(tables.Sample(text, [10 + j, 11, 2], [-0.5, -0.25, -0.125], "stop"))
        samples.append(row)
    return tables.sampled_frame(3, qids, prompts, samples, "code", parent_iteration=2, parent_sha256="abc",
                                generator="smollm2")


def test_sampled_frame_parses_each_completion():
    df = _sampled()
    assert df.height == 6 and df["iteration"].unique().to_list() == [3]
    assert df.filter(pl.col("query_id") == "Q/0")["parse_status"].to_list() == ["ok", "invalid", "format_error"]
    ok = df.row(0, named=True)
    assert ok["workflow"].startswith("class Workflow:") and "return solution" in ok["workflow"]
    assert ok["sum_logprob"] == pytest.approx(-0.875) and ok["n_tokens"] == 3
    assert df["parent_iteration"].unique().to_list() == [2] and df["parent_adapter_sha256"].unique().to_list() == ["abc"]
    assert "return" in df.row(1, named=True)["parse_error"]
    empty = tables.sampled_frame(0, [], [], [], "code", parent_iteration=None, parent_sha256=None, generator="x")
    assert empty.height == 0 and empty.schema == pl.Schema(tables.SAMPLED_SCHEMA)
    with pytest.raises(ValueError):
        tables.sampled_frame(0, ["a"], [], [], "code", parent_iteration=None, parent_sha256=None, generator="x")


def _result(qid, status, score, runs=(), calls=0):
    u = Usage(llm_calls=calls, cached_calls=calls // 2, prompt_tokens=10 * calls, completion_tokens=5 * calls)
    return EvalResult("humaneval", qid, status, score, usage=u, run_statuses=list(runs),
                      run_scores=[score] * len(runs), error="" if status == Status.OK else "why")


def test_execution_rows_and_curation_input():
    lad = Ladder(format=0.1, valid=0.2, executes=0.2, answer=0.5)
    rows = [
        tables.execution_row(3, "Q/0", 0, "ok", _result("Q/0", Status.OK, 1.0, ["ok"], 2), lad),
        tables.execution_row(3, "Q/0", 1, "invalid", _result("Q/0", Status.INVALID, 0.0), lad),
        tables.execution_row(3, "Q/0", 2, "format_error", _result("Q/0", Status.FORMAT_ERROR, 0.0), lad),
    ]
    df = tables.execution_frame(rows)
    assert df["score"].to_list() == pytest.approx([1.0, 0.1, 0.0])
    assert df["answer_score"].to_list() == [1.0, 0.0, 0.0]
    assert df["llm_calls"].to_list() == [2, 0, 0] and df["runs"].to_list() == [1, 0, 0]
    sampled = _sampled(n_q=1)
    cin = tables.curation_input(sampled, df)
    assert cin.columns == ["iteration", "query_id", "sample_idx", "workflow", "score", "status"]
    with pytest.raises(ValueError, match="no execution score"):
        tables.curation_input(sampled, df.head(2))


def test_screened_frame_keeps_reasons_and_kept_groups_round_trip():
    from spogw_dagster.core import curation as cur
    from spogw_dagster.core.config import CurationConfig

    samples = pl.DataFrame({
        "iteration": [0] * 6, "query_id": ["a"] * 3 + ["b"] * 3, "sample_idx": [0, 1, 2] * 2,
        "workflow": ["x = 1", "y = 2", "z = 3", "p = 1", "q = 2", "r = 3"],
        "score": [1.0, 0.0, 0.5, 0.0, 0.0, 0.0], "status": ["ok"] * 6,
    })
    cc = CurationConfig(m=3, n=2, t=1, g_max=1, tau_std=0.1)
    df = cur.validate_samples(samples)
    groups, few = cur.form_groups(df, cc.n, cc.g_max, cc.seed)
    kept, low = cur.screen_groups(groups, cc.tau_std)
    out = tables.screened_frame(kept, pl.concat([few, low]))
    assert out.height == 2
    assert out.filter(pl.col("kept"))["query_id"].to_list() == ["a"]
    assert out.filter(~pl.col("kept"))["reason"].to_list() == ["low_score_std"]
    back = tables.kept_groups(out)
    members, _ = cur.sharpen_groups(back, cc.t)
    assert members.height == 2 and sorted(members["role"].to_list()) == ["bottom", "top"]


def test_training_examples_join_sampled_tokens_in_group_order():
    sampled = _sampled(n_q=1)
    sharp = pl.DataFrame({
        "iteration": [3, 3, 3, 3], "query_id": ["Q/0"] * 4, "group_id": ["3:Q/0#1", "3:Q/0#1", "3:Q/0#0", "3:Q/0#0"],
        "sample_idx": [2, 0, 0, 1], "score": [0.0, 1.0, 1.0, 0.1], "role": ["bottom", "top", "top", "bottom"],
        "rank": [1, 0, 0, 1], "group_mean": [0.5] * 4, "group_std": [0.5] * 4, "advantage": [-1.0, 1.0, 1.0, -1.0],
    })
    ex = tables.training_examples(sharp, sampled)
    assert [(e.group_id, e.advantage) for e in ex] == [("3:Q/0#0", 1.0), ("3:Q/0#0", -1.0), ("3:Q/0#1", 1.0),
                                                       ("3:Q/0#1", -1.0)]
    assert ex[0].completion_token_ids == [10, 11, 2] and ex[0].old_logprobs == [-0.5, -0.25, -0.125]
    assert ex[0].prompt == "prompt 0" and ex[0].completion == VALID_BODY
    assert tables.training_examples(sharp.head(0), sampled) == []
    with pytest.raises(ValueError, match="no sampled workflow"):
        tables.training_examples(sharp.with_columns(pl.lit(9).alias("sample_idx")), sampled)


def test_report_rows_interval_delta_and_reuse():
    rows = (tables.heldout_rows(1, "spogw@0001", [_result("a", Status.OK, 1.0, ["ok"], 1),
                                                  _result("b", Status.INVALID, 0.0)], ["w1", "w2"])
            + tables.heldout_rows(1, "spogw@0000", [_result("a", Status.OK, 0.0, ["ok"], 1),
                                                    _result("b", Status.EXECUTOR_ERROR, 0.0, ["executor_error"])],
                                  ["w3", "w4"])
            + tables.heldout_rows(1, "baseline:io", [_result("a", Status.OK, 1.0, ["ok"], 1),
                                                     _result("b", Status.OK, 1.0, ["ok"], 1)], ["io", "io"]))
    held = tables.heldout_frame(rows)
    this = tables.summarize_system(1, "spogw@0001", "checkpoint", 1, held, "h", "sha1")
    assert (this["n"], this["scored"], this["solve_rate"], this["valid_rate"]) == (2, 2, 0.5, 0.5)
    assert this["ci_low"] == pytest.approx(0.0945, abs=1e-3) and this["ci_high"] == pytest.approx(0.9055, abs=1e-3)
    assert json.loads(this["statuses"]) == {"invalid": 1, "ok": 1}
    prev = tables.summarize_system(1, "spogw@0000", "previous", 0, held, "h", "sha0")
    assert (prev["scored"], prev["executor_errors"], prev["solve_rate"]) == (1, 1, 0.0)  # errors excluded
    base = tables.summarize_system(1, "baseline:io", "baseline", None, held, "h")
    report = tables.report_frame([base, prev, this])
    assert report["kind"].to_list() == ["checkpoint", "previous", "baseline"]
    assert report["delta_vs_previous"].to_list()[0] == pytest.approx(0.5)
    assert report["delta_vs_previous"].to_list()[1:] == [None, None]
    assert "spogw@0001" in tables.report_table_text(report)

    # report 1's checkpoint rows can stand in for "previous" in report 2 only with the same adapter and config
    again = tables.reusable_previous(report, held, "spogw@0001", "sha1", "h", 2)
    assert again is not None and again.height == 2 and again["iteration"].unique().to_list() == [2]
    assert tables.reusable_previous(report, held, "spogw@0001", "other", "h", 2) is None
    assert tables.reusable_previous(report, held, "spogw@0001", "sha1", "changed", 2) is None
    assert tables.reusable_previous(report, held.head(1), "spogw@0001", "sha1", "h", 2) is None
    assert tables.reusable_previous(None, held, "spogw@0001", "sha1", "h", 2) is None


def test_score_distribution():
    d = tables.score_distribution([0.0, 0.1, 0.5, 0.99, 1.0, None])
    assert list(d.values()) == [2, 0, 1, 0, 2]
    assert list(d)[-1] == "[0.8,1.0]"
