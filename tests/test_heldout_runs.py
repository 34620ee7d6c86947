"""`report.runs`: each held-out workflow scored as the mean of R executor runs (ScoreFlow scores with 3), so that
a paired difference of a few queries is not lost in one run's executor sampling. Checked with real workflows in
the sandbox against a scripted executor: right on runs 1 and 3, wrong on run 2, so the mean is 2/3 by hand."""

from __future__ import annotations

import asyncio

import polars as pl
import pytest

from spogw_dagster.benchmarks.queries import get_problem, split_problems
from spogw_dagster.evaluation import baseline_workflow
from spogw_dagster.contracts import ChatResult
from spogw_dagster.pipeline.domain.heldout import baseline_cache_key, heldout_runs
from spogw_dagster.pipeline.domain.jobs import EvalJob, evaluate_jobs
from spogw_dagster.pipeline.settings import load_config
from spogw_dagster.sandboxing import detect_isolation

from test_answer_provenance import CORRECT, WRONG


class Alternating:
    """The n-th call (from 1) answers CORRECT when n is odd, WRONG when even."""

    model = "alternating"

    def __init__(self):
        self.calls = 0

    async def chat(self, messages, params):
        self.calls += 1
        code = CORRECT if self.calls % 2 else WRONG
        return ChatResult(text=f"```python\n{code}```", prompt_tokens=10, completion_tokens=10, latency_s=0.0,
                          model=self.model)


def test_runs_default_to_the_executions_and_change_the_baseline_key():
    plain, three = load_config("ci"), load_config("ci", overrides={"report": {"runs": 3}})
    assert heldout_runs(plain) == plain.execution.runs == 1 and heldout_runs(three) == 3
    assert "runs" not in plain.canonical()["report"]  # unset: every earlier config keeps its hash
    problems, _ = split_problems("humaneval", "test", limit=2, seed=0)
    assert baseline_cache_key("io", problems, plain) != baseline_cache_key("io", problems, three)
    with pytest.raises(Exception, match="runs"):
        load_config("ci", overrides={"report": {"runs": 0}})


@pytest.mark.parametrize("runs, calls, score", [(None, 1, 1.0), (3, 3, 2 / 3)])
def test_a_held_out_workflow_is_the_mean_of_its_runs(runs, calls, score):
    he0 = get_problem("humaneval", "HumanEval/0")
    ex = Alternating()
    cfg = load_config("ci")
    [res] = asyncio.run(evaluate_jobs([EvalJob(he0, baseline_workflow("code", "io"))], ex, detect_isolation(), cfg,
                                      seed=0, runs=runs))
    assert ex.calls == calls and res.score == pytest.approx(score)


def test_anchor_rows_run_anchor_runs_times_and_samples_once():
    """`execution.anchor_runs`: the prompt's own workflows (finish_reason "anchor") are scored as the mean of
    their own number of runs; the policy's samples keep `execution.runs`."""
    from spogw_dagster.pipeline.domain.jobs import jobs_for

    he0 = get_problem("humaneval", "HumanEval/0")
    code = baseline_workflow("code", "io")
    sampled = pl.DataFrame({"query_id": [he0.id] * 2, "sample_idx": [0, 8], "parse_status": ["ok", "ok"],
                            "workflow": [code, code], "parse_error": ["", ""], "finish_reason": ["stop", "anchor"]})
    jobs = jobs_for(sampled, {he0.id: he0}, "0000", anchor_runs=3)
    assert [j.runs for j in jobs] == [None, 3]
    assert [j.runs for j in jobs_for(sampled, {he0.id: he0}, "0000")] == [None, None]
    cfg = load_config("ci")
    for job, calls, score in ((jobs[1], 3, 2 / 3), (jobs[0], 1, 1.0)):
        ex = Alternating()
        [res] = asyncio.run(evaluate_jobs([job], ex, detect_isolation(), cfg, seed=0))
        assert ex.calls == calls and res.score == pytest.approx(score)
