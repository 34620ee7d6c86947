"""Code scoring: extraction, the plain-data codec, test jobs, and verdicts from the real two-process sandbox.

Expected values are worked out by hand from the problem texts; every verdict runs in the real sandbox
(`detect_isolation()`): the solution in one process, the tests in another.
"""

from __future__ import annotations

import math

import pytest

from spogw_dagster.benchmarks import (
    CodeSandbox,
    TestJob,
    extract_code,
    hidden_test_job,
    judge,
    load_benchmark,
    public_test_job,
    run_public_tests,
    score,
    score_code,
    solution_code,
    write_mbpp_fixture,
)
from spogw_dagster.benchmarks.verdict import plaindata
from spogw_dagster.sandboxing import Bubblewrap, Limits, SandboxStartError, detect_isolation
from spogw_dagster.contracts import Problem

LIMITS = Limits(wall_s=20, cpu_s=10, memory_mb=1024, nproc=8, max_output_bytes=100_000)


@pytest.fixture(scope="module")
def he():
    return {p.id: p for p in load_benchmark("humaneval")}


@pytest.fixture(scope="module")
def mbpp(tmp_path_factory):
    return load_benchmark("mbpp", write_mbpp_fixture(tmp_path_factory.mktemp("mbpp")))


@pytest.fixture(scope="module")
def sandbox():
    return CodeSandbox(detect_isolation(), LIMITS, call_timeout_s=3.0)


def _problem(tests: str, entry: str = "f", pid: str = "x/1") -> Problem:
    return Problem(benchmark="mbpp", id=pid, question="", family="code", entry_point=entry, hidden_tests=tests,
                   meta={"test_style": "asserts"})


# ---------------------------------------------------------------- extract_code


def test_extract_keeps_top_level_statements_a_solution_relies_on():
    code = (
        "try:\n    from math import gcd\nexcept ImportError:\n    def gcd(a, b):\n        return a\n\n"
        "TABLE = {}\nfor i in range(3):\n    TABLE[i] = i * i\n\n"
        "SEEN = set()\nSEEN.update([1, 2])\n\n"
        "f = lambda x: TABLE[x] + len(SEEN) + gcd(4, 6)\n"
    )
    assert extract_code(f"Here:\n```python\n{code}```\nDone.", "f") == code


def test_extract_keeps_stray_calls_and_main_blocks_but_drops_prose_words():
    text = ("```python\nimport math\n\ndef area(r):\n    return math.pi * r * r\n\nExplanation\n"
            "print(area(2))\nif __name__ == \"__main__\":\n    area(3)\n```")
    # the bare word goes; the example call and the __main__ block stay (the harness would run the call,
    # and never the __main__ block: the solution's module is not __main__)
    assert extract_code(text, "area") == (
        "import math\n\ndef area(r):\n    return math.pi * r * r\n\n\nprint(area(2))\n"
        "if __name__ == \"__main__\":\n    area(3)\n"
    )


def test_extract_picks_block_defining_entry_point():
    text = ("```python\ndef helper_function():\n    return 1\n```\nthen\n```py\ndef target(x):\n    return x\n```\n"
            "```\nprint(target(1))\n```")
    assert extract_code(text, "target") == "def target(x):\n    return x\n"
    assert extract_code(text) == "def helper_function():\n    return 1\n"  # no entry point: the longest
    assert extract_code("```python\ntarget = lambda x: x\n```\n```python\nprint(1)\n```", "target") == "target = lambda x: x\n"


def test_extract_raw_text_and_cut_off_output():
    raw = "Sure! Here it is.\ndef f(x):\n    return x + 1\n\ndef g(y):\n    return f("
    assert extract_code(raw, "f") == "def f(x):\n    return x + 1\n"
    assert extract_code("```python\ndef f():\n    return 2\n", "f") == "def f():\n    return 2\n"  # unclosed fence
    assert extract_code("import math\nHere is the function:\ndef f(x):\n    return math.sqrt(x)\nDone!", "f") == (
        "import math\n\ndef f(x):\n    return math.sqrt(x)\n"
    )
    assert extract_code("I don't know.", "f") == ""
    assert extract_code("", "f") == ""
    assert extract_code("```bash\nls\n```", "f") == ""


def test_solution_code_accepts_a_bare_completion(he):
    p = he["HumanEval/2"]
    body = p.answer[len(p.question):]  # what a completion model writes: the indented body only
    code = solution_code(p, body)
    assert "def truncate_number" in code and "return number % 1.0" in code


