"""Dagster executors that hold the assets directory's lock, and the runs whose process died.

`locking_in_process_executor` is the code location's executor: every run launched from the UI, a backfill, the
sensor or `dagster asset materialize` holds the assets directory's lock (`data.locks.IterationLock`) from its
first step to its last, waiting for it in iteration order. A run whose executing process died (SIGKILL, OOM)
stays "started" in the instance: `close_orphaned_runs` marks such runs failed (the sensor and `spogw run` call
it), which the processes' tags (`worker_tags`) allow.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from pathlib import Path

import dagster as dg
from dagster._core.events import DagsterEvent, EngineEventData
from dagster._core.executor.base import Executor

from spogw_dagster.fsutil import pid_alive, process_start
from spogw_dagster.pipeline.data.locks import IterationLock

__all__ = ["locking_executor", "locking_in_process_executor", "worker_tags", "close_orphaned_runs"]


def locking_in_process_executor(root: Path, poll_s: float = 0.5):
    """Dagster's in-process executor (same name and config) holding the assets directory's lock for the whole
    run: a second run on the same assets directory waits (an engine event says for whom) and starts when the
    first is over. `execute_in_process` (what `spogw run` uses, under its own lock) replaces the job's executor,
    so it never waits for itself."""
    return locking_executor(dg.in_process_executor, root, poll_s=poll_s, description=(
        "Execute all steps in a single process, holding the assets directory's lock (one run at a time on an "
        "assets directory, waiting ones in iteration order)."))


def locking_executor(base, root: Path, *, label: str = "", description: str = "", poll_s: float = 0.5):
    """Executor definition `base` (same name and config) whose runs hold the assets directory's lock from the
    first step to the last, waiting for it in iteration order (`IterationLock`); `label` goes into the holder's
    description ("steps in containers")."""
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
