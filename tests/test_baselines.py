"""The Self-Refine and MultiPersona-debate baselines: written in the workflow language, accepted by the
validator for every family, and making exactly the operator and executor calls their round constants say,
first with scripted executor replies (the calls' order and contents), then with the real bundled model."""

from __future__ import annotations

import dataclasses

import pytest

from spogw_dagster.benchmarks import solution_code
from spogw_dagster.contracts import Status
from spogw_dagster.evaluation import (
    MULTIPERSONA_ROUNDS,
    PERSONAS,
    SELF_REFINE_ROUNDS,
    baseline_workflow,
)
from spogw_dagster.benchmarks.queries import get_problem, held_out_problems
from spogw_dagster.sandboxing import detect_isolation
from spogw_dagster.workflow.operators import OperatorConfig, vote_key
from spogw_dagster.workflow.parser import parse_workflow, validate
from spogw_dagster.workflow.runtime import execute_workflow
from spogw_dagster.workflow.template import operator_names
from tests.fakes import ScriptedExecutor

FAMILIES = ("code", "math", "qa")
NEW_METHODS = ("self_refine", "multipersona")
PICKER = "Which solution is most likely correct?"  # the sc_ensemble prompt when no two solutions agree


@pytest.fixture(scope="module")
def iso():
    return detect_isolation()


def user_prompt(call) -> str:
    messages, _params = call
    return messages[-1]["content"]


# ------------------------------------------------------------------------------------ validation, by hand


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("method", NEW_METHODS)
def test_new_baselines_pass_the_validator_for_every_family(family, method):
    code = baseline_workflow(family, method)
    parsed = validate(code, family)
    # the same path as generator output: extract from a fenced reply, no repair needed
    again = parse_workflow(f"Here it is:\n```python\n{code}```\n", family)
    assert again.code == code and not again.repaired
    op = "code_generate" if family == "code" else "custom"
    expected = {"self_refine": (op,), "multipersona": tuple(sorted((op, "sc_ensemble")))}[method]
    assert parsed.operators_used == expected
    assert set(parsed.operators_used) <= set(operator_names(family))
    # static call sites (loops count once): self_refine code 2 (draft, revision), math/qa 3 (draft,
    # feedback, revision); multipersona 3 (first answers, revisions, sc_ensemble)
    sites = {("self_refine", "code"): 2, ("self_refine", "math"): 3, ("self_refine", "qa"): 3}
    assert parsed.operator_call_sites == sites.get((method, family), 3)


def test_every_family_gets_three_distinct_personas_and_math_and_qa_share_self_refine():
    for family in FAMILIES:
        assert len(set(PERSONAS[family])) == 3
        code = baseline_workflow(family, "multipersona")
        assert all(repr(p) in code for p in PERSONAS[family])
    # math and qa offer the same `custom` operator; the answer format comes from the operator's hint
    assert baseline_workflow("math", "self_refine") == baseline_workflow("qa", "self_refine")


def test_unknown_method_names_every_method():
    with pytest.raises(ValueError) as e:
        baseline_workflow("math", "medprompt")
    for m in ("io", "cot", "cot_sc", "self_refine", "multipersona"):
        assert m in str(e.value)


def test_cli_and_report_config_accept_the_new_methods():
    from spogw_dagster.cli import build_parser
    from spogw_dagster.pipeline.settings import ReportSection

    for m in NEW_METHODS:
        args = build_parser().parse_args(["baseline", "--benchmark", "humaneval", "--method", m])
        assert args.method == m
    assert ReportSection(baselines=("io", "self_refine", "multipersona")).baselines[1:] == NEW_METHODS
    with pytest.raises(ValueError):  # pydantic's ValidationError
        ReportSection(baselines=("medprompt",))


# ------------------------------------------------------ call structure in the sandbox, scripted replies


def gsm8k_problem():
    return get_problem("gsm8k", "gsm8k/test/0")


def humaneval_problem():
    return get_problem("humaneval", "HumanEval/0")


def fn(body: str) -> str:
    return f"```python\ndef has_close_elements(numbers, threshold):\n    return {body}\n```"


async def test_self_refine_math_drafts_then_alternates_feedback_and_revision(iso):
    replies = ["DRAFT0 \\boxed{1}", "FEEDBACK1", "DRAFT1 \\boxed{2}", "FEEDBACK2", "DRAFT2 \\boxed{3}"]
    ex = ScriptedExecutor(replies=replies)
    res = await execute_workflow(baseline_workflow("math", "self_refine"), gsm8k_problem(), ex, iso)
    assert res.status == Status.OK, res.error
    assert SELF_REFINE_ROUNDS == 2
    assert res.usage.llm_calls == len(ex.calls) == 1 + 2 * SELF_REFINE_ROUNDS == 5
    assert res.operator_calls == 5 and [t["op"] for t in res.trace] == ["custom"] * 5
    assert res.answer == "DRAFT2 \\boxed{3}"  # the last revision
    prompts = [user_prompt(c) for c in ex.calls]
    q = gsm8k_problem().question
    assert all(q in p for p in prompts)  # the operator adds the query; the workflow never saw it
    # round k: feedback on the current draft, then a revision that sees that draft and that feedback
    assert "DRAFT0" in prompts[1] and "Give feedback" in prompts[1]
    assert "DRAFT0" in prompts[2] and "FEEDBACK1" in prompts[2] and "improved" in prompts[2]
    assert "DRAFT1" in prompts[3] and "DRAFT0" not in prompts[3]
    assert "DRAFT1" in prompts[4] and "FEEDBACK2" in prompts[4] and "FEEDBACK1" not in prompts[4]


