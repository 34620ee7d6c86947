"""Workflows and answers that try to own their failure: make a wrong row disappear instead of scoring 0.

A row whose status is `executor_error` leaves training groups and every held-out metric (see
`contracts.Status`), so a policy that could reach that status when its answer looks wrong would lose no
reward and inflate its solve rate. Each workflow and answer here tries a way to get there: text no encoder
takes (a lone surrogate) in an operator argument, in its answer or in its exception; a prompt the executor
chokes on; more operator calls or time than it is allowed; a program that floods its output before the
sandbox's ready line is read. Every one must end with its own status (`ok` with score 0, `runtime_error`,
`timeout`), its row must enter curation with its low score, and an executor that really is down must still
give `executor_error` (the outage path keeps working).

The executor is a local fake OpenAI-compatible server behind the real client stack (`OpenAICompatExecutor`
wrapped in `FaultAttributingExecutor`, as `make_executor` builds it); workflows run under bwrap and Docker
(skipped, saying why, where no engine can start), through `execute_workflow` and through `spogw
exec-workflow`.
"""

from __future__ import annotations

import asyncio
import io
import os
import random
import time

import polars as pl
import pytest

from spogw_dagster.contracts import EXCLUDED_STATUSES, ChatResult, Problem, SamplingParams, Status
from spogw_dagster.core.curation import curate
from spogw_dagster.core.hyperparams import CurationConfig
from spogw_dagster.evaluation import evaluate_workflow
from spogw_dagster.executors.attribution import FaultAttributingExecutor
from spogw_dagster.executors.openai_compat import OpenAICompatExecutor
from spogw_dagster.sandboxing import Limits, detect_isolation, run_code
from spogw_dagster.core.rewards import Ladder
from spogw_dagster.pipeline.data.tables import execution_frame, execution_row
from spogw_dagster.workflow.operators import OperatorConfig
from spogw_dagster.workflow.runtime import execute_workflow
from tests.fake_openai_server import FakeOpenAIServer, error
from tests.test_hostile_answers import (  # noqa: F401  (isolation: the bwrap/docker fixture)
    CONTROL,
    TEST_WF,
    _Answers,
    _answer,
    _exec_workflow,
    isolation,
)

MATH = Problem("gsm8k", "gsm8k/test/x", "What is 6 times 7?", answer="42", family="math")
FAST = Limits(wall_s=30, cpu_s=10)
CHOKE = "CHOKE-THE-SERVER"  # a server fails on any prompt holding this (its chat template cannot take it)


def wf(body: str) -> str:
    return "class Workflow:\n    async def run(self):\n" + "".join(
        "        " + ln + "\n" for ln in body.strip("\n").splitlines())


def _wrong_math_answer(body: dict, n: int) -> str:
    return "6 times 7 is \\boxed{41}"  # always wrong: every hostile run must score 0


def _server(**kw) -> FakeOpenAIServer:
    def chokes(body):
        text = " ".join(str(m.get("content")) for m in body["messages"])
        if CHOKE in text:
            return error(500, "chat template error: unexpected token")
        if len(text) > 12_000:
            return error(400, "This model's maximum context length is 2048 tokens")
        return None
    return FakeOpenAIServer(answer_fn=kw.pop("answer_fn", _wrong_math_answer), behaviour_fn=chokes, **kw)


def _client(srv: FakeOpenAIServer) -> FaultAttributingExecutor:
    return FaultAttributingExecutor(OpenAICompatExecutor(srv.base_url, srv.model, api_key_env=None, max_retries=1,
                                                         backoff_base_s=0.01, backoff_max_s=0.02, timeout_s=10))


