"""Code scoring: extraction, test programs, and score_code with an injected runner.

The runner here is a plain local subprocess with a timeout (trusted code only): the real sandbox is
another component; these tests check our logic around it.
"""

from __future__ import annotations

import asyncio

import pytest

from spogw_dagster.benchmarks import (
    PUBLIC_RESULT_PREFIX,
    ScoringInfrastructureError,
    build_public_test_program,
    build_test_program,
    extract_code,
    load_benchmark,
    parse_public_test_results,
    score,
    score_code,
    solution_code,
    write_mbpp_fixture,
)
from spogw_dagster.types import Problem, Status
from tests.fakes import RunResult, local_run


@pytest.fixture(scope="module")
def he():
    return {p.id: p for p in load_benchmark("humaneval")}


@pytest.fixture(scope="module")
def mbpp(tmp_path_factory):
    return load_benchmark("mbpp", write_mbpp_fixture(tmp_path_factory.mktemp("mbpp")))


# ---------------------------------------------------------------- extract_code


def test_extract_from_fence_drops_test_calls():
    text = """Here is my solution:

```python
import math

SCALE = 2
UNUSED = compute_forever()

def area(r):
    return SCALE * math.pi * r * r

print(area(2))
if __name__ == "__main__":
    area(3)
```
It works."""
    assert extract_code(text, "area") == (
        "import math\n\nSCALE = 2\n\ndef area(r):\n    return SCALE * math.pi * r * r\n"
    )


def test_extract_picks_block_defining_entry_point():
    text = "```python\ndef helper_function():\n    return 1\n```\nthen\n```py\ndef target(x):\n    return x\n```\n```\nprint(target(1))\n```"
    assert extract_code(text, "target") == "def target(x):\n    return x\n"
    # without an entry point: the longest block
    assert extract_code(text) == "def helper_function():\n    return 1\n"


def test_extract_raw_text_and_cut_off_output():
    raw = "Sure! Here it is.\ndef f(x):\n    return x + 1\n\ndef g(y):\n    return f("
    assert extract_code(raw, "f") == "def f(x):\n    return x + 1\n"
    # an unclosed fence (the model ran out of tokens)
    assert extract_code("```python\ndef f():\n    return 2\n", "f") == "def f():\n    return 2\n"
    # prose between an import and the function is dropped
    assert extract_code("import math\nHere is the function:\ndef f(x):\n    return math.sqrt(x)\nDone!", "f") == (
        "import math\n\ndef f(x):\n    return math.sqrt(x)\n"
    )
    assert extract_code("I don't know.", "f") == ""
    assert extract_code("", "f") == ""
    # other languages are ignored
    assert extract_code("```bash\nls\n```", "f") == ""


def test_extract_keeps_assignments_used_through_other_assignments():
    code = "BASE = 10\nLIMIT = BASE * 2\nJUNK = 3\n\ndef f(x):\n    return min(x, LIMIT)\n"
    assert extract_code(code, "f") == "BASE = 10\n\nLIMIT = BASE * 2\n\ndef f(x):\n    return min(x, LIMIT)\n"


def test_extract_drops_statements_after_semicolons():
    assert extract_code("import os; os._exit(0)\ndef f():\n    return 'é'  # accent\n", "f") == (
        "import os\n\ndef f():\n    return 'é'  # accent\n"
    )


def test_extract_keeps_classes_and_decorators():
    code = "import functools\n\n@functools.lru_cache(None)\ndef fib(n):\n    return n if n < 2 else fib(n-1) + fib(n-2)\n\nclass A:\n    pass\n"
    assert extract_code(code, "fib") == code


def test_solution_code_accepts_a_bare_completion(he):
    p = he["HumanEval/2"]
    body = p.answer[len(p.question):]  # what a completion model writes: the indented body only
    code = solution_code(p, body)
    assert "def truncate_number" in code and "return number % 1.0" in code


# ---------------------------------------------------------------- programs


def test_build_test_program_humaneval(he):
    p = he["HumanEval/0"]
    prog = build_test_program(p, "def has_close_elements(numbers, threshold):\n    return False\n")
    assert prog.startswith("from typing import List\n")  # prompt preamble first
    assert p.hidden_tests.strip() in prog
    lines = prog.rstrip("\n").splitlines()
    assert lines[-3] == "check(has_close_elements)"
    assert lines[-1].startswith("__import__('sys').stdout.write('SPOGW-HIDDEN-TESTS-PASSED-")