async def test_self_refine_code_revises_in_one_call_per_round_and_keeps_a_function(iso):
    p = humaneval_problem()
    # round 2's reply has no function: the draft from round 1 stays the answer (still scoreable code)
    ex = ScriptedExecutor(replies=[fn("False"), "Feedback: off by one.\n" + fn("True"), "Looks correct."])
    res = await execute_workflow(baseline_workflow("code", "self_refine"), p, ex, iso)
    assert res.status == Status.OK, res.error
    assert res.usage.llm_calls == len(ex.calls) == 1 + SELF_REFINE_ROUNDS == 3
    assert [t["op"] for t in res.trace] == ["code_generate"] * 3
    assert res.answer == solution_code(p, fn("True")) and "return True" in res.answer
    prompts = [user_prompt(c) for c in ex.calls]
    assert "return False" in prompts[1] and "feedback" in prompts[1]
    assert "return True" in prompts[2] and "return False" not in prompts[2]


async def test_multipersona_math_answers_debates_and_votes(iso):
    personas = PERSONAS["math"]
    first = ["A0 \\boxed{5}", "A1 \\boxed{6}", "A2 \\boxed{7}"]
    revised = ["R0 \\boxed{6}", "R1 \\boxed{6}", "R2 \\boxed{7}"]  # two agree: no picker call
    ex = ScriptedExecutor(replies=first + revised)
    res = await execute_workflow(baseline_workflow("math", "multipersona"), gsm8k_problem(), ex, iso)
    assert res.status == Status.OK, res.error
    n = len(personas) * (1 + MULTIPERSONA_ROUNDS)
    assert MULTIPERSONA_ROUNDS == 1 and res.usage.llm_calls == len(ex.calls) == n == 6
    assert [t["op"] for t in res.trace] == ["custom"] * 6 + ["sc_ensemble"]
    assert res.answer == "R0 \\boxed{6}"  # the majority (first of the two that agree)
    prompts = [user_prompt(c) for c in ex.calls]
    for i, persona in enumerate(personas):
        assert prompts[i].startswith("You are " + persona)
        debate = prompts[3 + i]
        assert debate.startswith("You are " + persona)
        mine, others = debate.split("The other experts answered:")
        assert first[i] in mine and first[i] not in others
        assert all(first[j] in others for j in range(3) if j != i)


async def test_multipersona_asks_the_picker_when_no_two_revisions_agree(iso):
    question = "Context: Paris is the capital of France.\nQuestion: What is the capital of France?"
    qa = dataclasses.replace(gsm8k_problem(), benchmark="hotpotqa", id="q1", family="qa", answer="",
                             golds=["Paris"], question=question)
    replies = ["A0\nAnswer: Paris", "A1\nAnswer: Lyon", "A2\nAnswer: Nice",
               "R0\nAnswer: Paris", "R1\nAnswer: the city of Paris", "R2\nAnswer: Nice", "B"]
    ex = ScriptedExecutor(replies=replies)
    res = await execute_workflow(baseline_workflow("qa", "multipersona"), qa, ex, iso)
    assert res.status == Status.OK, res.error
    assert res.usage.llm_calls == len(ex.calls) == 3 * (1 + MULTIPERSONA_ROUNDS) + 1 == 7
    assert PICKER in user_prompt(ex.calls[6])
    assert all(user_prompt(c).startswith("You are " + PERSONAS["qa"][i % 3]) for i, c in enumerate(ex.calls[:6]))
    assert res.answer == "R1\nAnswer: the city of Paris"  # the picker said B


async def test_multipersona_code_returns_a_function_the_picker_chose(iso):
    p = humaneval_problem()
    first = [fn("False"), fn("True"), fn("None")]
    # persona 0 revises to prose: it keeps its own first function
    revised = ["I would keep mine.", fn("len(numbers) > 1"), fn("threshold > 0")]
    ex = ScriptedExecutor(replies=first + revised + ["C"])
    res = await execute_workflow(baseline_workflow("code", "multipersona"), p, ex, iso)
    assert res.status == Status.OK, res.error
    assert res.usage.llm_calls == 7 and [t["op"] for t in res.trace] == ["code_generate"] * 6 + ["sc_ensemble"]
    picker = user_prompt(ex.calls[6])
    assert PICKER in picker and "return False" in picker and "I would keep mine" not in picker
    assert res.answer == solution_code(p, fn("threshold > 0"))


