"""The parent<->sandbox protocol: operator calls travel over the child's stdin/stdout and back."""

import json

import pytest

from spogw_dagster.sandboxing import Limits, detect_isolation
from spogw_dagster.contracts import Problem, Status
from spogw_dagster.workflow.operators import OperatorConfig
from spogw_dagster.workflow.runtime import execute_workflow
from tests.fakes import ScriptedExecutor

MATH = Problem("gsm8k", "q1", "What is 6 times 7?", answer="42", family="math")
FAST = Limits(wall_s=20, cpu_s=10)


@pytest.fixture(scope="module")
def iso():
    return detect_isolation()


def wf(body: str) -> str:
    return "class Workflow:\n    async def run(self):\n" + "".join(
        "        " + line + "\n" for line in body.strip("\n").splitlines())


async def test_operator_calls_round_trip_and_are_accounted(iso):
    ex = ScriptedExecutor(replies=["first \\boxed{1}", "second \\boxed{2}", "third \\boxed{2}"])
    code = wf("a = await self.custom(instruction='A')\n"
              "b = await self.custom(instruction='B')\n"
              "c = await self.custom('C')\n"
              "return await self.sc_ensemble(solutions=[a, b, c])")
    res = await execute_workflow(code, MATH, ex, iso, limits=FAST)
    assert res.status == Status.OK, res.error
    # majority vote on the boxed answers: 2 wins, the first solution carrying it is returned
    assert res.answer == "second \\boxed{2}"
    assert res.operator_calls == 4
    assert res.usage.llm_calls == 3 and res.usage.prompt_tokens == 21 and res.usage.completion_tokens == 9
    assert res.isolation == iso.name
    # the query text reached the executor (the workflow itself never saw it); instructions came first
    users = [m[-1]["content"] for m, _ in ex.calls]
    assert users[0].startswith("A\n\nWhat is 6 times 7?") and users[2].startswith("C\n\n")


async def test_each_call_gets_its_own_seed_and_reruns_repeat_them(iso):
    ex = ScriptedExecutor()
    code = wf("a = await self.custom(instruction='x')\nb = await self.custom(instruction='x')\nreturn a + b")
    await execute_workflow(code, MATH, ex, iso, limits=FAST, seed=5)
    await execute_workflow(code, MATH, ex, iso, limits=FAST, seed=5)
    seeds = [p.seed for _, p in ex.calls]
    assert seeds[0] != seeds[1]  # identical calls in one run must not collapse into one cached answer
    assert seeds[:2] == seeds[2:]  # a rerun asks for exactly the same calls (cache hits)


async def test_the_run_seed_leaves_the_workflow_out_so_workflows_share_draws(iso):
    # Common random numbers: the k-th call of any workflow on one query and seed draws with one seed, so a
    # re-indented copy or a longer structure sharing a first call pairs with the other on that call.
    ex = ScriptedExecutor()
    one = wf("return await self.custom(instruction='x')")
    three = "class Workflow:\n  async def run(self):\n" + "".join(
        "    " + line + "\n" for line in ["a = await self.custom(instruction='x')",
                                          "b = await self.custom(instruction='y')", "return a + b"])
    await execute_workflow(one, MATH, ex, iso, limits=FAST, seed=5)
    await execute_workflow(three, MATH, ex, iso, limits=FAST, seed=5)
    await execute_workflow(one, MATH, ex, iso, limits=FAST, seed=6)
    await execute_workflow(one, Problem("gsm8k", "q2", "What is 6 times 8?", answer="48", family="math"), ex, iso,
                           limits=FAST, seed=5)
    s = [p.seed for _, p in ex.calls]
    assert s[0] == s[1] and s[2] != s[1]  # same position, same seed; the next position draws anew
    assert s[3] != s[0] and s[4] != s[0]  # another executor seed or another query is another draw


async def test_bad_operator_arguments_become_exceptions_inside_the_workflow(iso):
    code = wf("try:\n    await self.sc_ensemble(solutions=[])\nexcept OperatorError:\n    pass\n"
              "return await self.custom(instruction='ok')")
    res = await execute_workflow(code, MATH, ScriptedExecutor(reply="fine"), iso, limits=FAST)
    assert res.status == Status.OK and res.answer == "fine"


async def test_uncaught_workflow_exception_is_runtime_error(iso):
    res = await execute_workflow(wf("x = await self.custom(instruction='x')\nreturn x[10**6]"), MATH,
                                 ScriptedExecutor(), iso, limits=FAST)
    assert res.status == Status.RUNTIME_ERROR and "IndexError" in res.error