# Each returns the executor's (wrong) answer after its trick, or fails in its own way.
ABSTAINERS = {
    "surrogate_in_instruction": ("x = await self.custom(instruction='\\ud800 solve it')\nreturn x", "ok"),
    "surrogate_only_when_wrong": ("x = await self.custom(instruction='solve it')\nif '42' not in x:\n"
                                  "    x = await self.review(solution=x + '\\udfff\\ud800')\nreturn x", "ok"),
    "surrogate_in_a_list_argument": ("x = await self.custom(instruction='solve')\n"
                                     "return await self.sc_ensemble(solutions=[x, '\\ud800 \\\\boxed{41}'])", "ok"),
    "surrogate_in_its_answer": ("x = await self.custom(instruction='solve it')\nreturn x + '\\ud800'", "ok"),
    "surrogate_in_its_exception": ("x = await self.custom(instruction='solve it')\nif '42' not in x:\n"
                                   "    raise ValueError('\\ud800' + x)\nreturn x", "runtime_error"),
    "nul_and_controls": ("x = await self.custom(instruction='\\x00\\x1b[2J\\r\\n solve')\nreturn x", "ok"),
    "a_prompt_the_server_chokes_on": (f"x = await self.custom(instruction='{CHOKE}')\nreturn x", "runtime_error"),
    "chokes_then_catches_it": (f"try:\n    x = await self.custom(instruction='{CHOKE}')\nexcept OperatorError:\n"
                               "    x = await self.custom(instruction='solve')\nreturn x", "ok"),
    "a_prompt_over_the_context": ("x = await self.custom(instruction='w ' * 9000)\nreturn x", "runtime_error"),
    "wrong_argument_types": ("x = await self.custom(instruction='solve')\n"
                             "return await self.sc_ensemble(solutions=[1, None])", "runtime_error"),
    "more_calls_than_allowed": ("x = ''\nfor i in range(40):\n    x = await self.custom(instruction='solve')\n"
                                "return x", "runtime_error"),
}


@pytest.mark.parametrize("name", sorted(ABSTAINERS))
async def test_a_workflow_cannot_turn_its_wrong_answer_into_an_executor_error(name, isolation):
    body, expected = ABSTAINERS[name]
    iso = detect_isolation(isolation)
    with _server() as srv:
        ex = _client(srv)
        res = await evaluate_workflow(wf(body), MATH, ex, iso, limits=FAST)
        await ex.aclose()
    assert res.status.value == expected, (res.status, res.error)
    assert res.score == 0.0
    # whatever it sent or returned, the text is valid and the row can be written
    row = execution_row(0, MATH.id, 0, "ok", res, Ladder(), workflow=wf(body))
    frame = execution_frame([row])
    frame.write_parquet(io.BytesIO())
    assert "\ud800" not in res.answer + res.error
    if name == "surrogate_in_its_answer":
        assert res.answer.endswith("\\boxed{41}?")
    if name == "surrogate_in_instruction":  # sent, with the surrogate replaced
        assert srv.requests[0]["messages"][-1]["content"].startswith("? solve it")


async def test_its_row_enters_training_groups_with_its_low_score():
    """Three workflows that answer right and one that sends an unencodable string once its answer looks
    wrong: all four are scored, and the abstainer is a bottom member of the group with a negative advantage."""
    def answer(body, n):
        return "\\boxed{41}" if "careless" in str(body["messages"][-1]["content"]) else "\\boxed{42}"

    good = wf("return await self.custom(instruction='solve it')")
    abstainer = wf("x = await self.custom(instruction='careless')\nif '42' not in x:\n"
                   "    await self.custom(instruction='\\ud800')\nreturn x")
    codes = [good, good.replace("solve it", "solve this"), good.replace("solve it", "work it out"), abstainer]
    iso = detect_isolation()
    with _server(answer_fn=answer) as srv:
        ex = _client(srv)
        results = [await evaluate_workflow(c, MATH, ex, iso, limits=FAST) for c in codes]
        await ex.aclose()
    assert [r.status for r in results] == [Status.OK] * 4
    assert [r.score for r in results] == [1.0, 1.0, 1.0, 0.0]
    rows = execution_frame([execution_row(0, MATH.id, i, "ok", r, Ladder(), workflow=c)
                            for i, (r, c) in enumerate(zip(results, codes))])
    samples = rows.select("iteration", "query_id", "sample_idx", "score", "status").with_columns(
        pl.Series("workflow", codes))
    out = curate(samples, CurationConfig(m=4, n=4, t=1, tau_sim=1.0, tau_std=0.0))
    assert out.dropped_rows.height == 0
    bottom = out.members.filter(pl.col("role") == "bottom").row(0, named=True)
    assert bottom["sample_idx"] == 3 and bottom["score"] == 0.0 and bottom["advantage"] < 0


