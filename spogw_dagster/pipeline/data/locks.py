"""The assets directory's lock: one writer at a time, waiting ones in iteration order.

One writer per assets directory: `spogw run` and `spogw compare --iteration` hold an exclusive fcntl lock on
`<assets>/.spogw-run.lock` while they run (`assets_dir_lock`). A second launch on the same directory is
refused at once with the holder's pid and what to do; two loops never interleave their partitions. The
kernel drops the lock when its holder exits, however it exits (SIGKILL included), so a crash never leaves a
stale lock behind; the pid written into the file is only there to name the holder.

Runs launched any other way (the UI, a backfill, the sensor, `dagster asset materialize`) execute through the
code location's executor, `defs.run_executors.locking_in_process_executor`: it takes the same lock (`IterationLock`)
for the whole run, waiting for
it instead of refusing, in iteration order (a backfill's iteration k+1 never goes before iteration k, which it
samples from). This holds under any DAGSTER_HOME: Dagster's own limits (the run queue's
`tag_concurrency_limits` in INSTANCE_YAML, or `concurrency: pools:`) are instance configuration, which a code
location cannot supply, and a run started outside the queue ignores them.

A run whose executing process died (SIGKILL, OOM) stays "started" in the instance:
`defs.run_executors.close_orphaned_runs` marks such runs failed.

No Dagster here: file locks only (the data layer), used by run control and by the Dagster executors.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from pathlib import Path

from spogw_dagster.fsutil import pid_alive
from spogw_dagster.pipeline.settings import ConfigValidationError

__all__ = ["LOCK_FILE", "AssetsDirBusyError", "assets_dir_lock", "IterationLock"]


LOCK_FILE = ".spogw-run.lock"


class AssetsDirBusyError(ConfigValidationError):
    """Another `spogw run` (or `spogw compare --iteration`) holds the assets directory's lock. A
    ConfigValidationError, so the CLI prints it as one line and exits with status 2."""


def _lock_holder(path: Path) -> dict:
    try:
        d = json.loads(path.read_text() or "{}")
        return d if isinstance(d, dict) else {}
    except (OSError, ValueError):
        return {}


def _describe_holder(path: Path) -> tuple[int | None, str]:
    h = _lock_holder(path)
    pid = h.get("pid")
    who = (f"pid {pid}" + (f" on {h['host']}" if h.get("host") else "")
           + (f", `{h['command']}`" if h.get("command") else "")
           + (f", started {h['started']}" if h.get("started") else "")) if pid else "a process that is starting"
    return pid, who


# assets directories whose lock this process holds as an orchestrator (`spogw run`, the container loop): the runs
# it launches itself through the code location's executor must not wait for it (see IterationLock)
_ORCHESTRATED_HERE: set[str] = set()


@contextlib.contextmanager
def assets_dir_lock(root: Path, command: str = "spogw run", *, orchestrator: bool = True):
    """Hold the exclusive lock of the assets directory `root` for the duration; refuse if another process
    holds it (AssetsDirBusyError naming its pid). The file descriptor is close-on-exec, so the sandbox's
    children never inherit (and never keep) the lock."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        pid, who = _describe_holder(path)
        raise AssetsDirBusyError(
            f"assets directory {root} is locked by another run ({who}; lock file {path}). Two runs on one assets "
            f"directory would interleave their partitions, so this one does not start. Wait for it to finish, "
            f"stop it" + (f" (kill {pid})" if pid else "") + ", or pass another --assets-dir.") from None
    try:
        info = {"pid": os.getpid(), "host": socket.gethostname(), "command": command,
                "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        if orchestrator:
            _ORCHESTRATED_HERE.add(str(root.resolve()))
        yield path
    finally:
        if orchestrator:
            _ORCHESTRATED_HERE.discard(str(root.resolve()))
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


WAITING_DIR = ".spogw-waiting"


class IterationLock:
    """The assets directory's lock (`assets_dir_lock`) for one Dagster run, waited for in line: each waiting run
    leaves a ticket `<assets>/.spogw-waiting/<partition>.<ns>.<pid>`; only the first live ticket in (partition,
    arrival) order tries the lock, so waiting iterations go in iteration order. Tickets of dead processes are
    ignored and removed. `try_acquire()` returns None once held, else why not; `release()` lets go. A run launched
    by a process that holds the lock as an orchestrator (`spogw run` with steps in containers calls `execute_job`)
    goes ahead under its launcher's lock instead of waiting for itself."""

    def __init__(self, root: Path, command: str, key: str | None):
        self.root = root
        self.command = command
        self._dir = root / WAITING_DIR
        self._dir.mkdir(parents=True, exist_ok=True)
        self.ticket = self._dir / f"{key or '~'}.{time.time_ns():020d}.{os.getpid()}"
        self.ticket.write_text(command)
        self._cm = None

    def _first_in_line(self) -> Path | None:
        live = []
        for t in self._dir.iterdir():
            try:
                pid = int(t.name.rsplit(".", 1)[1])
            except (IndexError, ValueError):
                continue
            if pid != os.getpid() and not pid_alive(pid):
                with contextlib.suppress(OSError):
                    t.unlink()
                continue
            live.append(t)
        return min(live, key=lambda t: t.name.rsplit(".", 1)[0], default=None)

    def try_acquire(self) -> str | None:
        if str(self.root.resolve()) in _ORCHESTRATED_HERE:
            with contextlib.suppress(OSError):
                self.ticket.unlink()
            return None
        first = self._first_in_line()
        if first is not None and first != self.ticket:
            return f"an earlier iteration waits for it first: {first.read_text(errors='replace') or first.name}"
        cm = assets_dir_lock(self.root, self.command, orchestrator=False)
        try:
            cm.__enter__()
        except AssetsDirBusyError:
            return f"held by {_describe_holder(self.root / LOCK_FILE)[1]}"
        self._cm = cm
        with contextlib.suppress(OSError):
            self.ticket.unlink()
        return None

    def release(self) -> None:
        with contextlib.suppress(OSError):
            self.ticket.unlink()
        cm, self._cm = self._cm, None
        if cm is not None:
            cm.__exit__(None, None, None)
