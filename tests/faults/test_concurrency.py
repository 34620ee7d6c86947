"""Fault 6: concurrent launches outside `spogw run` (the UI, a backfill, the sensor). Dagster's own limits (the run
queue's `tag_concurrency_limits`, `concurrency: pools:`) are instance configuration, which a code location
cannot supply, and a run that does not pass through the queue ignores them; so the code location's executor
holds the assets directory's lock for the whole run (`locks.locking_in_process_executor`), waiting for it in
iteration order.

- two `dagster asset materialize` processes (execution_scores of iterations 0 and 1, against a slow fake
  executor so that each step lasts seconds) on one assets directory, under a DAGSTER_HOME whose dagster.yaml
  sets no limit at all: the step intervals from the event log never overlap; the second run's log says it
  waited and for whom; a `spogw run` launched meanwhile is refused, naming the Dagster run that holds the lock;
- the waiting line (`IterationLock`): waiters go in iteration order, not arrival order; a dead waiter's
  ticket is skipped."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from spogw_dagster.pipeline.data.locks import LOCK_FILE, WAITING_DIR, IterationLock, assets_dir_lock
from spogw_dagster.pipeline.runs.loop import _failure_message
from spogw_dagster.pipeline.defs.partitions import PARTITIONS_NAME
from spogw_dagster.pipeline.data.storage import AssetStore

from tests.cli import cli_env, spogw

from .conftest import catalog_agrees, record, temp_files
from .test_executor_outage import MODEL, Endpoint, _materialize, _overrides

pytestmark = [pytest.mark.faults, pytest.mark.model]

DAGSTER = str(Path(sys.executable).with_name("dagster"))


@pytest.fixture(scope="module")
def two_iterations(tmp_path_factory) -> Path:
    """sampled_workflows[0000] from the ci generator, and the same rows as sampled_workflows[0001] (execution_scores
    reads only that table: enough for two real, independent steps)."""
    root = tmp_path_factory.mktemp("concurrency") / "assets"
    res = _materialize(root, root.parent / "home0", ["sampled_workflows"], _overrides("http://127.0.0.1:9/v1"))
    assert res.success, _failure_message(res)
    store = AssetStore(root)
    df = store.read_parquet("sampled_workflows", "0000")
    df.with_columns(pl.lit(1, dtype=df.schema["iteration"]).alias("iteration")).write_parquet(
        store.table_dir("sampled_workflows") / "0001.parquet")
    return root


def _step_intervals(inst, run_id: str) -> dict[str, tuple[float, float]]:
    out: dict[str, list[float]] = {}
    for rec in inst.all_logs(run_id):
        ev = rec.dagster_event
        if ev is None or not ev.step_key:
            continue
        if ev.event_type == dg.DagsterEventType.STEP_START:
            out.setdefault(ev.step_key, [rec.timestamp, rec.timestamp])[0] = rec.timestamp
        elif ev.event_type in (dg.DagsterEventType.STEP_SUCCESS, dg.DagsterEventType.STEP_FAILURE):
            out.setdefault(ev.step_key, [rec.timestamp, rec.timestamp])[1] = rec.timestamp
    return {k: (a, b) for k, (a, b) in out.items()}


def test_two_dagster_launches_on_one_assets_directory_never_overlap(two_iterations, tmp_path):
    root = two_iterations
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")  # no run queue limit, no pools
    ep = Endpoint(tmp_path / "requests.log").start("--delay", "2")
    cfg = tmp_path / "spogw.yaml"
    cfg.write_text(f"profile: ci\nexecutor:\n  url: {ep.url}\n  model: {MODEL}\n")
    env = cli_env()
    env.update(DAGSTER_HOME=str(home), SPOGW_CONFIG=str(cfg), SPOGW_ASSETS_DIR=str(root))
    with dg.DagsterInstance.from_config(str(home)) as inst:
        inst.add_dynamic_partitions(PARTITIONS_NAME, ["0000", "0001"])

    def launch(key: str) -> subprocess.Popen:
        return subprocess.Popen([DAGSTER, "asset", "materialize", "-m", "spogw_dagster.definitions",
                                 "--select", "execution_scores", "--partition", key], cwd=str(Path.cwd()),
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    outs: dict[str, str] = {}
    procs = {k: launch(k) for k in ("0001", "0000")}
    readers = [threading.Thread(target=lambda k=k, p=p: outs.__setitem__(k, p.communicate(timeout=400)[0]))
               for k, p in procs.items()]
    for t in readers:
        t.start()
    refused = None
    try:
        # while one of them holds the lock, `spogw run` on the same directory is refused, naming the holder
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and "dagster run" not in _holder(root):
            time.sleep(0.2)
        assert "dagster run" in _holder(root), {k: outs.get(k) for k in procs}
        refused = spogw("run", "--profile", "ci", "--assets-dir", str(root), timeout=300)
        for t in readers:
            t.join(420)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
        ep.stop()
    for k, p in procs.items():
        assert p.returncode == 0, outs.get(k, "")[-4000:]
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "is locked by another run" in refused.stderr and "`dagster run " in refused.stderr, refused.stderr

    with dg.DagsterInstance.from_config(str(home)) as inst:
        runs = inst.get_runs()
        assert len(runs) == 2 and all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
        spans = {}
        waited = {}
        for r in runs:
            steps = _step_intervals(inst, r.run_id)
            assert "execution_scores" in steps, steps
            spans[r.tags["dagster/partition"]] = (min(a for a, _ in steps.values()), max(b for _, b in steps.values()))
            msgs = [rec.user_message for rec in inst.all_logs(r.run_id)]
            waited[r.tags["dagster/partition"]] = any("spogw: waiting for the lock of assets directory" in m
                                                      for m in msgs)
            assert any("spogw: holding the lock of assets directory" in m for m in msgs), msgs
    (a0, a1), (b0, b1) = sorted(spans.values())
    assert a1 <= b0, spans  # the second run's first step starts after the first run's last step ended
    assert sorted(waited.values()) == [False, True], waited  # one ran at once, the other waited
    assert len(ep.requests()) >= 2
    for k in ("0000", "0001"):
        assert AssetStore(root).readable("execution_scores", k)
    assert temp_files(root) == [] and not list((root / WAITING_DIR).iterdir())
    catalog_agrees(root)
    record("two Dagster launches (UI/backfill path) on one assets directory, no instance limit", survived=True,
           overlap_s=0.0, gap_s=round(b0 - a1, 2), second_waited=True, spogw_run_meanwhile="refused (exit 2)",
           rows_lost=0, rows_duplicated=0)


def _holder(root: Path) -> str:
    try:
        return (root / LOCK_FILE).read_text()
    except OSError:
        return ""


def test_waiting_runs_go_in_iteration_order_and_dead_waiters_are_skipped(tmp_path):
    root = tmp_path / "assets"
    first = IterationLock(root, "run A (0000)", "0000")
    assert first.try_acquire() is None
    late = IterationLock(root, "run C (0002)", "0002")  # arrives first ...
    time.sleep(0.01)
    early = IterationLock(root, "run B (0001)", "0001")  # ... but iteration 1 goes before iteration 2
    assert "held by pid" in early.try_acquire() and "run A (0000)" in early.try_acquire()
    assert "an earlier iteration waits for it first: run B (0001)" in late.try_acquire()
    first.release()
    assert late.try_acquire() is not None  # still B's turn
    assert early.try_acquire() is None
    assert "held by" in late.try_acquire()
    # a waiter that died (its pid is gone) does not block the line
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (root / WAITING_DIR / f"0000.{time.time_ns():020d}.{int(dead.stdout)}").write_text("dead run (0000)")
    early.release()
    assert late.try_acquire() is None
    late.release()
    assert not list((root / WAITING_DIR).iterdir())
    assert os.path.exists(root / LOCK_FILE)
    # a run launched by the process that holds the lock as an orchestrator (the container loop's execute_job)
    # goes ahead under that lock instead of waiting for itself
    with assets_dir_lock(root, "spogw run (steps in containers)"):
        own = IterationLock(root, "dagster run D (0003)", "0003")
        assert own.try_acquire() is None
        own.release()
    after = IterationLock(root, "dagster run E (0004)", "0004")  # released: an ordinary run takes it again
    assert after.try_acquire() is None
    after.release()
    assert not list((root / WAITING_DIR).iterdir())
    record("waiting Dagster runs: iteration order, dead waiter", survived=True, rows_lost=0, rows_duplicated=0)