# ------------------------------------------------------------------------------------ the real model


class RecordingExecutor:
    """Passes calls to the real executor and keeps each prompt and reply."""

    def __init__(self, inner):
        self.inner = inner
        self.model = inner.model
        self.log: list[tuple[str, str]] = []

    async def chat(self, messages, params):
        res = await self.inner.chat(messages, params)
        self.log.append((messages[-1]["content"], res.text))
        return res

    async def aclose(self):
        pass


def multipersona_finals(problem, replies: list[str]) -> list[str]:
    """What the workflow hands sc_ensemble, rebuilt from the executor's replies (by the workflow's rules)."""
    n = len(PERSONAS[problem.family])
    if problem.family != "code":
        return replies[n:2 * n]
    first = [solution_code(problem, r) or r for r in replies[:n]]
    out = []
    for i, r in enumerate(replies[n:2 * n]):
        new = solution_code(problem, r) or r
        out.append(new if "def " in new else first[i])
    return out


@pytest.mark.model
async def test_real_model_runs_self_refine_and_multipersona_on_humaneval_and_gsm8k(iso):
    from spogw_dagster.executors.embedded import EmbeddedExecutor

    ops = OperatorConfig(max_tokens=48)  # short replies: 24 calls must fit in about a minute on 2 cores
    ex = RecordingExecutor(EmbeddedExecutor())
    for bench in ("humaneval", "gsm8k"):
        problem = held_out_problems(bench, limit=1)[0]
        fam = problem.family
        for method in NEW_METHODS:
            ex.log.clear()
            res = await execute_workflow(baseline_workflow(fam, method), problem, ex, iso, seed=3, op_cfg=ops)
            assert res.status == Status.OK, (bench, method, res.status, res.error)
            assert res.usage.llm_calls == len(ex.log)
            assert res.usage.completion_tokens > 0
            if method == "self_refine":
                assert res.usage.llm_calls == 1 + SELF_REFINE_ROUNDS * (1 if fam == "code" else 2)
                continue
            replies = [r for _, r in ex.log]
            finals = multipersona_finals(problem, replies)
            keys = [vote_key(fam, s) for s in finals]
            picker = len(set(keys)) == len(keys)  # no two agree: sc_ensemble asks the executor to pick
            assert res.usage.llm_calls == 3 * (1 + MULTIPERSONA_ROUNDS) + picker
            assert (PICKER in ex.log[-1][0]) == picker
            assert res.answer in finals


# ------------------------------------------------ adaptive structure: more drafts only where the tests fail

RIGHT_HE0 = fn("any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])")


def test_adaptive_structure_is_a_valid_code_workflow_that_branches_on_check():
    code = baseline_workflow("code", "adaptive_sc3")
    parsed = validate(code, "code")
    assert parsed.operators_used == ("check", "code_generate", "sc_ensemble", "test")
    with pytest.raises(ValueError, match="code benchmarks only"):
        baseline_workflow("math", "adaptive_sc3")


async def test_adaptive_structure_stops_after_one_call_when_the_first_draft_passes(iso):
    p = humaneval_problem()
    ex = ScriptedExecutor(replies=[RIGHT_HE0, fn("False"), fn("False")])
    res = await execute_workflow(baseline_workflow("code", "adaptive_sc3"), p, ex, iso)
    assert res.status == Status.OK, res.error
    assert res.usage.llm_calls == len(ex.calls) == 1
    assert [t["op"] for t in res.trace] == ["code_generate", "check"]
    assert res.answer == solution_code(p, RIGHT_HE0)


async def test_adaptive_structure_drafts_twice_more_when_the_first_fails(iso):
    p = humaneval_problem()
    # draft 1 fails the public tests; of drafts 2 and 3 only the third passes: the ensemble picks it by the
    # tests (no picker call) and `test` finds nothing to repair, so 3 executor calls in all
    ex = ScriptedExecutor(replies=[fn("False"), fn("True"), RIGHT_HE0])
    res = await execute_workflow(baseline_workflow("code", "adaptive_sc3"), p, ex, iso)
    assert res.status == Status.OK, res.error
    assert res.usage.llm_calls == len(ex.calls) == 3
    assert [t["op"] for t in res.trace] == ["code_generate", "check", "code_generate", "code_generate",
                                            "sc_ensemble", "test"]
    assert res.answer == solution_code(p, RIGHT_HE0)


def test_returning_a_verdict_is_no_attempt_at_the_task():
    from spogw_dagster.core.rewards import is_trivial

    verdict = ("class Workflow:\n    async def run(self):\n        s = await self.code_generate(instruction='')\n"
               "        return await self.check(solution=s)\n")
    assert is_trivial(verdict, True) and not is_trivial(baseline_workflow("code", "adaptive_sc3"), True)
