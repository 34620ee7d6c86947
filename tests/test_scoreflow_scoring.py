"""ScoreFlow's scoring (what `score_dpo` uses in the comparison): each workflow scored as the mean of R = 3
executor runs at temperature 0. The executor is a scripted double (the model's words are the test's input);
the sandbox, the operators and the scorer are the real ones."""

from __future__ import annotations

import pytest

from spogw_dagster.contracts import Problem
from spogw_dagster.evaluation import evaluate_workflow
from spogw_dagster.sandboxing import detect_isolation
from spogw_dagster.workflow.operators import OperatorConfig
from tests.fakes import ScriptedExecutor

PROBLEM = Problem("gsm8k", "gsm8k/test/q", "What is 6 times 7?", answer="42", family="math")
WORKFLOW = ("class Workflow:\n    async def run(self):\n"
            "        return await self.custom(instruction='Solve it.')\n")


async def test_three_runs_at_temperature_zero_are_averaged():
    # runs answer 42, 41, 42: scores 1, 0, 1 -> (1 + 0 + 1) / 3
    ex = ScriptedExecutor(replies=["\\boxed{42}", "\\boxed{41}", "\\boxed{42}"])
    res = await evaluate_workflow(WORKFLOW, PROBLEM, ex, detect_isolation(), runs=3, seed=5,
                                  op_cfg=OperatorConfig(temperature=0.0))
    assert res.run_scores == [1.0, 0.0, 1.0]
    assert res.score == pytest.approx(2 / 3)
    assert len(ex.calls) == 3 and {p.temperature for _, p in ex.calls} == {0.0}
    # each run is its own call (its own seed), as ScoreFlow's three repetitions are
    assert len({p.seed for _, p in ex.calls}) == 3


async def test_a_run_without_an_answer_counts_zero_in_the_mean():
    # ScoreFlow: a repetition without an answer counts as 0. Run 2 gives no number -> scores 1, 0, 1 -> 2/3
    ex = ScriptedExecutor(replies=["\\boxed{42}", "no number here", "\\boxed{42}"])
    res = await evaluate_workflow(WORKFLOW, PROBLEM, ex, detect_isolation(), runs=3,
                                  op_cfg=OperatorConfig(temperature=0.0))
    assert res.run_scores == [1.0, 0.0, 1.0] and res.score == pytest.approx(2 / 3)