def test_build_test_program_mbpp(mbpp):
    p = mbpp[5]
    prog = build_test_program(p, p.answer)
    assert "import math\nassert math.isclose(point_distance(0, 0, 3, 4), 5.0)" in prog
    assert "check(" not in prog
    with pytest.raises(ValueError, match="no hidden tests"):
        build_test_program(Problem("x", "x/1", "q", family="code"), "pass")


async def test_public_test_program_reports_each_test(he):
    p = he["HumanEval/0"]
    wrong = "def has_close_elements(numbers, threshold):\n    return True\n"
    tests = p.public_tests + ["assert 1/0"]
    res = await local_run(build_public_test_program(p, wrong, tests))
    recs = parse_public_test_results(res.stdout)
    assert res.returncode == 1
    assert [r["passed"] for r in recs] == [False, True, False]  # one failure does not stop the rest
    assert recs[0]["error"].startswith("AssertionError") and recs[2]["error"].startswith("ZeroDivisionError")
    ok = await local_run(build_public_test_program(p, p.answer))
    assert ok.returncode == 0 and all(r["passed"] for r in parse_public_test_results(ok.stdout))


async def test_public_test_program_mbpp_setup(mbpp):
    p = mbpp[5]  # its public test needs `import math` from the setup code
    res = await local_run(build_public_test_program(p, p.answer))
    assert res.returncode == 0, res.stderr
    assert parse_public_test_results(res.stdout)[0]["passed"] is True


def test_parse_public_test_results_ignores_noise():
    out = f"hello\n{PUBLIC_RESULT_PREFIX}{{bad json\n{PUBLIC_RESULT_PREFIX}{{\"index\": 0, \"passed\": true}}\n"
    assert parse_public_test_results(out) == [{"index": 0, "passed": True}]


# ---------------------------------------------------------------- score_code


async def test_all_canonical_solutions_score_one(he, mbpp):
    problems = list(he.values()) + mbpp
    sem = asyncio.Semaphore(4)

    async def one(p):
        async with sem:
            return p.id, await score_code(p, p.answer, local_run)

    results = await asyncio.gather(*(one(p) for p in problems))
    failed = [(pid, d.detail) for pid, d in results if d.score != 1.0]
    assert failed == []


async def test_wrong_and_broken_answers_score_zero(he, mbpp):
    p = he["HumanEval/2"]
    d = await score_code(p, "```python\ndef truncate_number(number):\n    return 0.0\n```", local_run)
    assert d.score == 0.0 and d.detail.startswith("failed: runtime_error") and "AssertionError" in d.detail
    d = await score_code(p, "def truncate_number(number):\n    return number +", local_run)
    assert d.score == 0.0  # unparsable tail dropped -> nothing defines the entry point
    d = await score_code(p, "no code at all", local_run)
    assert (d.score, d.detail) == (0.0, "no code found in the answer")
    d = await score_code(p, "def other(x):\n    return x\n", local_run)
    assert d.score == 0.0 and "does not define truncate_number" in d.detail
    d = await score_code(mbpp[0], "def count_vowels(s):\n    return 2\n", local_run)
    assert d.score == 0.0


async def test_timeout_scores_zero(he):
    async def slow_runner(program):
        return await local_run(program, timeout=1.0)

    d = await score_code(he["HumanEval/2"], "def truncate_number(number):\n    while True:\n        pass\n", slow_runner)
    assert d.score == 0.0 and d.detail.startswith("failed: timeout")


async def test_exit_before_tests_does_not_pass(he):
    """A solution that exits 0 while being defined never reaches the tests: not a pass."""
    sneaky = "def truncate_number(number, _=__import__('os')._exit(0)):\n    return 0\n"
    d = await score_code(he["HumanEval/2"], sneaky, local_run)
    assert d.score == 0.0 and "exited before the tests finished" in d.detail


async def test_runner_failure_propagates(he):
    async def broken_runner(program):
        raise RuntimeError("sandbox unavailable")

    with pytest.raises(RuntimeError, match="sandbox unavailable"):
        await score_code(he["HumanEval/2"], he["HumanEval/2"].answer, broken_runner)

    async def executor_error(program):
        return RunResult(Status.EXECUTOR_ERROR, None, "", "boom")

    with pytest.raises(ScoringInfrastructureError, match="executor_error"):
        await score_code(he["HumanEval/2"], he["HumanEval/2"].answer, executor_error)

    async def odd_status(program):
        return RunResult("exploded", 0, "", "")  # type: ignore[arg-type]

    with pytest.raises(ScoringInfrastructureError, match="unknown status"):
        await score_code(he["HumanEval/2"], he["HumanEval/2"].answer, odd_status)


