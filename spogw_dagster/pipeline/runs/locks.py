"""The assets directory's lock, and the runs of processes that died.

One writer per assets directory: `spogw run` and `spogw compare --iteration` hold an exclusive fcntl lock on
`<assets>/.spogw-run.lock` while they run (`assets_dir_lock`). A second launch on the same directory is
refused at once with the holder's pid and what to do; two loops never interleave their partitions. The
kernel drops the lock when its holder exits, however it exits (SIGKILL included), so a crash never leaves a
stale lock behind; the pid written into the file is only there to name the holder.

Runs launched any other way (the UI, a backfill, the sensor, `dagster asset materialize`) execute through the
code location's executor, `locking_in_process_executor`: it takes the same lock for the whole run, waiting for
it instead of refusing, in iteration order (a backfill's iteration k+1 never goes before iteration k, which it
samples from). This holds under any DAGSTER_HOME: Dagster's own limits (the run queue's
`tag_concurrency_limits` in INSTANCE_YAML, or `concurrency: pools:`) are instance configuration, which a code
location cannot supply, and a run started outside the queue ignores them.

A run whose executing process died (SIGKILL, OOM) stays "started" in the instance: `close_orphaned_runs`
marks such runs failed (the sensor and `spogw run` call it), which the processes' tags (`worker_tags`) allow.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from pathlib import Path

from spogw_dagster.fsutil import pid_alive, process_start
from spogw_dagster.pipeline.settings import ConfigValidationError

__all__ = ["LOCK_FILE", "AssetsDirBusyError", "assets_dir_lock", "IterationLock", "locking_executor",
           "locking_in_process_executor", "worker_tags", "close_orphaned_runs"]


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


def locking_in_process_executor(root: Path, poll_s: float = 0.5):
    """Dagster's in-process executor (same name and config) holding the assets directory's lock for the whole
    run: a second run on the same assets directory waits (an engine event says for whom) and starts when the
    first is over. `execute_in_process` (what `spogw run` uses, under its own lock) replaces the job's executor,
    so it never waits for itself."""
    import dagster as dg

    return locking_executor(dg.in_process_executor, root, poll_s=poll_s, description=(
        "Execute all steps in a single process, holding the assets directory's lock (one run at a time on an "
        "assets directory, waiting ones in iteration order)."))


def locking_executor(base, root: Path, *, label: str = "", description: str = "", poll_s: float = 0.5):
    """Executor definition `base` (same name and config) whose runs hold the assets directory's lock from the
    first step to the last, waiting for it in iteration order (`IterationLock`); `label` goes into the holder's
    description ("steps in containers")."""
    import dagster as dg
    from dagster._core.events import DagsterEvent, EngineEventData
    from dagster._core.executor.base import Executor

    class LockingExecutor(Executor):
        def __init__(self, inner):
            self._inner = inner

        @property
        def retries(self):
            return self._inner.retries

        @property
        def step_dependency_config(self):
            return self._inner.step_dependency_config

        def execute(self, plan_context, execution_plan):
            run = plan_context.dagster_run
            key = run.tags.get("dagster/partition")
            what = ", ".join(x for x in (run.job_name, label, f"partition {key}" if key else "") if x)
            lock = IterationLock(root, f"dagster run {run.run_id} ({what})", key)
            t0 = time.monotonic()
            try:
                told = ""
                while (why := lock.try_acquire()) is not None:
                    if why != told:
                        yield DagsterEvent.engine_event(
                            plan_context, f"spogw: waiting for the lock of assets directory {root} ({why}): one "
                            f"run at a time on an assets directory", EngineEventData())
                        told = why
                    time.sleep(poll_s)
                # the process executing the run, so that a dead one is found and its run closed
                # (`close_orphaned_runs`: the sensor, `spogw run`)
                with contextlib.suppress(Exception):
                    plan_context.instance.add_run_tags(run.run_id, worker_tags())
                yield DagsterEvent.engine_event(
                    plan_context, f"spogw: holding the lock of assets directory {root} (waited "
                    f"{time.monotonic() - t0:.1f} s, pid {os.getpid()})", EngineEventData())
                yield from self._inner.execute(plan_context, execution_plan)
            finally:
                lock.release()

    return dg.ExecutorDefinition(
        name=base.name, config_schema=base.config_schema, requirements=base.get_requirements,
        executor_creation_fn=lambda init_context: LockingExecutor(base.executor_creation_fn(init_context)),
        description=description or base.description)


def worker_tags() -> dict[str, str]:
    """What identifies the process that executes a run: pid, its start time (a reused pid differs) and host."""
    pid = os.getpid()
    return {"spogw/pid": str(pid), "spogw/pid_start": process_start(pid) or "", "spogw/host": socket.gethostname()}


def close_orphaned_runs(instance) -> list[tuple[str, str]]:
    """Runs the instance still shows as started although the process that executed them is gone (SIGKILL, OOM,
    a lost machine): `spogw run`'s own runs and every run of the code location's executors (the UI, a backfill,
    the sensor), which record that process in their tags (`worker_tags`). Each is marked failed with the
    reason, so the event log explains it, the sensor stops waiting for it and the UI can re-execute it from
    failure. A run whose process is alive, or ran on another host, is left alone. Returns (run id, pid)."""
    import dagster as dg

    closed: list[tuple[str, str]] = []
    try:
        runs = instance.get_runs(filters=dg.RunsFilter(
            statuses=[dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.STARTING]))
    except Exception:  # storage hiccup: this is bookkeeping, never a reason to stop
        return closed
    host = socket.gethostname()
    for r in runs:
        pid = r.tags.get("spogw/pid", "")
        if (not pid.isdigit() or int(pid) == os.getpid() or r.tags.get("spogw/host", host) != host
                or pid_alive(int(pid), r.tags.get("spogw/pid_start") or None)):
            continue
        who = ("the `spogw run` process" if r.tags.get("spogw/launched_by", "").startswith("spogw run")
               else "the run worker")
        with contextlib.suppress(Exception):
            instance.report_run_failed(r, message=(
                f"{who} (pid {pid}) that executed this run ended before the run finished (killed or crashed); "
                "the partitions it finished are kept: rerun the rest (`spogw run`, or re-execute from failure "
                "in the UI)"))
            closed.append((r.run_id, pid))
    return closed