@pytest.mark.parametrize("down", ["503", "refused"])
async def test_an_executor_that_is_really_down_still_gives_executor_error(down):
    srv = _server(default=down if down == "503" else "ok").start()
    ex = _client(srv)
    if down == "refused":
        srv.stop()
    try:
        res = await execute_workflow(wf("return await self.custom(instruction='solve it')"), MATH, ex,
                                     detect_isolation(), limits=FAST)
    finally:
        srv.stop()
        await ex.aclose()
    assert res.status == Status.EXECUTOR_ERROR and "executor failed" in res.error


class _Timed:
    """Replies after `service_s` seconds of service (its latency_s) and, before that, `queue_s` of waiting for a
    free slot that the latency does not count (as OpenAICompatExecutor reports it)."""

    model = "timed"

    def __init__(self, service_s: float, queue_s: float = 0.0):
        self.service_s, self.queue_s = service_s, queue_s

    async def chat(self, messages, params: SamplingParams) -> ChatResult:
        await asyncio.sleep(self.queue_s + self.service_s)
        return ChatResult("\\boxed{41}", 5, 5, latency_s=self.service_s, model=self.model)

    async def aclose(self):
        pass


async def test_the_operator_time_budget_counts_service_not_queueing():
    loop = wf("x = ''\nfor i in range(6):\n    x = await self.custom(instruction='solve ' + str(i))\nreturn x")
    budget = OperatorConfig(max_operator_wall_s=1.0)
    iso = detect_isolation()
    # 0.4 s of service a call: the 4th call would start after 1.2 s of service, over the 1 s budget
    res = await execute_workflow(loop, MATH, _Timed(0.4), iso, op_cfg=budget, limits=FAST)
    assert res.status == Status.TIMEOUT and "over the budget of 1s" in res.error
    assert res.usage.llm_calls == 3
    # 0.4 s of waiting for a slot (another run's load) and 0.01 s of service: 2.5 s of wall time in operator
    # calls, but only 0.06 s served: the run finishes
    t0 = time.monotonic()
    res = await execute_workflow(loop, MATH, _Timed(0.01, queue_s=0.4), iso, op_cfg=budget, limits=FAST)
    assert res.status == Status.OK and res.usage.llm_calls == 6 and time.monotonic() - t0 > 2.4


async def test_calls_in_flight_unserved_for_too_long_are_an_internal_error_never_excluded():
    """Calls that stay in flight but are not served (an executor queue that never moves, or our own operator
    code stalling on some input) end the run at the backstop as a loud runtime_error, not executor_error."""
    from spogw_dagster.workflow.runtime import INTERNAL_ERROR

    res = await execute_workflow(wf("return await self.custom(instruction='solve it')"), MATH,
                                 _Timed(0.0, queue_s=30), detect_isolation(),
                                 op_cfg=OperatorConfig(max_operator_wall_s=0.2), limits=Limits(wall_s=1, cpu_s=10))
    assert res.status == Status.RUNTIME_ERROR and res.error.startswith(INTERNAL_ERROR), res.error
    assert "overloaded, or our operator code stalled" in res.error and res.wall_s < 10