# ---------------------------------------------------------------- plain data


@pytest.mark.parametrize("value", [
    None, True, False, 0, -1, 2**200, -(2**70), 1.5, -0.0, math.inf, -math.inf, 1 + 2j, "", "é\ud800", b"\x00\xff",
    [1, [2.0, (3,)]], (1, 2), {"a": {1, 2}, 3: frozenset({"x"}), (1, "t"): None}, set(), frozenset(), {},
])
def test_plain_data_round_trips_by_exact_type(value):
    back = plaindata.decode(plaindata.encode(value))
    assert back == value and type(back) is type(value)
    assert repr(back) == repr(value)  # -0.0 stays -0.0, inner tuples stay tuples


def test_plain_data_keeps_the_distinctions_equality_would_blur():
    assert plaindata.decode(plaindata.encode((1, 2))) != [1, 2]
    assert type(plaindata.decode(plaindata.encode(True))) is bool and type(plaindata.decode(plaindata.encode(1))) is int
    nan = plaindata.decode(plaindata.encode(float("nan")))
    assert math.isnan(nan) and nan != nan
    assert plaindata.decode(plaindata.encode(0.1 + 0.2)) == 0.30000000000000004
    assert plaindata.decode(plaindata.encode(10**5000)) == 10**5000  # hex: no decimal digit limit


class _Int(int):
    def __eq__(self, other):
        return True

    __hash__ = int.__hash__


class _Anything:
    def __eq__(self, other):
        return True


@pytest.mark.parametrize("value", [_Int(1), _Anything(), [_Anything()], {"k": (1, _Anything())}, (x for x in []),
                                   print, type("S", (str,), {})("s")])
def test_plain_data_refuses_anything_else(value):
    with pytest.raises(plaindata.NotPlainData, match="not plain data"):
        plaindata.encode(value)


def test_plain_data_refuses_cycles_and_malformed_nodes():
    a = [1]
    a.append(a)
    with pytest.raises(plaindata.NotPlainData, match="nested deeper"):
        plaindata.encode(a)
    for bad in [["B", 1], ["I", "0x10"], ["I", "1g"], ["F", 1.5], ["S", 3], ["E", [["L", []]]],
                ["D", [[["L", []], ["N"]]]], ["Q"], [], "N", ["L", "abc"], ["C", "0x1p0"]]:
        with pytest.raises(plaindata.NotPlainData):
            plaindata.decode(bad)


def test_the_hosts_wire_is_json():
    import json

    msg = {"type": "reply", "id": 3, "ok": True, "value": plaindata.encode(["é\ud800\n\"", (1.5, None)]),
           "after": [[0, ["L", []]], ["k", ["N"]]], "flag": False}
    text = plaindata.dumps(msg)
    assert "\n" not in text and text.isascii()  # one line, whatever the strings hold
    assert json.loads(text) == msg == plaindata.loads(text.encode() + b"\n")
    with pytest.raises(ValueError):
        plaindata.loads(b'{"type": "reply"')
    with pytest.raises(ValueError, match="trailing"):
        plaindata.loads(b'{"a": 1} {"b": 2}')
    with pytest.raises(TypeError, match="cannot send"):
        plaindata.dumps({"x": object()})


# ---------------------------------------------------------------- test jobs


def test_hidden_test_job_humaneval(he):
    p = he["HumanEval/0"]
    job = hidden_test_job(p, "def has_close_elements(numbers, threshold):\n    return False\n")
    assert job.setup.startswith("from typing import List\n") and "def check(candidate):" in job.setup
    assert job.tests == ("check(has_close_elements)",)
    assert job.names == ("has_close_elements",) and job.stop_at_first_failure


def test_hidden_test_job_mbpp_and_names(mbpp):
    p = mbpp[5]
    job = hidden_test_job(p, p.answer)
    assert job.tests == (p.hidden_tests.strip() + "\n",) and job.names == ("point_distance",)
    # a second solution function the tests call is proxied too; a builtin the solution shadows never is
    q = _problem("assert f(1) == helper(1)\nassert abs(f(-1)) == 1\n")
    assert hidden_test_job(q, "def f(x):\n    return x\ndef helper(x):\n    return x\ndef abs(x):\n    return 1\n").names == ("f", "helper")
    with pytest.raises(ValueError, match="no hidden tests"):
        hidden_test_job(Problem("x", "x/1", "q", family="code"))