async def test_code_the_compiler_refuses_is_a_runtime_error_not_a_sandbox_violation(iso):
    # A SyntaxError makes CPython open the "file" for its source line: an `open` event that, after the
    # tripwire, would read as an escape attempt. The runner compiles before arming it.
    # The validator refuses it first (INVALID); without the validator the runner must not cry escape.
    code = wf("return await self.custom(instruction='a', instruction='b')")
    res = await execute_workflow(code, MATH, ScriptedExecutor(), iso, limits=FAST)
    assert res.status == Status.INVALID and "keyword argument repeated" in res.error, res
    res = await execute_workflow(code, MATH, ScriptedExecutor(), iso, limits=FAST, validate_code=False)
    assert res.status == Status.RUNTIME_ERROR and "keyword argument repeated" in res.error, res


async def test_executor_failure_is_executor_error_even_if_the_workflow_catches_it(iso):
    code = wf("try:\n    a = await self.custom(instruction='x')\nexcept Exception:\n    a = 'swallowed'\nreturn a")
    res = await execute_workflow(code, MATH, ScriptedExecutor(fail_from=1), iso, limits=FAST)
    assert res.status == Status.EXECUTOR_ERROR
    assert "503" in res.error


async def test_operator_call_budget_stops_a_runaway_loop(iso):
    code = wf("while True:\n    await self.custom(instruction='x')\nreturn 'never'")
    ex = ScriptedExecutor()
    res = await execute_workflow(code, MATH, ex, iso, limits=FAST, op_cfg=OperatorConfig(max_operator_calls=5))
    assert res.status == Status.RUNTIME_ERROR and "more than 5 operator calls" in res.error
    assert len(ex.calls) == 5


async def test_returning_none_is_runtime_error(iso):
    res = await execute_workflow(wf("x = await self.custom(instruction='x')\nreturn None"), MATH,
                                 ScriptedExecutor(), iso, limits=FAST)
    assert res.status == Status.RUNTIME_ERROR and "returned None" in res.error


READY = "print(json.dumps({'type': 'ready'}), flush=True)\n"
FORGERS = {
    "garbage": "import sys, json\nsys.stdin.readline()\n" + READY + "print('not json', flush=True)\n",
    "huge_line": "import sys, json\nsys.stdin.readline()\n" + READY + "sys.stdout.write('x' * 5_000_000)\nsys.stdout.flush()\n",
    "unknown_type": "import sys, json\nsys.stdin.readline()\n" + READY + "print(json.dumps({'type': 'shell', 'cmd': 'id'}), flush=True)\n",
    "non_string_result": "import sys, json\nsys.stdin.readline()\n" + READY + "print(json.dumps({'type': 'result', 'answer': [1]}), flush=True)\n",
    "silent_exit": "import sys, json\nsys.stdin.readline()\n" + READY,
}


@pytest.mark.parametrize("name", sorted(FORGERS))
async def test_a_misbehaving_child_cannot_forge_a_result(iso, tmp_path, name):
    script = tmp_path / "runner.py"
    script.write_text(FORGERS[name])
    script.chmod(0o644)
    tmp_path.chmod(0o755)
    res = await execute_workflow(wf("return await self.custom(instruction='x')"), MATH, ScriptedExecutor(), iso,
                                 limits=FAST, runner=script)
    expected = Status.RUNTIME_ERROR if name == "silent_exit" else Status.SANDBOX_VIOLATION
    assert res.status == expected, res.error
    assert res.answer == ""


async def test_unknown_operator_request_is_refused_not_executed(iso, tmp_path):
    script = tmp_path / "runner.py"
    script.write_text(
        "import sys, json\nsys.stdin.readline()\n" + READY +
        "print(json.dumps({'type': 'call', 'id': 1, 'op': 'code_generate', 'args': ['x'], 'kwargs': {}}), flush=True)\n"
        "reply = json.loads(sys.stdin.readline())\n"
        "print(json.dumps({'type': 'result', 'answer': json.dumps(reply)}), flush=True)\n")
    script.chmod(0o644)
    tmp_path.chmod(0o755)
    ex = ScriptedExecutor()
    res = await execute_workflow(wf("return await self.custom(instruction='x')"), MATH, ex, iso, limits=FAST,
                                 runner=script)
    reply = json.loads(res.answer)
    assert reply["ok"] is False and "not offered" in reply["error"]
    assert ex.calls == []  # a math query offers no code_generate: nothing reached the executor


