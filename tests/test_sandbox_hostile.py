"""Hostile workflows and hostile generated code: each ends with a non-ok status (or, where the code is
harmless-looking, is contained), leaves no side effect, and the parent goes on scoring the next one.

Two walls are tested separately:
  1. the normal path (AST validator, then the sandbox): every hostile workflow is stopped with a
     non-ok status and score 0;
  2. the sandbox alone (validator bypassed, and raw programs as the `programmer`/`test` operators and the
     hidden-test scorer run them): even code that escapes the restricted builtins through
     `__subclasses__` reaches no network, no secret, no writable path outside its tmpfs, and no process
     outside its namespace. (Such code can also write its own "result" line on the protocol channel; that
     buys it nothing a `return` would not: the answer is scored in the parent against gold it never saw.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid

import pytest

from spogw_dagster.evaluation import evaluate_workflow
from spogw_dagster.sandboxing import Limits, detect_isolation, run_code
from spogw_dagster.contracts import Problem, Status
from spogw_dagster.workflow.runtime import execute_workflow
from tests.fakes import ScriptedExecutor, connection_recorder

SECRET = "sk-test-" + uuid.uuid4().hex
CANARY = f"/tmp/spogw-canary-{uuid.uuid4().hex}"
REPO_CANARY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), f"pwned-{uuid.uuid4().hex}")
LIMITS = Limits(wall_s=8, cpu_s=3, memory_mb=512, nproc=16)
MATH = Problem("gsm8k", "q1", "What is 6 times 7?", answer="42", family="math")

# Reaches the real __import__ from inside the restricted runner (only possible with the validator off).
ESCAPE = ("[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == '_wrap_close'][0]"
          ".__init__.__globals__['__builtins__']['__import__']")


@pytest.fixture(scope="module", params=["bwrap", "docker"])
def iso(request):
    """Every suite runs under each OS sandbox; docker on the engine of the docker_engine fixture (conftest)."""
    if request.param == "docker":
        request.getfixturevalue("docker_engine")
    return detect_isolation(request.param)


@pytest.fixture(autouse=True)
def secret_in_parent_env(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("SPOGW_TEST_SECRET", SECRET)


@pytest.fixture(scope="module")
def listener():
    """A TCP server on 127.0.0.1 that records any connection: the sandbox must never reach it."""
    with connection_recorder() as recorder:
        yield recorder


def wf(body: str) -> str:
    return "class Workflow:\n    async def run(self):\n" + "".join(
        "        " + line + "\n" for line in body.strip("\n").splitlines())


def no_side_effects():
    assert not os.path.exists(CANARY)
    assert not os.path.exists(REPO_CANARY)
    assert not os.path.exists("/root/pwned")


SPAWNED_UIDS: set[int] = set()
SPAWNED_CONTAINERS: set[str] = set()


@pytest.fixture(autouse=True)
def record_sandbox_uids(monkeypatch):
    """Remember the uid of every sandbox this test starts (other processes on the machine may run sandboxes too)."""
    import spogw_dagster.sandboxing.process as process
    import spogw_dagster.workflow.runtime as runtime

    real = process.spawn

    async def spawn(*a, **kw):
        sp = await real(*a, **kw)
        if sp.uid is not None:
            SPAWNED_UIDS.add(sp.uid)
        if sp.container is not None:
            SPAWNED_CONTAINERS.add(sp.container)
        return sp

    monkeypatch.setattr(process, "spawn", spawn)
    monkeypatch.setattr(runtime, "spawn", spawn)


def sandbox_processes() -> list[str]:
    """Processes still running under a uid of a sandbox that this test module started."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status") as f:
                uid = int(next(line for line in f if line.startswith("Uid:")).split()[1])
        except (OSError, StopIteration, ValueError):
            continue
        if uid in SPAWNED_UIDS:
            found.append(pid)
    return found


def sandbox_containers() -> list[str]:
    """Containers (docker sandbox) that this test module started and that still exist, running or not."""
    if not SPAWNED_CONTAINERS:
        return []
    from spogw_dagster.sandboxing.backend_docker import leftover_containers

    return [name for name in leftover_containers() if name in SPAWNED_CONTAINERS]


