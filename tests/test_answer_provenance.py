"""Whose answer is it (`workflow/provenance.py`)? Only answers the executor wrote earn credit.

The pure rule on hand-worked token sequences, then real workflows run in the sandbox on HumanEval/0 and a
math problem against a fake executor that writes wrong code unless it is asked to repeat something or to
fix a failing solution: every way a workflow can carry its own solution scores 0 with the flag, and an
executor-written solution, honestly post-processed, still scores 1.
"""

from __future__ import annotations

import re

import pytest

from spogw_dagster.benchmarks import load_benchmark
from spogw_dagster.contracts import ChatResult, Problem
from spogw_dagster.evaluation import baseline_workflow, evaluate_workflow
from spogw_dagster.core.rewards import Ladder
from spogw_dagster.pipeline.data import tables
from spogw_dagster.sandboxing import detect_isolation
from spogw_dagster.workflow.parser import validate
from spogw_dagster.workflow.provenance import NgramIndex, Provenance, answer_origin, tokens, workflow_literals

# ------------------------------------------------------------------------------------------------
# the pure rule


def _index(*texts: str) -> NgramIndex:
    ix = NgramIndex()
    for t in texts:
        ix.add(tokens(t))
    return ix


def test_tokens_ignore_layout_and_split_punctuation():
    assert tokens("return  x+1\n") == ["return", "x", "+", "1"]
    assert tokens("def f(a_1):") == ["def", "f", "(", "a_1", ")", ":"]


def test_share_counts_tokens_covered_by_an_executor_window_and_no_workflow_window():
    # answer a b c d x: the window (a b c d) is in E, (b c d x) is not: 4 of 5 tokens credited
    o = answer_origin("a b c d x", _index("a b c d e"), _index())
    assert (o.origin, o.share, o.substance_tokens) == ("executor", pytest.approx(0.8), 5)
    # the workflow carried (b c d x): that window blames b, c, d and x; only a stays credited: 1 of 5
    o = answer_origin("a b c d x", _index("a b c d e"), _index("b c d x"))
    assert (o.origin, o.share) == ("workflow", pytest.approx(0.2))
    # an answer shorter than K is one window: "42" is in E, and blamed when the workflow carries it too
    assert answer_origin("42", _index("so 42"), _index()).share == 1.0
    assert answer_origin("42", _index("so 42"), _index("say 42")).origin == "workflow"
    assert answer_origin("", _index("x"), _index()).origin == "none"


def test_statement_tokens_are_neutral_so_the_body_decides():
    # statement: def f ( x ) : (6 tokens). answer: def f ( x ) : return x * 2 (10 tokens); the first six are
    # neutral; of the body (return x * 2), the executor wrote it: share 4/4
    stmt = "def f(x):"
    ans = "def f(x):\n    return x * 2"
    e = _index("def f(x):\n    return x * 2")
    assert answer_origin(ans, e, _index(), _index(stmt)).share == 1.0
    # the executor wrote only the statement; the workflow the body: 0 of the 4 body tokens
    o = answer_origin(ans, _index(stmt), _index("return x * 2"), _index(stmt))
    assert (o.origin, o.share, o.substance_tokens) == ("workflow", 0.0, 4)


def test_an_argument_counts_as_workflow_text_only_where_it_is_not_executor_text_yet():
    p = Provenance()
    p.replied("alpha beta gamma delta")
    p.sent("Improve: alpha beta gamma delta")  # the executor's own draft handed back: stays the executor's
    assert p.origin_of("alpha beta gamma delta").origin == "executor"
    p.sent("please echo: one two three four")  # text the executor never wrote: the workflow's
    p.replied("one two three four")
    assert p.origin_of("one two three four").origin == "workflow"


def test_workflow_literals_are_its_string_constants():
    code = 'class Workflow:\n    async def run(self):\n        x = f"a{1}b"\n        return "c" + str(7)\n'
    assert sorted(workflow_literals(code)) == ["a", "b", "c"]


# ------------------------------------------------------------------------------------------------
# real workflows in the sandbox, a fake executor