async def test_status_given_as_string_value(he):
    async def runner(program):
        r = await local_run(program)
        return RunResult(r.status.value, r.returncode, r.stdout, r.stderr)  # type: ignore[arg-type]

    assert (await score_code(he["HumanEval/2"], he["HumanEval/2"].answer, runner)).score == 1.0


async def test_dispatcher_runs_code(mbpp):
    p = mbpp[3]
    d = await score(p, f"Here you go:\n```python\n{p.answer}\n```", run_code=local_run)
    assert d.score == 1.0 and d.detail == "passed"


# ---------------------------------------------------------------- results must be plain data

_ALWAYS_EQUAL = """
class _Anything:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = object.__hash__
"""


@pytest.mark.parametrize(
    "body",
    [
        "return _Anything()",
        "return [_Anything()]",  # hidden inside a container
        "return {'k': (1, _Anything())}",
        "return _Int(0)",  # a subclass of a builtin type
    ],
    ids=["object", "in-list", "in-dict-tuple", "int-subclass"],
)
async def test_always_equal_results_do_not_pass_humaneval(he, body):
    sol = (_ALWAYS_EQUAL + "\nclass _Int(int):\n    def __eq__(self, other):\n        return True\n"
           "    __hash__ = int.__hash__\n\n"
           f"def has_close_elements(numbers, threshold):\n    {body}\n")
    d = await score_code(he["HumanEval/0"], sol, local_run)
    assert d.score == 0.0 and "TypeError" in d.detail and "has_close_elements returned" in d.detail, d.detail


async def test_always_equal_results_do_not_pass_mbpp(mbpp):
    for p in mbpp:
        sol = _ALWAYS_EQUAL + f"\ndef {p.entry_point}(*args, **kwargs):\n    return _Anything()\n"
        d = await score_code(p, sol, local_run)
        assert d.score == 0.0 and "TypeError" in d.detail, (p.id, d.detail)


async def test_rebinding_the_entry_point_during_a_call_does_not_escape_the_check(he):
    sol = _ALWAYS_EQUAL + (
        "\ndef has_close_elements(numbers, threshold):\n"
        "    globals()['has_close_elements'] = lambda *a: _Anything()\n"
        "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n"
    )
    # asserts that call the entry point by name must meet the wrapper again after each call
    p = Problem(benchmark="humaneval", id="x/rebind", question="", family="code",
                entry_point=he["HumanEval/0"].entry_point,
                hidden_tests="assert has_close_elements([1.0, 1.05], 0.1) == True\n"
                             "assert has_close_elements([1.0, 3.0], 0.1) == False\n")
    d = await score_code(p, sol, local_run)
    assert d.score == 1.0, d.detail  # the lambda the solution installed is replaced by the wrapper again
    cheat = _ALWAYS_EQUAL + ("\ndef has_close_elements(numbers, threshold):\n"
                             "    globals()['has_close_elements'] = lambda *a: _Anything()\n"
                             "    return True\n")
    assert (await score_code(p, cheat, local_run)).score == 0.0  # second assert meets the wrapper, fails


async def test_plain_results_of_every_kind_pass_and_recursion_is_not_doubled():
    sol = (
        "def f(n):\n"
        "    if n == 0:\n"
        "        return [None, True, 1, 1.5, 2j, 's', b'b', (1,), {'k': {1, 2}}, frozenset({3})]\n"
        "    return f(n - 1)\n"
    )
    expected = "[None, True, 1, 1.5, 2j, 's', b'b', (1,), {'k': {1, 2}}, frozenset({3})]"
    # depth 900 is within the default recursion limit (1000) only if the wrapper is not in every frame
    p = Problem(benchmark="mbpp", id="x/plain", question="", family="code", entry_point="f",
                hidden_tests=f"assert f(900) == {expected}\nassert f.__name__ == 'f'\n")
    d = await score_code(p, sol, local_run)
    assert d.score == 1.0, d.detail
    cyclic = "def f(n):\n    a = [1]\n    a.append(a)\n    return a\n"
    p2 = Problem(benchmark="mbpp", id="x/cyclic", question="", family="code", entry_point="f",
                 hidden_tests="r = f(0)\nassert r[1] is r\n")
    assert (await score_code(p2, cyclic, local_run)).score == 1.0