def no_sandbox_processes_left(timeout: float = 10.0) -> bool:
    """The PID namespace is torn down, and a --rm container removed, asynchronously after its init dies;
    give it a moment."""
    deadline = time.monotonic() + timeout
    while sandbox_processes() or sandbox_containers():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def hostile_workflows(port: int) -> dict[str, str]:
    """Written as a model might write them, for the normal path (validator on)."""
    return {
        "network": f"import socket\ns = socket.create_connection(('127.0.0.1', {port}))\nreturn 'x'",
        "env_secret": "import os\nreturn os.environ['OPENAI_API_KEY']",
        "write_outside": f"f = open('{CANARY}', 'w')\nreturn await self.custom(instruction='x')",
        "fork_bomb": "import os\nwhile True:\n    os.fork()\nreturn 'x'",
        "memory_bomb": "x = 'a' * (10 ** 10)\nreturn await self.custom(instruction=x)",
        "infinite_loop": "while True:\n    pass\nreturn await self.custom(instruction='x')",
        "import_os": "import os\nos.system('id')\nreturn await self.custom(instruction='x')",
        "import_subprocess": "import subprocess\nreturn subprocess.check_output(['id'])",
        "import_ctypes": "import ctypes\nctypes.CDLL(None).kill(1, 9)\nreturn 'x'",
        "signal_parent": "import signal\nimport os\nos.kill(os.getppid(), signal.SIGKILL)\nreturn 'x'",
        "flood_stdout": "while True:\n    print('x' * 100000)\nreturn await self.custom(instruction='x')",
        "subclasses_escape": "s = ().__class__.__base__.__subclasses__()\nreturn await self.custom(instruction=str(s))",
        "builtins_escape": "b = __builtins__\nreturn await self.custom(instruction=str(b))",
        "import_via_dunder": "m = __import__('os')\nreturn await self.custom(instruction='x')",
        "format_escape": "s = '{0.__class__}'.format(1)\nreturn await self.custom(instruction=s)",
        "frame_walk": "c = self.custom(instruction='x')\ng = c.cr_frame.f_globals\nreturn await c",
    }


async def test_every_hostile_workflow_fails_with_score_zero_and_the_next_one_still_scores(iso, listener):
    port, hits = listener
    statuses = {}
    for name, body in hostile_workflows(port).items():
        res = await evaluate_workflow(wf(body), MATH, ScriptedExecutor(), iso, limits=LIMITS)
        statuses[name] = res.status
        assert res.status != Status.OK, f"{name} was not stopped"
        assert res.score == 0.0, name
        assert SECRET not in res.answer + res.error, name
        no_side_effects()
    assert hits == []
    # the ones that pass the validator are stopped by the sandbox's limits
    assert statuses["memory_bomb"] == Status.RUNTIME_ERROR
    assert statuses["infinite_loop"] == Status.TIMEOUT
    assert statuses["flood_stdout"] == Status.TIMEOUT
    assert all(statuses[n] == Status.INVALID for n in statuses if n not in {"memory_bomb", "infinite_loop", "flood_stdout"})
    # the parent is alive and goes on scoring a benign workflow
    ok = await evaluate_workflow(wf("return await self.custom(instruction='Solve.')"), MATH, ScriptedExecutor(), iso,
                                 limits=LIMITS)
    assert ok.status == Status.OK and ok.score == 1.0
    assert no_sandbox_processes_left()  # nothing left running


def escaped_workflows(port: int) -> dict[str, str]:
    """The validator is bypassed and the code breaks out of the restricted builtins: the OS sandbox must hold."""
    imp = f"imp = {ESCAPE}\nopen = imp('builtins').open"
    return {
        "network": f"{imp}\ns = imp('socket').create_connection(('127.0.0.1', {port}), timeout=2)\nreturn 'connected'",
        "env_secret": f"{imp}\nreturn str(dict(imp('os').environ))",
        "proc_environ": f"{imp}\nos = imp('os')\nreturn ' '.join(open('/proc/%s/environ' % p, 'rb').read().decode(errors='replace') for p in os.listdir('/proc') if p.isdigit())",
        "write_outside": f"{imp}\nopen('{CANARY}', 'w').write('x')\nreturn 'written'",
        "write_repo": f"open('{REPO_CANARY}', 'w')\nreturn 'written'",
        "write_root": f"{imp}\nopen('/root/pwned', 'w')\nreturn 'written'",
        "fork_bomb": f"{imp}\nos = imp('os')\nwhile True:\n    os.fork()\nreturn 'x'",
        "subprocess": f"{imp}\nreturn imp('subprocess').check_output(['/usr/bin/id']).decode()",
        "kill_all": f"{imp}\nos = imp('os')\nos.kill(-1, 9)\nreturn 'killed'",
        "kill_parent": f"{imp}\nos = imp('os')\nos.kill(os.getppid(), 9)\nreturn 'killed'",
        "ctypes": f"{imp}\nlibc = imp('ctypes').CDLL(None)\nlibc.kill(1, 9)\nreturn 'x'",
    }