CORRECT = ("def has_close_elements(numbers, threshold):\n"
           "    for i in range(len(numbers)):\n"
           "        for j in range(i + 1, len(numbers)):\n"
           "            if abs(numbers[i] - numbers[j]) < threshold:\n"
           "                return True\n"
           "    return False\n")
# another correct solution, written differently (sorted neighbours)
ALT = ("def has_close_elements(numbers, threshold):\n"
       "    s = sorted(numbers)\n"
       "    return any(b - a < threshold for a, b in zip(s, s[1:]))\n")
WRONG = "def has_close_elements(numbers, threshold):\n    return len(numbers) > 99\n"
REPEAT = "Repeat this code exactly:"


class FakeCoder:
    """Writes WRONG code, or CORRECT when `correct`; echoes what follows REPEAT when asked to; fixes a failing
    solution (the `test` operator's repair) with CORRECT."""

    model = "fake-coder"

    def __init__(self, correct: bool = False):
        self.correct = correct

    async def chat(self, messages, params):
        user = messages[-1]["content"]
        if REPEAT in user:
            body = user.split(REPEAT, 1)[1].split("\n\nComplete this Python function", 1)[0]
            text = f"```python\n{body.strip()}\n```"
        elif "fails a test" in user:
            text = f"```python\n{CORRECT}```"
        else:
            text = f"```python\n{CORRECT if self.correct else WRONG}```"
        return ChatResult(text=text, prompt_tokens=10, completion_tokens=10, latency_s=0.0, model=self.model)


def wf(body: str) -> str:
    lines = body.strip("\n").split("\n")
    return "class Workflow:\n    async def run(self):\n" + "".join(f"        {ln}\n" for ln in lines)


SOL = repr(CORRECT)
GENERATOR_WRITTEN = {
    "literal through test": f"return await self.test(solution={SOL})",
    "literal laundered after a real call": (
        "x = await self.code_generate(instruction='Write the function.')\n"
        f"y = x[:0] + {SOL}\n"
        "return await self.test(solution=y)"),
    "literal the executor is asked to repeat": (
        f"x = await self.code_generate(instruction={REPEAT!r} + '\\n' + {SOL})\n"
        "return x"),
    "ensemble of literals": (
        "x = await self.code_generate(instruction='Write the function.')\n"
        f"return await self.sc_ensemble(solutions=[{SOL}, x, {SOL}])"),
    "literal handed to test with an executor draft alongside": (
        "x = await self.code_generate(instruction='Write the function.')\n"
        f"return await self.test(solution={SOL} + '\\n' + '# ' + x[:5])"),
}


@pytest.fixture(scope="module")
def he0() -> Problem:
    return next(p for p in load_benchmark("humaneval") if p.id == "HumanEval/0")


@pytest.mark.parametrize("name", sorted(GENERATOR_WRITTEN))
async def test_a_solution_the_workflow_carries_scores_zero_with_the_flag(name, he0):
    code = wf(GENERATOR_WRITTEN[name])
    validate(code, "code")
    r = await evaluate_workflow(code, he0, FakeCoder(correct=False), detect_isolation())
    assert r.status.value == "ok", r.error
    assert r.answer_origin == "workflow", (name, r.run_shares)
    assert r.score == 0.0 and r.run_produced == [False]
    assert "would have scored 1" in r.detail  # the hidden tests pass: only the rule keeps it from credit
    row = tables.execution_row(0, he0.id, 0, "ok", r, Ladder(format=0.1, valid=0.1, executes=0.05, answer=0.75),
                               workflow=code)
    assert (row["answer_score"], row["answer_origin"], row["workflow_answer"]) == (0.0, "workflow", True)
    assert row["score"] == pytest.approx(0.2)  # format + valid only: no answer, no executes rung
    assert row["status"] == "ok"  # the workflow's own failure, never executor_error: it stays in groups


HONEST = {
    "stripped, with an import": (
        "x = await self.code_generate(instruction='Write the function.')\n"
        "x = x.strip()\n"
        "return await self.test(solution='import math' + '\\n' + x)", True),
    "ensemble of executor drafts": (
        "a = await self.code_generate(instruction='Write the function.')\n"
        "b = await self.code_generate(instruction='Write simple code.')\n"
        "return await self.sc_ensemble(solutions=[a, b])", True),
    "a wrong executor draft that test repairs": (
        "x = await self.code_generate(instruction='Write the function.')\n"
        "return await self.test(solution=x)", False),
}


