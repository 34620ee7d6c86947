"""The Docker backend: each sandboxed process is a container of the skeleton image (images.SANDBOX_IMAGE),
used when an engine answers and bwrap cannot run.

The container sees exactly what the bwrap sandbox sees: /usr and the prefix of the interpreter behind
sys.executable (environment.sandbox_python), bound read-only at their own paths, plus the child-side scripts
(sandbox/*.py) read-only at /sandbox, so a change to them needs no rebuild. Measured start cost under load
(load average ~10 on 2 cores): run_code('pass') median 0.5 s in docker against 0.08 s under bwrap, most of
it runc starting the container (create ~0.05 s, start ~0.5 s).

Every container runs with --network none, a read-only root, all capabilities dropped, no-new-privileges,
a non-root uid, pids/memory/cpu limits, rlimits, a size-capped tmpfs at /tmp, no log driver (output goes
only to the parent), and a seccomp profile generated from seccomp.py: the same deny list as the bwrap
filter. Docker's own default profile is replaced by it, not combined with it (an engine takes one
profile); ours denies what no test needs, among it io_uring, which Docker 20.10's default allows.
"""

from __future__ import annotations

import asyncio
import csv
import errno
import hashlib
import io
import json
import os
import platform
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ..fsutil import pid_alive
from ..paths import cache_dir
from . import seccomp
from .backend import Launch, RunIdentity, fresh_uid
from .engine import DockerUnavailableError, client, docker, engine_answers, host, last_line
from .environment import RUNNER_INSIDE, SANDBOX_DIR_INSIDE, Limits, package_dirs_to_mask, sandbox_python
from .images import SANDBOX_IMAGE, TOP_LEVEL_MAYBE_LINKS, image_status, sandbox_dir

# The files of sandbox/ this module runs without importing them (binds sandbox/ into every container it runs); the
# code versions of the assets that import it cover them (pipeline/defs/versions.py).
SANDBOX_FILES = "*"

IMAGE = SANDBOX_IMAGE.tag
CONTAINER_LABEL = "org.spogw.sandbox"  # on every container we start, to find leftovers
PARENT_LABEL = "org.spogw.parent"  # the pid of the process that started it, to sweep orphans
DEFAULT_UID = 65534  # nobody; a run may pass a fresh one instead


@dataclass(frozen=True)
class Docker:
    detail: str = ""
    name: ClassVar[str] = "docker"
    host_limits_memory: ClassVar[bool] = False  # --memory/--pids-limit; the client itself needs room

    def runner(self, script: str) -> tuple[str, list[tuple[str, str]]]:
        return RUNNER_INSIDE, []  # sandbox/ is bound at /sandbox on every container

    @contextmanager
    def launch(self, argv: list[str], limits: Limits, ro_files: list[tuple[str, str]]) -> Iterator[Launch]:
        run = RunIdentity(container=f"spogw-{os.getpid()}-{fresh_uid()}")
        yield Launch(self.command(argv, limits, ro_files, run), run)

    async def release(self, launch: Launch) -> None:
        try:
            k = await asyncio.create_subprocess_exec("docker", "kill", launch.run.container,
                                                     stdout=asyncio.subprocess.DEVNULL,
                                                     stderr=asyncio.subprocess.DEVNULL)
            await asyncio.wait_for(k.wait(), 20)
        except (OSError, asyncio.TimeoutError):
            pass

    def command(self, argv: list[str], limits: Limits, ro_files: list[tuple[str, str]],
                run: RunIdentity) -> list[str]:
        """`docker run` for one sandboxed process. argv names sys.executable for Python; it becomes the base
        interpreter, which the container reaches through the read-only binds."""
        python = sandbox_python().executable
        argv = [python if a == sys.executable else a for a in argv]
        user = run.uid if run.uid is not None else DEFAULT_UID
        container = run.container or f"spogw-{os.getpid()}-{fresh_uid()}"
        cmd = [client(), "-H", host(), "run", "--rm", "-i", "--init", "--name", container,
               "--label", f"{CONTAINER_LABEL}=1", "--label", f"{PARENT_LABEL}={os.getpid()}",
               "--log-driver", "none",
               "--network", "none", "--read-only", "--cap-drop", "ALL",
               "--security-opt", "no-new-privileges", "--security-opt", f"seccomp={seccomp_profile_path()}",
               "--pids-limit", str(limits.nproc), "--memory", f"{limits.memory_mb}m",
               "--memory-swap", f"{limits.memory_mb}m", "--cpus", "1", "--user", f"{user}:{user}",
               "--tmpfs", f"/tmp:rw,size={limits.scratch_mb}m,mode=1777", "--workdir", "/tmp",
               # soft < hard, as under bwrap: the soft limit's SIGXCPU reads as a timeout, not a kill
               "--ulimit", f"cpu={limits.cpu_s}:{limits.cpu_s + 1}",
               "--ulimit", f"fsize={limits.fsize_mb << 20}", "--ulimit", f"nofile={limits.nofile}",
               "--ulimit", "core=0", "--env", "PYTHONDONTWRITEBYTECODE=1", "--env", "PYTHONHASHSEED=0"]
        for path in host_mounts():
            cmd += _bind(path, path)
        for d in package_dirs_to_mask(host_mounts()):  # an empty read-only tmpfs over third-party packages
            cmd += ["--tmpfs", f"{d}:ro,size=64k,mode=0555"]
        cmd += _bind(str(sandbox_dir()), SANDBOX_DIR_INSIDE)
        for source, target in ro_files:
            cmd += _bind(source, target)
        return cmd + [IMAGE] + argv