async def test_a_program_that_floods_its_output_at_once_is_its_failure_not_a_sandbox_start_error(isolation):
    """The ready line precedes the program; a flood on stdout must not hide it (once a race: the stdout reader
    hit the cap before the stderr reader saw the line, and the run became a sandbox start failure)."""
    iso = detect_isolation(isolation)
    flood = "import sys\nsys.stdout.write('x' * 20_000_000)\nsys.stdout.flush()\n"
    limits = Limits(wall_s=20, cpu_s=10, max_output_bytes=200_000)
    results = await asyncio.gather(*(run_code(flood, iso, limits) for _ in range(6)))
    assert [r.status for r in results] == [Status.RUNTIME_ERROR] * 6
    assert all("output limit" in r.error for r in results)


# ---------------------------------------------------------------- answers that abstain, through the CLI

# (the solution's source holds `\ud800` escapes: lone surrogates only once it runs)
SURROGATE_EXCEPTION = '''def has_close_elements(numbers, threshold):
    raise ValueError("\\ud800\\udfff no " + "\\ud83d")
'''
SURROGATE_RESULT = '''def has_close_elements(numbers, threshold):
    return "\\ud800"
'''
SURROGATE_STDERR = '''import sys
sys.stderr.write("\\udcff\\ud800")
def has_close_elements(numbers, threshold):
    print("\\ud800")
    return True
'''


def test_answers_with_unencodable_text_score_zero_with_their_own_status(isolation, tmp_path):
    """A WRONG HumanEval/0 solution whose exception message, return value or output holds lone surrogates, run
    through the `test` operator (which copies the failure text into its fix prompt) by `spogw exec-workflow`:
    each scores 0 with status ok (the fix prompts were sent), never executor_error; the controls score 1."""
    answers = [("control", _answer("control", CONTROL)),
               ("surrogate_exception", _answer("surrogate_exception", SURROGATE_EXCEPTION)),
               ("surrogate_result", _answer("surrogate_result", SURROGATE_RESULT)),
               ("surrogate_stderr", _answer("surrogate_stderr", SURROGATE_STDERR)),
               # the executor's own reply holds a lone surrogate (JSON \\ud800): made valid on arrival
               ("raw_surrogate_reply", "\ud800 " + _answer("raw_surrogate_reply", SURROGATE_RESULT)),
               ("control_again", _answer("control_again", CONTROL))]
    test_wf = tmp_path / "test_wf.py"
    test_wf.write_text(TEST_WF)
    env = {**os.environ, "SPOGW_CACHE_DIR": str(tmp_path / "cache")}
    with FakeOpenAIServer(answer_fn=_Answers(answers)) as srv:
        out = _exec_workflow(test_wf, srv, isolation, len(answers), env)
        fix_prompts = [str(b["messages"][-1]["content"]) for b in srv.requests if "fails a test" in
                       str(b["messages"][-1]["content"])]
    names = [n for n, _ in answers]
    assert out["run_statuses"] == ["ok"] * len(names), out
    assert dict(zip(names, out["run_scores"])) == {"control": 1.0, "surrogate_exception": 0.0, "surrogate_result": 0.0,
                                                   "surrogate_stderr": 0.0, "raw_surrogate_reply": 0.0,
                                                   "control_again": 1.0}, out
    # each failing answer cost 1 generation and 2 fix requests, whose text reached the server made valid
    assert len(fix_prompts) == 2 * 4 and all("\ud800" not in p for p in fix_prompts)


# ---------------------------------------------------------------- a property over generated workflows

# Python expressions (workflow source) for the strings a generated workflow passes around
FRAGMENTS = ["'solve it'", "'\\ud800'", "'\\udfff tail'", "'\\x00'", "'\\u202e rtl'", "'\\U0001F600'", repr(CHOKE),
             "'w ' * 7000", "'\\\\boxed{41}'", "''", "'\\r\\n\\t'", "'42'", "str(7) * 3000"]
ARGS = ["{f}", "x + {f}", "{f} + x", "x"]
REPLIES = ["\\boxed{41}", "\ud800", "\x00 \\boxed{41}", "x" * 50_000, "```python\nprint(41)\n```", ""]