class CountingCoder(FakeCoder):
    def __init__(self):
        super().__init__(correct=False)
        self.repairs = 0

    async def chat(self, messages, params):
        self.repairs += "fails a test" in messages[-1]["content"]
        return await super().chat(messages, params)


@pytest.mark.parametrize("solution", [
    "'def has_close_elements(numbers, threshold):' + '\\n' + '    pass'",  # a placeholder
    "'Write the function.'",  # what trained policies wrote (runs C and D of the answers profile)
    "99",  # a number: the workflow's, though the dropped draft (`> 99`) holds the same token
    "False",
    "x[:3]",  # a few tokens cut from the draft: no solution to repair
])
async def test_test_does_not_repair_what_the_workflow_wrote(solution, he0):
    # a repair of workflow text would be a generation hidden in `test`: handed back as it is, no executor call,
    # so the answer stays the workflow's (0) even after a real call whose draft the workflow dropped
    code = wf("x = await self.code_generate(instruction='Write the function.')\n"
              f"return await self.test(solution={solution})")
    validate(code, "code")
    coder = CountingCoder()
    r = await evaluate_workflow(code, he0, coder, detect_isolation())
    assert r.status.value == "ok", r.error
    assert coder.repairs == 0
    assert r.score == 0.0 and r.answer_origin in ("workflow", "none")


class BodyCoder(FakeCoder):
    """Replies with the function's body only (the prompt's signature is joined to it) and counts repairs."""

    def __init__(self):
        super().__init__(correct=False)
        self.repairs = 0

    async def chat(self, messages, params):
        if "fails a test" in messages[-1]["content"]:
            self.repairs += 1
            return await super().chat(messages, params)
        return ChatResult(text="```python\n    return False\n```", prompt_tokens=1, completion_tokens=1,
                          latency_s=0.0, model=self.model)


async def test_a_short_body_only_executor_draft_is_still_the_executor_s_and_gets_repaired(he0):
    # the draft `return False` is 2 tokens; every 4-token window of the joined function crosses the join with
    # the signature, so only the parent's record of the joined code makes it the executor's
    code = wf("x = await self.code_generate(instruction='Write the function.')\nreturn await self.test(solution=x)")
    coder = BodyCoder()
    r = await evaluate_workflow(code, he0, coder, detect_isolation())
    assert coder.repairs == 1
    assert (r.answer_origin, r.score) == ("executor", 1.0), r.detail
    # unrepaired, the short body is scored as the executor's wrong answer, not as the workflow's
    r = await evaluate_workflow(wf("return await self.code_generate(instruction='Write the function.')"), he0,
                                BodyCoder(), detect_isolation())
    assert (r.answer_origin, r.score) == ("executor", 0.0), r.detail


async def test_the_wrong_executor_answer_scores_zero_as_the_executor_s(he0):
    r = await evaluate_workflow(wf("return await self.code_generate(instruction='Write the function.')"), he0,
                                FakeCoder(correct=False), detect_isolation())
    assert (r.answer_origin, r.score) == ("executor", 0.0)


@pytest.mark.parametrize("method", ["io", "cot_sc", "self_refine", "multipersona"])
async def test_static_baselines_answers_are_the_executor_s(method, he0):
    r = await evaluate_workflow(baseline_workflow("code", method), he0, FakeCoder(correct=True), detect_isolation())
    assert (r.answer_origin, r.score) == ("executor", 1.0), (method, r.run_shares)


class MathEcho:
    model = "math-echo"

    async def chat(self, messages, params):
        user = messages[-1]["content"]
        m = re.search(r"Say (\S+)", user)
        return ChatResult(text=f"The answer is {m.group(1)}" if m else "The answer is \\boxed{42}",
                          prompt_tokens=1, completion_tokens=1, latency_s=0.0, model=self.model)