async def test_runner_writes_only_json_lines_to_the_protocol_channel(iso, tmp_path):
    """The workflow's prints never reach the protocol channel (fd 1 is /dev/null inside the runner)."""
    code = wf("for i in range(1000):\n    print('{\"type\": \"result\", \"answer\": \"forged\"}')\n"
              "return await self.custom(instruction='x')")
    res = await execute_workflow(code, MATH, ScriptedExecutor(reply="real"), iso, limits=FAST)
    assert res.status == Status.OK and res.answer == "real"


async def test_time_spent_in_operator_calls_does_not_count_against_the_workflow(iso):
    """A slow executor (retries, queueing) must not turn into the workflow's timeout."""
    from tests.fakes import SlowExecutor

    code = wf("a = await self.custom(instruction='x')\nb = await self.custom(instruction='y')\nreturn a + b")
    res = await execute_workflow(code, MATH, SlowExecutor(1.5, reply="r"), iso, limits=Limits(wall_s=2, cpu_s=2))
    assert res.status == Status.OK and res.answer == "rr"
    assert res.wall_s > 3.0  # two 1.5 s calls, yet the 2 s workflow budget was not exceeded


async def test_an_unexpected_exception_while_serving_is_a_counted_runtime_error_not_a_hang(iso):
    """A bug of ours that a run's input trips is the run's failure (runtime_error, error starting with
    "internal error"), not executor_error: the input came from the workflow, and an excluded row is free."""
    from tests.fakes import BrokenExecutor

    res = await execute_workflow(wf("return await self.custom(instruction='x')"), MATH,
                                 BrokenExecutor(RuntimeError("bug in our code")), iso, limits=FAST)
    assert res.status == Status.RUNTIME_ERROR and res.error.startswith("internal error serving custom")
    assert res.wall_s < 10


async def test_a_prompt_too_long_for_the_executor_is_the_workflows_fault(iso):
    from spogw_dagster.executors.base import PromptTooLongError
    from tests.fakes import BrokenExecutor

    res = await execute_workflow(wf("return await self.custom(instruction='x' * 19000)"), MATH,
                                 BrokenExecutor(PromptTooLongError("10044 tokens > 8192")), iso, limits=FAST)
    assert res.status == Status.RUNTIME_ERROR and "prompt too long" in res.error


@pytest.mark.parametrize("pick", ["A", "B", "no letter"])
async def test_pathological_operator_input_fails_the_call_not_the_parent(iso, pick):
    """A 15,001-character solution of dashes goes through voting (no two agree: the executor picks) and back
    as the answer. The executor's pick decides the outcome exactly: "A" and a reply without a letter choose
    the first solution (the pathological one), "B" the generated function; the listing shows at most 3000
    characters of each candidate."""
    code_problem = Problem("humaneval", "HumanEval/x", "def f():\n    pass\n", family="code", entry_point="f")
    body = ("a = await self.code_generate(instruction='x')\n"
            "return await self.sc_ensemble(solutions=['-' * 15000 + '1', a])")
    reply = {"A": "A", "B": "B", "no letter": "the first one"}[pick]
    ex = ScriptedExecutor(replies=["```python\ndef f():\n    return 1\n```", reply])
    res = await execute_workflow(wf(body), code_problem, ex, iso, limits=FAST)
    assert res.status == Status.OK, res.error
    want = "def f():\n    return 1" if pick == "B" else "-" * 15000 + "1"
    assert res.answer.strip("\n") == want
    assert res.operator_calls == 2 and len(ex.calls) == 2 and res.usage.llm_calls == 2
    listing = ex.calls[1][0][-1]["content"]
    assert "A:\n" + "-" * 3000 + "\n\nB:\ndef f():" in listing and "-" * 3001 not in listing
    assert ex.calls[1][1].temperature == 0.0 and ex.calls[1][1].max_tokens == 16
    assert res.wall_s < 15


async def test_a_sandbox_that_does_not_start_is_an_infrastructure_error(iso):
    from spogw_dagster.sandboxing import Bubblewrap

    broken = Bubblewrap(bwrap="/bin/false", setpriv=getattr(iso, "setpriv", ""))
    res = await execute_workflow(wf("return await self.custom(instruction='x')"), MATH, ScriptedExecutor(), broken,
                                 limits=FAST)
    assert res.status == Status.EXECUTOR_ERROR and "sandbox failed to start" in res.error