async def test_escaped_code_is_contained_by_the_sandbox(iso, listener):
    port, hits = listener
    results = {}
    for name, body in escaped_workflows(port).items():
        res = await execute_workflow(wf(body), MATH, ScriptedExecutor(), iso, limits=LIMITS, validate_code=False)
        results[name] = res
        assert SECRET not in res.answer + res.error, name
        no_side_effects()
    assert hits == [], "the sandbox reached a listener on the host's loopback"
    # the runner's audit-hook tripwire catches each attempt and reports it, even when the code swallows
    # the error; reading os.environ is allowed but it holds nothing of the parent's
    for name, res in results.items():
        if name == "env_secret":
            assert res.status == Status.OK and "OPENAI_API_KEY" not in res.answer
        elif name == "write_repo":  # plain open() is not among the runner's builtins at all
            assert res.status == Status.RUNTIME_ERROR and "NameError" in res.error, res.error
        else:
            assert res.status == Status.SANDBOX_VIOLATION, (name, res.status, res.error)
    assert "sandbox: import" in results["network"].error  # socket is not even importable
    ok = await execute_workflow(wf("return await self.custom(instruction='x')"), MATH, ScriptedExecutor(reply="fine"),
                                iso, limits=LIMITS)
    assert ok.status == Status.OK and ok.answer == "fine"
    assert no_sandbox_processes_left()


HOSTILE_PROGRAMS = {
    "network": "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')",
    "env": "import os\nprint(dict(os.environ))",
    "write_outside": f"open('{CANARY}', 'w').write('x')",
    "fork_bomb": "import os\nwhile True:\n    os.fork()",
    "memory_bomb": "x = bytearray(10 ** 10)",
    "infinite_loop": "while True:\n    pass",
    "sleep_forever": "import time\ntime.sleep(3600)",
    "flood_stdout": "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)",
    "kill_parent": "import os\nos.kill(os.getppid(), 9)\nos.kill(-1, 9)",
    "big_file": "open('/tmp/big', 'wb').write(b'x' * (200 * 1024 * 1024))",
}


@pytest.mark.parametrize("name", sorted(HOSTILE_PROGRAMS))
async def test_hostile_generated_programs_in_run_code(iso, listener, name):
    """What the `programmer`/`test` operators and the hidden-test scorer run: full Python, same limits."""
    port, hits = listener
    res = await run_code(HOSTILE_PROGRAMS[name].format(port=port), iso, LIMITS)
    assert SECRET not in res.stdout + res.stderr
    assert "connected" not in res.stdout
    assert hits == []
    no_side_effects()
    expected = {
        "network": Status.RUNTIME_ERROR,
        "memory_bomb": Status.RUNTIME_ERROR,
        "infinite_loop": Status.TIMEOUT,
        "sleep_forever": Status.TIMEOUT,
        "flood_stdout": Status.RUNTIME_ERROR,
        "big_file": Status.RUNTIME_ERROR,
        "write_outside": Status.OK,  # lands in the private tmpfs, which is thrown away
    }
    if name in expected:
        assert res.status == expected[name], (name, res.status, res.error)
    if name == "fork_bomb":
        assert res.status in (Status.RUNTIME_ERROR, Status.TIMEOUT)
    # no process of the run survives it
    assert no_sandbox_processes_left()
    # the parent process is alive and can run the next program
    nxt = await run_code("print(6 * 7)", iso, LIMITS)
    assert nxt.status == Status.OK and nxt.stdout.strip() == "42"


def test_isolation_none_requires_explicit_opt_in():
    from spogw_dagster.sandboxing import SandboxUnavailableError

    with pytest.raises(SandboxUnavailableError, match="--unsafe-no-sandbox"):
        detect_isolation("none")
    assert detect_isolation("none", allow_unsandboxed=True).name == "none"


def test_docker_isolation_refuses_clearly_without_an_engine():
    from spogw_dagster.sandboxing import SandboxUnavailableError

    if shutil.which("docker") and subprocess.run(["docker", "info"], capture_output=True).returncode == 0:
        pytest.skip("a Docker engine is reachable here")
    with pytest.raises(SandboxUnavailableError, match="docker"):
        detect_isolation("docker")
