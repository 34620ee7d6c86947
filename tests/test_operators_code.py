"""The code operators' choices, on HumanEval/0 in the real sandbox with a scripted executor: `sc_ensemble` votes
among the candidates that pass the public tests (when any do), and `test` shows the executor the task and repairs
only code the executor wrote."""

from __future__ import annotations

import pytest

from spogw_dagster.benchmarks import load_benchmark
from spogw_dagster.contracts import ChatResult
from spogw_dagster.sandboxing import detect_isolation
from spogw_dagster.workflow.operators import OperatorConfig, Operators
from spogw_dagster.workflow.template import operator_names

RIGHT = ("def has_close_elements(numbers, threshold):\n"
         "    s = sorted(numbers)\n"
         "    return any(b - a < threshold for a, b in zip(s, s[1:]))\n")
WRONG_A = "def has_close_elements(numbers, threshold):\n    return False\n"
WRONG_B = "def has_close_elements(numbers, threshold):\n    return True\n"


class Recorder:
    model = "recorder"

    def __init__(self, reply: str):
        self.reply, self.prompts = reply, []

    async def chat(self, messages, params):
        self.prompts.append(messages[-1]["content"])
        return ChatResult(text=self.reply, prompt_tokens=1, completion_tokens=1, latency_s=0.0, model=self.model)


@pytest.fixture(scope="module")
def he0():
    return next(p for p in load_benchmark("humaneval") if p.id == "HumanEval/0")


def _ops(problem, executor) -> Operators:
    return Operators(problem, executor, detect_isolation(), OperatorConfig(), 0, operator_names("code"))


async def test_the_ensemble_returns_the_one_candidate_that_passes_the_public_tests(he0):
    ex = Recorder("A")  # were it asked, the executor would pick the first (wrong) candidate
    assert await _ops(he0, ex).call("sc_ensemble", [], {"solutions": [WRONG_A, WRONG_B, RIGHT]}) == RIGHT
    assert ex.prompts == []  # decided by the tests: no executor call


async def test_the_ensemble_votes_among_passing_candidates_and_falls_back_to_all(he0):
    # two copies of a wrong one and one right one: the wrong pair would win a plain vote
    assert await _ops(he0, Recorder("A")).call("sc_ensemble", [], {"solutions": [WRONG_A, WRONG_A, RIGHT]}) == RIGHT
    # none passes: the plain vote decides (the pair of WRONG_B)
    out = await _ops(he0, Recorder("A")).call("sc_ensemble", [], {"solutions": [WRONG_A, WRONG_B, WRONG_B]})
    assert out == WRONG_B


async def test_the_test_operator_shows_the_task_when_it_asks_for_a_fix(he0):
    ex = Recorder(f"```python\n{RIGHT}```")
    ops = _ops(he0, ex)
    ops.provenance.replied(WRONG_A)  # the executor wrote the failing draft: `test` repairs only its code
    fixed = await ops.call("test", [], {"solution": WRONG_A})
    assert "sorted(numbers)" in fixed and "return False" not in fixed
    assert len(ex.prompts) == 1
    assert "Check if in given list of numbers" in ex.prompts[0]  # the docstring of HumanEval/0's prompt
    assert WRONG_A.strip() in ex.prompts[0]


async def test_the_test_operator_hands_back_a_solution_the_workflow_wrote_unrepaired(he0):
    ex = Recorder(f"```python\n{RIGHT}```")
    assert await _ops(he0, ex).call("test", [], {"solution": WRONG_A}) == WRONG_A
    assert ex.prompts == []


class ParamsRecorder(Recorder):
    def __init__(self, reply: str):
        super().__init__(reply)
        self.params = []

    async def chat(self, messages, params):
        self.params.append(params)
        return await super().chat(messages, params)


async def test_stop_after_code_ends_only_the_calls_that_ask_for_one_code_block(he0):
    from spogw_dagster.workflow.operators import CODE_STOP

    ex = ParamsRecorder(f"```python\n{RIGHT}```")
    ops = Operators(he0, ex, detect_isolation(), OperatorConfig(code_stop=CODE_STOP), 0,
                    ("code_generate", "custom", "sc_ensemble", "test", "answer_generate"))
    await ops.call("code_generate", [], {"instruction": "Solve it."})
    await ops.call("custom", [], {"instruction": "Solve it."})
    ops.provenance.replied(WRONG_A)
    await ops.call("test", [], {"solution": WRONG_A})  # the repair asks for one code block too
    await ops.call("sc_ensemble", [], {"solutions": [WRONG_A, WRONG_B]})  # none passes, no vote: the pick call
    await ops.call("answer_generate", [], {})
    assert [p.stop for p in ex.params] == [CODE_STOP, CODE_STOP, CODE_STOP, (), ()]
    # off (the default): no call carries a stop string, so earlier cache keys stay the same
    ex = ParamsRecorder(f"```python\n{RIGHT}```")
    await _ops(he0, ex).call("code_generate", [], {"instruction": "Solve it."})
    assert ex.params[0].stop == ()


def test_the_code_stop_cuts_at_the_closing_fence_not_the_opening_one():
    from spogw_dagster.benchmarks.code_tests import extract_code
    from spogw_dagster.workflow.operators import CODE_STOP

    reply = f"Here it is:\n```python\n{RIGHT}```\n\nThis sorts the numbers first."
    cut = reply[: reply.find(CODE_STOP[0])]  # what llama.cpp returns: the text before the stop string
    assert cut.endswith("zip(s, s[1:]))") and "```python" in cut
    assert extract_code(cut, "has_close_elements") == extract_code(reply, "has_close_elements") == RIGHT


async def test_check_returns_the_public_tests_verdict_without_an_executor_call(he0):
    ex = Recorder("A")
    ops = _ops(he0, ex)
    assert await ops.call("check", [], {"solution": RIGHT}) == "pass"
    assert await ops.call("check", [], {"solution": WRONG_A}) == "fail"
    assert await ops.call("check", [], {"solution": "no code at all"}) == "fail"
    assert ex.prompts == [] and ops.llm_calls == 0
    assert [t["source"] for t in ops.trace] == ["verdict"] * 3  # a verdict, never a passed-on solution


async def test_check_fails_a_task_without_public_tests_so_a_branch_on_it_spends(he0):
    import dataclasses

    bare = dataclasses.replace(he0, public_tests=[])
    assert await _ops(bare, Recorder("A")).call("check", [], {"solution": RIGHT}) == "fail"