def test_public_test_job_runs_each_test(mbpp):
    job = public_test_job(mbpp[5])
    assert job.setup == "import math\n" and job.tests == tuple(mbpp[5].public_tests)
    assert not job.stop_at_first_failure


# ---------------------------------------------------------------- verdicts in the sandbox


async def test_canonical_and_wrong_answers(he, mbpp, sandbox):
    p = he["HumanEval/2"]
    assert (await score_code(p, p.answer, sandbox)).detail == "passed"
    d = await score_code(p, "```python\ndef truncate_number(number):\n    return 0.0\n```", sandbox)
    assert d.score == 0.0 and d.detail.startswith("failed: AssertionError") and "<test setup>" in d.detail
    d = await score_code(p, "def truncate_number(number):\n    return number +", sandbox)
    assert (d.score, d.detail) == (0.0, "no code found in the answer")  # the cut-off def is all there was
    assert (await score_code(p, "no code at all", sandbox)).detail == "no code found in the answer"
    d = await score_code(p, "def other(x):\n    return x\n", sandbox)
    assert (d.score, d.detail) == (0.0, "the answer does not define truncate_number")
    assert (await score_code(mbpp[3], mbpp[3].answer, sandbox)).score == 1.0
    assert (await score_code(mbpp[0], "def count_vowels(s):\n    return 2\n", sandbox)).score == 0.0


async def test_dispatcher_needs_a_sandbox_and_uses_it(mbpp, sandbox):
    p = mbpp[3]
    d = await score(p, f"Here you go:\n```python\n{p.answer}\n```", sandbox=sandbox)
    assert (d.score, d.detail) == (1.0, "passed")
    with pytest.raises(ValueError, match="needs a sandbox"):
        await score(p, p.answer)


@pytest.mark.parametrize("body, reason", [
    ("return (1, 2)", "AssertionError"),  # a tuple never equals the list the test expects
    ("return [1.0, 2.0000000001]", "AssertionError"),  # floats compared exactly
    ("return _Int(0)", "unserialisable result: f returned a __solution__._Int is not plain data"),
    ("return [_Anything()]", "unserialisable result: f returned a __solution__._Anything is not plain data"),
    ("return (v for v in [1, 2])", "unserialisable result: f returned a generator is not plain data"),
    ("return 'x' * 200_000", "output limit exceeded"),
    ("print('y' * 200_000)\n    return [1, 2]", "output limit exceeded"),
    ("while True:\n        pass", "timeout: call 1 of f took longer than 3.0s"),
    ("__import__('os')._exit(0)", "the solution's process ended during call 1 of f (exit code 0)"),
    ("raise SystemExit(0)", "SolutionError: SystemExit: 0"),
    ("raise StopIteration", "SolutionError: StopIteration"),
])
async def test_what_fails_and_why(sandbox, body, reason):
    sol = ("class _Int(int):\n    def __eq__(self, o):\n        return True\n    __hash__ = int.__hash__\n"
           "class _Anything:\n    def __eq__(self, o):\n        return True\n"
           f"def f(x):\n    {body}\n")
    d = await score_code(_problem("assert f(0) == [1, 2]\n"), sol, sandbox)
    assert d.score == 0.0 and d.detail.startswith("failed: ") and reason in d.detail, d.detail


async def test_exceptions_cross_with_their_type_and_arguments_changed_in_place(sandbox):
    sol = ("def f(x, out=None):\n    if x < 0:\n        raise ValueError('negative')\n"
           "    if out is not None:\n        out.append(x)\n        out.sort()\n    return x\n")
    tests = ("try:\n    f(-1)\nexcept ValueError as e:\n    assert str(e) == 'negative'\nelse:\n    raise AssertionError\n"
             "acc = [5]\nassert f(3, acc) == 3 and acc == [3, 5]\nassert f(2, out=acc) == 2 and acc == [2, 3, 5]\n")
    assert (await score_code(_problem(tests), sol, sandbox)).detail == "passed"


