"""Starting, limiting and stopping one untrusted process in a sandbox, whatever its backend, and running a
Python program there (`run_code`). rlimits (CPU time, file size, open files, and address space and processes
where the backend does not cap them itself) and a wall-clock timeout apply in every backend; the whole process
group is killed on timeout, and a per-run cgroup caps memory and processes where cgroups are usable."""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import sys
import time
from dataclasses import dataclass

from ..contracts import Status
from .backend import Isolation, Launch
from .cgroups import RunCgroup
from .cgroups import manager as cgroup_manager
from .environment import Limits, SandboxStartError

# The files of sandbox/ this module runs without importing them (the sandbox's scripts it starts in the child); the
# code versions of the assets that import it cover them (pipeline/defs/versions.py).
SANDBOX_FILES = "*.py"


def _preexec(limits: Limits, host_limits_memory: bool, cgroup: RunCgroup | None = None):
    def apply() -> None:
        os.setsid()
        if cgroup is not None:  # before exec: every process of the sandbox is born inside the group
            cgroup.join()
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.fsize_mb << 20, limits.fsize_mb << 20))
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits.nofile, limits.nofile))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if host_limits_memory:  # else the engine caps the sandbox, and the client itself needs room
            resource.setrlimit(resource.RLIMIT_AS, (limits.memory_mb << 20, limits.memory_mb << 20))
            resource.setrlimit(resource.RLIMIT_NPROC, (limits.nproc, limits.nproc))

    return apply


def scrubbed_env() -> dict[str, str]:
    # Nothing of the parent's environment (API keys, tokens, proxies) crosses into the child.
    return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}


@dataclass
class Spawned:
    proc: asyncio.subprocess.Process
    iso: Isolation
    launch: Launch
    cgroup: RunCgroup | None = None  # the run's memory/pids budget, when cgroups are usable

    @property
    def uid(self) -> int | None:
        """The uid the sandboxed code runs as (bwrap as root), for auditing."""
        return self.launch.run.uid

    @property
    def container(self) -> str | None:
        return self.launch.run.container

    def kill(self) -> None:
        # os.killpg, not proc.kill(): Popen.send_signal polls first, and that poll can reap the exited child
        # before asyncio's child watcher does, which then reports a bogus returncode 255.
        if self.proc.returncode is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def oom_killed(self) -> bool:
        return self.cgroup is not None and self.cgroup.oom_killed()

    async def close(self) -> None:
        self.kill()
        try:
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except asyncio.TimeoutError:
                pass
            if self.cgroup is not None:
                await asyncio.to_thread(self.cgroup.destroy)
        finally:  # even when the close itself is cancelled: a container outlives its killed client
            await self.iso.release(self.launch)


async def spawn(iso: Isolation, argv: list[str], limits: Limits, ro_files: list[tuple[str, str]] = ()) -> Spawned:
    """Start `argv` in the sandbox `iso` with `limits`; ro_files are (host path, sandbox path) bound read-only."""
    with iso.launch(argv, limits, list(ro_files)) as launch:
        return await _start(iso, launch, limits)


async def _start(iso: Isolation, launch: Launch, limits: Limits) -> Spawned:
    cg = None
    if iso.host_limits_memory and cgroup_manager().available:
        cg = cgroup_manager().create(limits.memory_mb << 20, limits.nproc + 2)  # +2: bwrap and its init
    try:
        proc = await asyncio.create_subprocess_exec(
            *launch.cmd, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=scrubbed_env(), cwd=launch.cwd,
            preexec_fn=_preexec(limits, iso.host_limits_memory, cg), limit=limits.max_output_bytes,
            pass_fds=launch.pass_fds,
        )
    except OSError as e:  # EAGAIN, EMFILE, a missing binary: the sandbox could not start
        if cg is not None:
            cg.destroy()
        await iso.release(launch)
        raise SandboxStartError(f"could not start the sandbox process: {e}") from e
    return Spawned(proc, iso, launch, cg)


def signal_status(returncode: int | None) -> Status | None:
    """Map a death by signal to a status (CPU limit -> timeout, memory/other kills -> runtime_error)."""
    if returncode is None:
        return None
    sig = -returncode if returncode < 0 else (returncode - 128 if returncode > 128 else 0)
    if sig in (signal.SIGXCPU,):
        return Status.TIMEOUT
    if sig in (signal.SIGKILL, signal.SIGSEGV, signal.SIGABRT, signal.SIGXFSZ, signal.SIGBUS, signal.SIGSYS):
        return Status.RUNTIME_ERROR
    return None


@dataclass
class CodeRunResult:
    status: Status
    returncode: int | None
    stdout: str
    stderr: str
    isolation: str
    wall_s: float
    error: str = ""


async def _read_capped(stream: asyncio.StreamReader, cap: int, sink: bytearray) -> bool:
    """Read until EOF; keep at most `cap` bytes. Returns True if the cap was exceeded."""
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            return False
        room = cap - len(sink)
        sink += chunk[: max(room, 0)]
        if len(chunk) > room:
            return True