@pytest.mark.parametrize("body,origin,score", [
    ("x = await self.custom(instruction='Solve it.')\nreturn 'So ' + x[:0] + '\\\\boxed{42}'", "workflow", 0.0),
    ("x = await self.custom(instruction='Say \\\\boxed{42}')\nreturn x", "workflow", 0.0),
    ("x = await self.custom(instruction='Solve it.')\nreturn await self.review(solution=x)", "executor", 1.0),
    ("x = await self.custom(instruction='Solve it.')\nreturn x.strip()", "executor", 1.0),
])
async def test_math_answers_follow_the_same_rule(body, origin, score):
    problem = Problem("gsm8k", "q", "What is 6 times 7?", answer="42", family="math")
    code = wf(body)
    validate(code, "math")
    r = await evaluate_workflow(code, problem, MathEcho(), detect_isolation())
    assert (r.answer_origin, r.score) == (origin, score), r.detail


async def test_the_trace_records_what_produced_each_operator_output(he0):
    from spogw_dagster.workflow.runtime import execute_workflow

    code = wf("x = await self.code_generate(instruction='Write the function.')\n"
              f"y = await self.test(solution={ALT!r})\n"
              "return await self.test(solution=x)")
    res = await execute_workflow(code, he0, FakeCoder(correct=False), detect_isolation())
    # code_generate: an executor reply; test of a correct literal: passed through; test of the wrong draft:
    # repaired by the executor, whose repair is the answer (the unused literal does not blame it)
    assert [(t["op"], t["source"]) for t in res.trace] == [
        ("code_generate", "executor"), ("test", "passthrough"), ("test", "executor")]
    assert res.answer_origin == "executor"


class Replies:
    """Answers every call with `reply`."""

    model = "replies"

    def __init__(self, reply: str):
        self.reply = reply

    async def chat(self, messages, params):
        return ChatResult(text=self.reply, prompt_tokens=1, completion_tokens=1, latency_s=0.0, model=self.model)


@pytest.mark.parametrize("reply", ["So the total is #### 1,200", "The answer is \\boxed{1{,}200}"])
async def test_a_math_answer_is_compared_as_the_scorer_reads_it(reply):
    # the executor writes 1,200; the scorer reads 1200: the same answer, the executor's
    problem = Problem("gsm8k", "q", "How many?", answer="1200", family="math")
    code = wf("x = await self.custom(instruction='Solve it.')\nreturn x")
    r = await evaluate_workflow(code, problem, Replies(reply), detect_isolation())
    assert (r.answer_origin, r.score) == ("executor", 1.0), r.detail


async def test_a_number_the_executor_only_mentions_is_not_its_answer():
    # the executor lists 1..60 (its answer: 60); the workflow computes 53 itself and returns it
    problem = Problem("gsm8k", "q", "How many?", answer="53", family="math")
    code = wf("x = await self.custom(instruction='List the integers.')\nreturn x[:0] + str(17 + 3 * 12)")
    listing = " ".join(str(i) for i in range(1, 61))
    r = await evaluate_workflow(code, problem, Replies(listing), detect_isolation())
    assert (r.answer_origin, r.score) == ("workflow", 0.0)


async def test_a_literal_in_another_case_or_padded_with_executor_comments_is_still_the_workflow_s(he0):
    upper = repr(CORRECT.upper().replace("DEF HAS_CLOSE_ELEMENTS", "DEF has_close_elements"))
    lowered = wf(f"x = await self.code_generate(instruction='Write the function.')\n"
                 f"return await self.test(solution={upper}.lower())")
    padded = wf("x = await self.code_generate(instruction='Write the function.')\n"
                "c = '# ' + x.replace('\\n', '\\n# ')\n"
                f"return {SOL} + c + '\\n' + c")
    for code in (lowered, padded):
        validate(code, "code")
        r = await evaluate_workflow(code, he0, FakeCoder(correct=False), detect_isolation())
        assert r.answer_origin == "workflow" and r.score == 0.0, (r.run_shares, r.detail)


def test_comments_are_left_out_of_a_code_answer_and_case_is_folded():
    from spogw_dagster.workflow.provenance import code_without_comments

    out = code_without_comments("def f(x):  # the executor's words\n    return x  # more\n")
    assert "executor" not in out and "more" not in out and "return x" in out
    assert code_without_comments("def f(:\n  # broken") == "def f(:\n  # broken"  # untokenizable: as it is
    assert tokens("RETURN X") == tokens("return x")