async def test_module_runs_like_the_official_harness(sandbox):
    tests = "assert f(2) == 4\n"
    # a stray example call runs; a __main__ block does not; reading stdin raises (as in swallow_io)
    ok = "def f(x):\n    return x * x\nprint(f(3))\nif __name__ == '__main__':\n    raise SystemExit(1)\n"
    assert (await score_code(_problem(tests), ok, sandbox)).detail == "passed"
    d = await score_code(_problem(tests), "def f(x):\n    return x * x\nn = int(input())\n", sandbox)
    assert d.detail == "failed: the solution failed while loading: OSError: stdin is not available to the solution"
    d = await score_code(_problem(tests), "def f(x):\n    return x * x\nf()\n", sandbox)
    assert d.detail.startswith("failed: the solution failed while loading: TypeError")
    d = await score_code(_problem(tests), "import os\nos._exit(0)\ndef f(x):\n    return x * x\n", sandbox)
    assert d.detail.startswith("failed: the solution's process ended while loading (exit code 0")
    d = await score_code(_problem(tests), "def f(x):\n    return x * x\nwhile True:\n    pass\n", sandbox)
    assert d.detail == "failed: timeout: loading the solution took longer than 3.0s"


async def test_top_level_statements_run_when_the_solution_loads(sandbox):
    code = (
        "try:\n    from math import gcd\nexcept ImportError:\n    def gcd(a, b):\n        return a\n\n"
        "TABLE = {}\nfor i in range(3):\n    TABLE[i] = i * i\n\nSEEN = set()\nSEEN.update([1, 2])\n\n"
        "f = lambda x: TABLE[x] + len(SEEN) + gcd(4, 6)\n"
    )
    # f(2) = TABLE[2] + len(SEEN) + gcd(4, 6) = 4 + 2 + 2
    d = await score_code(_problem("assert f(2) == 8\nassert f(0) == 4\n"), f"```python\n{code}```", sandbox)
    assert d.detail == "passed"


async def test_arguments_that_are_not_plain_data_fail_the_test(sandbox):
    d = await score_code(_problem("assert f(len) == 1\n"), "def f(g):\n    return 1\n", sandbox)
    assert d.score == 0.0 and "argument 1 of f: a builtin_function_or_method is not plain data" in d.detail


async def test_public_tests_report_each_test(he, sandbox):
    p = he["HumanEval/0"]
    wrong = "def has_close_elements(numbers, threshold):\n    return True\n"
    v = await run_public_tests(p, wrong, sandbox, tests=p.public_tests + ["assert 1/0"])
    assert not v.passed and [r["passed"] for r in v.records] == [False, True, False]  # one failure does not stop the rest
    assert v.records[0]["error"].startswith("AssertionError") and v.records[2]["error"].startswith("ZeroDivisionError")
    ok = await run_public_tests(p, solution_code(p, p.answer), sandbox)
    assert ok.passed and ok.calls == 2 and len(ok.records) == 2
    exits = await run_public_tests(p, "import os\ndef has_close_elements(n, t):\n    os._exit(0)\n", sandbox)
    assert not exits.passed and "ended during call 1" in exits.detail  # exiting 0 is not passing
    none = await run_public_tests(p, "", sandbox)
    assert not none.passed and none.records[0]["error"] == "no code found in the answer"


async def test_a_sandbox_that_does_not_start_raises_not_scores(he):
    broken = CodeSandbox(Bubblewrap(bwrap="/bin/false"), LIMITS)
    with pytest.raises(SandboxStartError, match="did not start"):
        await score_code(he["HumanEval/2"], he["HumanEval/2"].answer, broken)


async def test_judge_counts_calls_and_reports_test_records(sandbox):
    job = TestJob("", ("assert f(1) == 2", "assert f(2) == 3"), ("f",), stop_at_first_failure=True)
    v = await judge("def f(x):\n    return x + 1\n", job, sandbox)
    assert (v.passed, v.detail, v.calls, len(v.records)) == (True, "passed", 2, 2)
    v = await judge("def f(x):\n    return 2\n", job, sandbox)
    assert (v.passed, v.calls, [r["passed"] for r in v.records]) == (False, 2, [True, False])
    assert v.detail == "failed: AssertionError (line 1 of <test 1>)"


async def test_programmer_operator_runs_the_whole_program():
    """The `programmer` operator runs what the model wrote, top-level prints and __main__ block included
    (extraction no longer keeps only definitions)."""
    from spogw_dagster.workflow.operators import OperatorConfig, Operators
    from tests.fakes import ScriptedExecutor

    reply = ("```python\ndef answer():\n    return 6 * 7\n\nprint('partial', answer() - 2)\n"
             "if __name__ == '__main__':\n    print(answer())\n```")
    ops = Operators(Problem("gsm8k", "q", "What is 6 times 7?", answer="42", family="math"),
                    ScriptedExecutor(reply=reply), detect_isolation(), OperatorConfig(), 0, ("programmer",))
    out = await ops.call("programmer", [], {"analysis": "multiply"})
    assert out.endswith("Output: partial 40\n42")