async def _await_ready(stream: asyncio.StreamReader, sink: bytearray, timeout_s: float) -> bool:
    """Read stderr up to the bootstrap's ready line (what precedes it, e.g. a wrapper's warning, goes to
    `sink`). False when the stream ends or `timeout_s` passes first: the sandbox never came up."""
    marker = _READY.encode() + b"\n"
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        try:
            line = await asyncio.wait_for(stream.readline(), left)
        except (asyncio.TimeoutError, ValueError, asyncio.LimitOverrunError):
            return False
        if not line:
            return False
        if line == marker:
            return True
        if len(sink) < 65536:
            sink += line[: 65536 - len(sink)]


# Printed by the bootstrap before the program is even compiled: its absence means the sandbox never came up.
_READY = "\x00spogw-sandbox-ready"
_BOOT = ("import sys; sys.stderr.write(%r + '\\n'); sys.stderr.flush(); "
         "exec(compile(sys.stdin.read(), '<program>', 'exec'), {'__name__': '__main__'})" % _READY)
_CODE_SLOTS: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}


def loop_slots(table: dict[asyncio.AbstractEventLoop, asyncio.Semaphore]) -> asyncio.Semaphore:
    """The running event loop's semaphore in `table` (one per CPU, at least 2), made on first use: sandboxed
    runs in flight are bounded per loop because each may take its whole memory budget."""
    loop = asyncio.get_running_loop()
    if loop not in table:
        table.clear()  # old loops are gone
        table[loop] = asyncio.Semaphore(max(2, os.cpu_count() or 2))
    return table[loop]


def _code_slots() -> asyncio.Semaphore:
    return loop_slots(_CODE_SLOTS)


async def run_code(program: str, iso: Isolation, limits: Limits | None = None) -> CodeRunResult:
    """Run a Python program (untrusted: generated code, or a solution plus hidden tests) in the sandbox.

    status ok with returncode 0 means it ran to the end; runtime_error covers exceptions, failed asserts,
    memory or output limits; timeout covers the wall clock and the CPU-time limit. Raises
    SandboxStartError when the sandbox itself did not come up (never a score).
    """
    limits = limits or Limits(wall_s=15, cpu_s=10)
    async with _code_slots():
        return await _run_code(program, iso, limits)


async def _run_code(program: str, iso: Isolation, limits: Limits) -> CodeRunResult:
    t0 = time.monotonic()
    sp = await spawn(iso, [sys.executable, "-I", "-S", "-c", _BOOT], limits)
    out, err = bytearray(), bytearray()
    try:
        sp.proc.stdin.write(program.encode())
        await sp.proc.stdin.drain()
        sp.proc.stdin.close()
    except (BrokenPipeError, ConnectionResetError):
        pass
    cap = limits.max_output_bytes
    # The ready line comes before the program is even read, so waiting for it first cannot be delayed by the
    # program; reading it before the output (not racing the two readers) keeps a program that floods stdout
    # at once from looking like a sandbox that never started (an infrastructure error, no score).
    started = await _await_ready(sp.proc.stderr, err, max(limits.wall_s, 1.0))
    readers = {asyncio.create_task(_read_capped(sp.proc.stdout, cap, out)),
               asyncio.create_task(_read_capped(sp.proc.stderr, cap, err))}
    status, error = Status.OK, ""
    if not started:
        for t in readers:
            t.cancel()
        await sp.close()
        await asyncio.gather(*readers, return_exceptions=True)
        why = err.decode(errors="replace").strip()[-300:]
        raise SandboxStartError(f"the {iso.name} sandbox did not start (rc={sp.proc.returncode}): {why}")
    try:
        pending = readers
        while pending:
            left = limits.wall_s - (time.monotonic() - t0)
            done, pending = await asyncio.wait(pending, timeout=max(left, 0), return_when=asyncio.FIRST_COMPLETED)
            if not done:
                status, error = Status.TIMEOUT, f"wall-clock limit of {limits.wall_s}s exceeded"
                break
            if any(t.result() for t in done):  # a flood: stop it now rather than at the wall clock
                status, error = Status.RUNTIME_ERROR, f"output limit of {cap} bytes exceeded"
                break
        if status == Status.OK:
            await asyncio.wait_for(sp.proc.wait(), max(1.0, limits.wall_s - (time.monotonic() - t0)))
    except asyncio.TimeoutError:
        status, error = Status.TIMEOUT, f"wall-clock limit of {limits.wall_s}s exceeded"
    finally:
        for t in readers:
            t.cancel()
        oom = sp.oom_killed()
        await sp.close()
        await asyncio.gather(*readers, return_exceptions=True)
    rc = sp.proc.returncode
    stderr = err.decode(errors="replace")
    if status == Status.OK:
        by_signal = signal_status(rc)
        if oom:
            status, error = Status.RUNTIME_ERROR, f"memory limit of {limits.memory_mb} MB exceeded"
        elif by_signal is not None:
            status = by_signal
            error = "CPU-time limit exceeded" if by_signal == Status.TIMEOUT else f"killed by signal (rc={rc})"
            if rc in (-signal.SIGSYS, 128 + signal.SIGSYS):
                error = f"killed by the sandbox's syscall filter (SIGSYS, rc={rc})"
        elif rc != 0:
            status = Status.RUNTIME_ERROR
            lines = stderr.strip().splitlines()
            error = lines[-1] if lines else f"exit code {rc}"
    return CodeRunResult(status, rc, out.decode(errors="replace"), stderr, iso.name, time.monotonic() - t0, error)