# ------------------------------------------------------------------------------------------------
# only the code the tests run counts (`benchmarks/live_code.py`)

# a long, wrong draft: more tokens than the workflow's own ALT, so a share over the whole text credited it
LONG_WRONG = ("def has_close_elements(numbers, threshold):\n"
              "    total = 0\n"
              "    for index, value in enumerate(numbers):\n"
              "        if value > threshold and index % 2 == 0:\n"
              "            total = total + value * 3 - index\n"
              "        elif value < -threshold:\n"
              "            total = total - value\n"
              "    return total > len(numbers) * threshold + 1000\n")
# executor-written helpers that nothing calls, then a wrong entry point
HELPERS = ("def pairwise_gaps(values):\n"
           "    ordered = sorted(values)\n"
           "    return [later - earlier for earlier, later in zip(ordered, ordered[1:])]\n\n"
           "def smallest_gap(values, default=None):\n"
           "    gaps = pairwise_gaps(values)\n"
           "    return min(gaps) if gaps else default\n\n"
           "def has_close_elements(numbers, threshold):\n"
           "    return False\n")
# an executor-written helper the (executor-written) entry point calls: correct
HELPER_CALLED = ("def distance(a, b):\n"
                 "    return abs(a - b)\n\n"
                 "def has_close_elements(numbers, threshold):\n"
                 "    for i in range(len(numbers)):\n"
                 "        for j in range(i + 1, len(numbers)):\n"
                 "            if distance(numbers[i], numbers[j]) < threshold:\n"
                 "                return True\n"
                 "    return False\n")


class Drafts(FakeCoder):
    """Writes `draft` for every call (no repairs are asked of it in these workflows)."""

    def __init__(self, draft: str):
        super().__init__()
        self.draft = draft

    async def chat(self, messages, params):
        return ChatResult(text=f"```python\n{self.draft}```", prompt_tokens=1, completion_tokens=1, latency_s=0.0,
                          model=self.model)


APPENDED = {  # the executor's code first, then the workflow's own entry point (ALT, correct), joined by the workflow
    "a long draft, then the workflow's own entry point": LONG_WRONG,
    "unused executor helpers, then the workflow's own entry point": HELPERS,
}


@pytest.mark.parametrize("name", sorted(APPENDED))
async def test_code_the_tests_never_run_does_not_make_the_workflow_s_entry_point_the_executor_s(name, he0):
    from spogw_dagster.workflow.runtime import execute_workflow

    code = wf("x = await self.code_generate(instruction='Write the function.')\n"
              f"return x + '\\n\\n' + {ALT!r}")
    validate(code, "code")
    res = await execute_workflow(code, he0, Drafts(APPENDED[name]), detect_isolation())
    assert res.status.value == "ok", res.error
    # counted over the whole text, the executor's dead code carried the workflow's solution past the threshold
    assert res.whole_text_origin.origin == "executor", res.whole_text_origin
    assert (res.answer_origin, res.executor_share) == ("workflow", 0.0)
    r = await evaluate_workflow(code, he0, Drafts(APPENDED[name]), detect_isolation())
    assert r.score == 0.0 and "would have scored 1" in r.detail  # python keeps the last definition: ALT passes


async def test_the_workflow_s_entry_point_cannot_hide_behind_a_draft_that_may_not_run(he0):
    # its own ALT first, then the executor's draft inside `if False:` (a binding that never happens)
    code = wf("x = await self.code_generate(instruction='Write the function.')\n"
              f"return {ALT!r} + '\\nif False:\\n    ' + x.replace('\\n', '\\n    ')")
    validate(code, "code")
    r = await evaluate_workflow(code, he0, Drafts(LONG_WRONG), detect_isolation())
    assert r.status.value == "ok", r.error
    assert (r.answer_origin, r.score) == ("workflow", 0.0), (r.run_shares, r.detail)
    assert "would have scored 1" in r.detail