def _random_workflow(rng: random.Random) -> str:
    """A workflow that always calls the executor first, then does random things with hostile strings."""
    f = lambda: rng.choice(FRAGMENTS)  # noqa: E731
    arg = lambda: rng.choice(ARGS).format(f=f())  # noqa: E731
    lines = [f"x = await self.custom(instruction={f()})"]
    for _ in range(rng.randint(0, 3)):
        step = rng.choice(["custom", "review", "sc", "try", "raise"])
        if step == "custom":
            lines.append(f"x = await self.custom(instruction={arg()})")
        elif step == "review":
            lines.append(f"x = await self.review(solution={arg()})")
        elif step == "sc":
            lines.append(f"x = await self.sc_ensemble(solutions=[x, {arg()}])")
        elif step == "try":
            lines += ["try:", f"    x = await self.custom(instruction={arg()})", "except OperatorError:",
                      f"    x = x + {f()}"]
        else:
            lines += [f"if {f()} in x:", f"    raise ValueError({arg()})"]
    lines.append(f"return {arg()}")
    return wf("\n".join(lines))


@pytest.mark.parametrize("mode", ["healthy", "down"])
async def test_excluded_statuses_appear_only_when_the_executor_is_made_to_fail(mode):
    """60 generated workflows (hostile strings in every argument, reply, exception and answer; a server that
    chokes on some prompts): executor_error for every run when the server is down, for none when it is up."""
    rng = random.Random(20 if mode == "healthy" else 21)
    codes = [_random_workflow(rng) for _ in range(60 if mode == "healthy" else 12)]
    replies = iter(rng.choice(REPLIES) for _ in range(10_000))
    if mode == "down":  # every request fails, whatever it holds
        srv = FakeOpenAIServer(default="503").start()
    else:
        srv = _server(answer_fn=lambda body, n: next(replies)).start()
    ex = _client(srv)
    iso = detect_isolation()
    sem = asyncio.Semaphore(4)

    async def one(code):
        async with sem:
            return await evaluate_workflow(code, MATH, ex, iso, limits=FAST)

    try:
        results = await asyncio.gather(*(one(c) for c in codes))
    finally:
        srv.stop()
        await ex.aclose()
    statuses = [r.status for r in results]
    if mode == "healthy":
        assert not any(s in EXCLUDED_STATUSES for s in statuses), [(s, r.error) for s, r in zip(statuses, results)
                                                                   if s in EXCLUDED_STATUSES]
        assert {Status.OK, Status.RUNTIME_ERROR} <= set(statuses)  # the generator covers both outcomes
        frame = execution_frame([execution_row(0, MATH.id, i, "ok", r, Ladder(), workflow=c)
                                 for i, (r, c) in enumerate(zip(results, codes))])
        assert frame.height == len(codes)  # every row encodes
    else:
        assert statuses == [Status.EXECUTOR_ERROR] * len(codes)


async def test_a_bug_of_ours_is_the_runs_runtime_error_and_the_asset_check_flags_it():
    """An executor layer that raises something unexpected (a bug our code has, tripped by this input): the run
    is a runtime_error (a policy cannot hide a wrong answer behind it), counted by the no_internal_errors check."""
    from spogw_dagster.pipeline.defs.checks import no_internal_errors
    from tests.fakes import BrokenExecutor

    res = await evaluate_workflow(wf("return await self.custom(instruction='solve it')"), MATH,
                                  BrokenExecutor(KeyError("a bug")), detect_isolation(), limits=FAST)
    assert res.status == Status.RUNTIME_ERROR and res.error.startswith("internal error serving custom: KeyError")
    rejected = await evaluate_workflow(wf("return 'x'"), MATH, BrokenExecutor(KeyError("unused")), detect_isolation(),
                                 limits=FAST)
    rows = [execution_row(0, MATH.id, i, "ok", r, Ladder()) for i, r in enumerate([rejected, res])]
    check = no_internal_errors(execution_frame(rows))
    assert not check.passed and check.metadata["internal_errors"].value == 1 and "sample 1" in check.description
    assert no_internal_errors(execution_frame(rows[:1])).passed