# ---------------------------------------------------------------- the seccomp profile

_SCMP_ARCH = {"x86_64": "SCMP_ARCH_X86_64", "aarch64": "SCMP_ARCH_AARCH64"}


def seccomp_profile() -> dict:
    """Docker's JSON form of seccomp.py's policy: allow by default; deny the listed syscalls with EPERM,
    clone3 with ENOSYS (glibc falls back to clone, whose flags the filter can read), and clone with any
    namespace flag. Only the native architecture is listed: syscalls of another ABI (int 0x80, x32) get the
    bad-architecture action instead of slipping past rules written for native numbers."""
    arch = _SCMP_ARCH.get(platform.machine())
    if arch is None:
        raise DockerUnavailableError(f"no seccomp architecture known for {platform.machine()}")
    rules = [{"names": sorted(seccomp.DENIED_SYSCALLS), "action": "SCMP_ACT_ERRNO", "errnoRet": seccomp.DENY_ERRNO},
             {"names": sorted(seccomp.ENOSYS_SYSCALLS), "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS}]
    for flag, bit in sorted(seccomp.CLONE_NAMESPACE_FLAGS.items()):
        rules.append({"names": ["clone"], "action": "SCMP_ACT_ERRNO", "errnoRet": seccomp.DENY_ERRNO,
                      "args": [{"index": seccomp.CLONE_FLAGS_ARG, "value": bit, "valueTwo": bit,
                                "op": "SCMP_CMP_MASKED_EQ"}],
                      "comment": f"clone with {flag}"})
    return {"defaultAction": "SCMP_ACT_ALLOW", "architectures": [arch], "syscalls": rules}


def seccomp_profile_path() -> Path:
    """The profile as a file (the client reads it on every `docker run`), written once per content."""

    text = json.dumps(seccomp_profile(), indent=1, sort_keys=True)
    path = cache_dir() / "docker" / f"seccomp-{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    return path


# ---------------------------------------------------------------- the command line

def host_mounts() -> list[str]:
    """Host paths bound read-only at the same path: what the interpreter needs, as under bwrap."""
    mounts = ["/usr"]
    for name in TOP_LEVEL_MAYBE_LINKS:  # real directories on a non-merged-/usr host
        top = os.path.join("/", name)
        if os.path.isdir(top) and not os.path.islink(top):
            mounts.append(top)
    return mounts + [m for m in sandbox_python().mounts if m not in mounts]


def _bind(source: str, target: str) -> list[str]:
    """--mount (not -v: it fails on a missing source instead of creating it as root on the host), CSV-quoted
    so that a comma in a path cannot add options."""
    out = io.StringIO()
    csv.writer(out, lineterminator="").writerow(
        ["type=bind", f"source={source}", f"target={target}", "readonly"])
    return ["--mount", out.getvalue()]


# ---------------------------------------------------------------- leftovers and detection

def leftover_containers(name_prefix: str = "spogw-") -> list[str]:
    """Names of our sandbox containers that still exist (running or not) whose name starts with the prefix."""
    res = docker("ps", "--all", "--filter", f"label={CONTAINER_LABEL}", "--format", "{{.Names}}")
    if res.returncode != 0:
        raise DockerUnavailableError(f"cannot list containers: {last_line(res)}")
    return [n for n in res.stdout.decode().split() if n.startswith(name_prefix)]


def sweep_orphans() -> list[str]:
    """Remove our containers whose parent process is gone. A container outlives a parent killed with SIGKILL
    (the client runs in its own session, and bwrap's --die-with-parent has no docker equivalent); one that
    had only been created when its client died is never auto-removed. Returns the names removed."""
    res = docker("ps", "--all", "--filter", f"label={CONTAINER_LABEL}",
                 "--format", '{{.Names}} {{.Label "%s"}}' % PARENT_LABEL)
    if res.returncode != 0:
        return []
    orphans = []
    for line in res.stdout.decode().splitlines():
        name, _, parent = line.partition(" ")
        if parent.isdigit() and not pid_alive(int(parent)):
            orphans.append(name)
    if orphans:
        docker("rm", "--force", *orphans)
    return orphans


# Run in the probe container: the interpreter starts and a seccomp filter is in force.
_PROBE = ("import sys\nstatus = open('/proc/self/status').read()\n"
          "sys.exit(0 if '\\nSeccomp:\\t2\\n' in status else 'no seccomp filter in force inside the container')")


def detect() -> tuple[Docker | None, str]:
    """(the backend, '') when the docker sandbox can run here, else (None, why not), the fix in the text."""
    try:
        client()
    except DockerUnavailableError as e:
        return None, str(e)
    ok, version = engine_answers()
    if not ok:
        return None, f"{version}; fix: start one as root: `dockerd --storage-driver=vfs &`"
    ok, why = image_status(SANDBOX_IMAGE)
    if not ok:
        return None, f"{why}; fix: `spogw sandbox build-image`"
    sweep_orphans()
    run = RunIdentity(container=f"spogw-probe-{os.getpid()}-{os.urandom(4).hex()}")
    probe = Docker().command([sys.executable, "-I", "-S", "-c", _PROBE], Limits(), [], run)
    try:
        res = subprocess.run(probe, capture_output=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    except subprocess.TimeoutExpired:
        return None, "a probe container did not finish within 60 s"
    if res.returncode != 0:
        return None, f"a probe container failed: {last_line(res)}"
    return Docker(detail=f"{IMAGE} on engine {version} at {host()}, seccomp profile from seccomp.py"), ""