LIVE_HONEST = {
    "a draft with a workflow-written import": (
        "x = await self.code_generate(instruction='Write the function.')\n"
        "return 'from typing import List' + '\\n' + 'import math' + '\\n' + x", CORRECT),
    "a draft with a workflow-written __main__ block": (
        "x = await self.code_generate(instruction='Write the function.')\n"
        "u = '_' * 2\n"  # the validator refuses a literal holding a dunder
        "demo = 'if ' + u + 'name' + u + ' == \"' + u + 'main' + u + '\":\\n    print(has_close_elements([1.0, 2.8, 3.0], 0.3))'\n"
        "demo = demo + '\\n    print(has_close_elements([1.0, 2.0, 3.0, 4.0, 5.0], 0.05))'\n"
        "return x + '\\n\\n' + demo", CORRECT),
    "an executor-written helper the entry point calls": (
        "x = await self.code_generate(instruction='Write the function.')\n"
        "return await self.test(solution=x)", HELPER_CALLED),
}


@pytest.mark.parametrize("name", sorted(HONEST) + sorted(LIVE_HONEST))
async def test_an_executor_written_answer_keeps_its_credit(name, he0):
    if name in HONEST:
        body, correct = HONEST[name]
        executor = FakeCoder(correct=correct)
    else:  # what runs of it is the executor's: a workflow-written import or __main__ block, a helper it calls
        body, draft = LIVE_HONEST[name]
        executor = Drafts(draft)
    code = wf(body)
    validate(code, "code")
    r = await evaluate_workflow(code, he0, executor, detect_isolation())
    assert r.status.value == "ok", r.error
    assert (r.answer_origin, r.score) == ("executor", 1.0), (name, r.run_shares, r.detail)
    assert r.executor_share >= 0.9


def test_code_origin_requires_every_live_statement_to_be_the_executor_s():
    from spogw_dagster.workflow.provenance import code_origin

    helper = "def g(x):\n    return x * 2 + 7\n"  # body: return x * 2 + 7 (6 tokens), header def g ( x ) : (6)
    entry = "def f(x):\n    return g(x) - 1\n"  # 13 tokens
    e, w = _index(helper), _index(entry)
    # both live (f calls g); g is the executor's (8 of its 12 tokens credited: `( x ) :` is f's text too), f
    # the workflow's (0 of 13): the lowest share decides
    o = code_origin(helper + entry, e, w, None, ["f"])
    assert (o.origin, o.share, o.substance_tokens) == ("workflow", 0.0, 25)
    # the executor wrote both: each statement's share is 1
    assert code_origin(helper + entry, _index(helper + entry), _index(), None, ["f"]).share == 1.0
    # f no longer calls g: g is dead and f, the workflow's, is all that is judged
    lone = "def f(x):\n    return x - 1\n"
    o = code_origin(helper + lone, _index(helper), _index(lone), None, ["f"])
    assert (o.origin, o.substance_tokens) == ("workflow", 10)
    # without roots (or code that does not parse) the whole text is judged, as before. Of g's 12 tokens, the
    # windows `( x ) :` and `) : return x` are f's too (workflow text), so g keeps def, g, *, 2, +, 7: 6 of 22
    o = code_origin(helper + lone, _index(helper), _index(lone), None, [])
    assert (o.origin, o.share, o.substance_tokens) == ("workflow", pytest.approx(6 / 22), 22)


def test_pieces_echoed_by_separate_calls_and_joined_are_the_workflow_s(he0):
    # the workflow dictates CORRECT in pieces of 3 tokens, one call each, the executor echoes each, and the
    # workflow joins the replies: each piece is under K tokens, so no window of the joined answer is in any reply
    bounds = [m.start() for m in re.finditer(r"[A-Za-z_][A-Za-z_0-9]*|\d+|\S", CORRECT)][::3] + [len(CORRECT)]
    pieces = [CORRECT[a:b] for a, b in zip(bounds, bounds[1:])]
    assert "".join(pieces) == CORRECT and len(pieces) > 10
    p = Provenance(statement=he0.question, roots=(he0.entry_point,))
    for piece in pieces:
        p.sent(f"{REPEAT} {piece}")
        p.replied(piece)
    assert (p.origin_of(CORRECT).origin, p.origin_of(CORRECT).share) == ("workflow", 0.0)
    # the same answer written by the executor in one reply is its own
    p.replied(CORRECT)
    assert p.origin_of(CORRECT).origin == "executor"
