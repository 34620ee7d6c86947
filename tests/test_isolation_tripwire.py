"""The runner's audit-hook tripwire (sandbox/runner.py), the second wall behind the OS sandbox: a workflow that
got past the validator and out of the restricted builtins still cannot start a process, by any of Python's
routes, without the run ending as sandbox_violation (score 0).

The `programmer` and `test` operators are unaffected: their code runs in its own sandbox that the parent
starts; the runner only forwards the call."""

import pytest

from spogw_dagster.sandboxing import Limits, detect_isolation
from spogw_dagster.contracts import Problem, Status
from spogw_dagster.workflow.runtime import execute_workflow
from tests.fakes import ScriptedExecutor

LIMITS = Limits(wall_s=10, cpu_s=5, memory_mb=512, nproc=16)
MATH = Problem("gsm8k", "q1", "What is 6 times 7?", answer="42", family="math")
ESCAPE = ("imp = [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == '_wrap_close'][0]"
          ".__init__.__globals__['__builtins__']['__import__']")
# _posixsubprocess.fork_exec's 23 arguments in 3.11: run /bin/true with fresh pipes for the error report.
FORK_EXEC_ARGS = ("[b'/bin/true'], [b'/bin/true'], True, (), None, None, -1, -1, -1, -1, -1, -1, r, w, True, "
                  "False, -1, None, None, -1, -1, None, True")

ROUTES = {
    "Popen globals": "g = imp('subprocess').Popen.__init__.__globals__\nr, w = imp('os').pipe()\n"
                     f"pid = g['_fork_exec']({FORK_EXEC_ARGS})",
    "_posixsubprocess": f"r, w = imp('os').pipe()\npid = imp('_posixsubprocess').fork_exec({FORK_EXEC_ARGS})",
    "re-import": "sys = imp('sys')\ndel sys.modules['_posixsubprocess']\nr, w = imp('os').pipe()\n"
                 f"pid = imp('_posixsubprocess').fork_exec({FORK_EXEC_ARGS})",
    "create_dynamic": "spec = imp('sys').modules['_posixsubprocess'].__spec__\n"
                      f"r, w = imp('os').pipe()\npid = imp('_imp').create_dynamic(spec).fork_exec({FORK_EXEC_ARGS})",
    "subprocess.Popen": "pid = imp('subprocess').Popen(['/bin/true']).pid",
    "os.fork": "pid = imp('os').fork()",
    "os.execv": "pid = imp('os').execv('/bin/true', ['/bin/true'])",
    "os.spawnv": "pid = imp('os').spawnv(0, '/bin/true', ['/bin/true'])",
    "os.posix_spawn": "pid = imp('os').posix_spawn('/bin/true', ['/bin/true'], {})",
    "os.system": "pid = imp('os').system('/bin/true')",
}


def workflow(body: str, swallow: bool) -> str:
    lines = [ESCAPE] + body.splitlines()
    if swallow:  # the workflow catches the PermissionError and carries on: the violation is still reported
        lines = ["try:"] + ["    " + ln for ln in lines] + ["except Exception:", "    pid = 'caught'"]
    code = "\n".join("        " + ln for ln in lines + ["return str(pid)"])
    return "class Workflow:\n    async def run(self):\n" + code + "\n"


@pytest.fixture(scope="module")
def iso():
    iso = detect_isolation()
    if iso.name == "none":
        pytest.skip("no sandbox here")
    return iso


@pytest.mark.parametrize("route", sorted(ROUTES))
@pytest.mark.parametrize("swallow", [False, True], ids=["raised", "swallowed"])
async def test_every_route_to_a_new_process_is_a_sandbox_violation(iso, route, swallow):
    res = await execute_workflow(workflow(ROUTES[route], swallow), MATH, ScriptedExecutor(), iso, limits=LIMITS,
                                 validate_code=False)
    assert res.status == Status.SANDBOX_VIOLATION, (route, res.status, res.answer, res.error)
    assert res.answer == ""


async def test_the_escape_itself_is_not_a_violation(iso):
    """Control: the same escape that only reads a constant runs to the end (so the routes above fail for the
    process creation, not for the escape)."""
    res = await execute_workflow(workflow("pid = imp('math').floor(42.5)", False), MATH, ScriptedExecutor(), iso,
                                 limits=LIMITS, validate_code=False)
    assert res.status == Status.OK and res.answer == "42", (res.status, res.error)
