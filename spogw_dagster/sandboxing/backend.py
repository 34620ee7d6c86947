"""The backend protocol: what a sandbox kind must say for `process.spawn` to start, limit and stop an
untrusted process in it. A new kind is one module implementing `Isolation` plus its entry in
`detect.BACKENDS`; nothing else branches on which kind is in force.
"""

from __future__ import annotations

import random
import tempfile
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from .environment import Limits

SANDBOX_UID_RANGE = (200_000, 2_000_000)


def fresh_uid() -> int:
    """A uid no account uses, so that RLIMIT_NPROC counts only this run's processes."""
    return random.SystemRandom().randrange(*SANDBOX_UID_RANGE)


@dataclass(frozen=True)
class RunIdentity:
    """Who one run is, fixed before its command line is built: the uid its code runs as (bwrap as root), its
    container's name (docker: to kill it, since killing the client does not), and the fd holding the
    compiled syscall filter (bwrap: the child reads it at start)."""
    uid: int | None = None
    container: str | None = None
    seccomp_fd: int | None = None


@dataclass
class Launch:
    """One run's command line and how to start it, from `Isolation.launch`."""
    cmd: list[str]
    run: RunIdentity
    pass_fds: tuple[int, ...] = ()
    scratch: tempfile.TemporaryDirectory | None = None  # the unsandboxed kind's cwd, removed on release

    @property
    def cwd(self) -> str | None:
        return self.scratch.name if self.scratch is not None else None


@runtime_checkable
class Isolation(Protocol):
    """A sandbox kind. `name` is recorded with every result ("bwrap", "docker", "none"); `detail` says how it
    was set up (for `spogw preflight` and the asset metadata)."""

    name: str
    detail: str

    @property
    def host_limits_memory(self) -> bool:
        """Whether the parent must cap memory and processes itself (RLIMIT_AS, RLIMIT_NPROC, a cgroup); false
        where the engine does (docker's --memory/--pids-limit) and the client process itself needs room."""

    def runner(self, script: str) -> tuple[str, list[tuple[str, str]]]:
        """The path the child-side runner `script` (a host path) has inside, and the (host, inside) binds
        that put it there."""

    def command(self, argv: list[str], limits: Limits, ro_files: list[tuple[str, str]],
                run: RunIdentity) -> list[str]:
        """The full command line that runs `argv` inside. ro_files: (host path, sandbox path), read-only."""

    def launch(self, argv: list[str], limits: Limits,
               ro_files: list[tuple[str, str]]) -> AbstractContextManager[Launch]:
        """A fresh run: its identity and command line, and what must stay open until the process started
        (the filter's fd); leaving the context releases that."""

    async def release(self, launch: Launch) -> None:
        """After the process is killed and reaped: remove what the run left outside it (a container, a temp
        dir)."""
