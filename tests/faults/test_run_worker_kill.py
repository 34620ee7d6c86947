"""Fault 1, the UI's path: `dagster dev` (workspace.yaml, the `ci` profile, its own DAGSTER_HOME) runs iteration
0000 as the UI launches it, and the whole `dagster dev` tree (webserver, daemon, code server and the run worker
that executes the run and holds the assets directory's lock) is SIGKILLed once lora_checkpoint's optimizer step
has started (read from the run's event log through GraphQL, never a sleep): a lost machine, an OOM kill of the
session. (A run worker killed alone is reported failed by Dagster's own code server, which watches its
children; with the code server gone too, nothing does.)

Dagster's default run launcher has no run-worker health check, so after `dagster dev` starts again the run
would stay STARTED forever and the loop's sensor would wait on it forever. The locking executor records the
worker's pid, start time and host in the run's tags, and the sensor's first tick marks such a run failed with
the reason. Then the run is re-executed from failure (as the UI's button does): only the steps that had not
succeeded run; the sensor launches iteration 0001 on its own, and at the end every table and adapter equals the
undisturbed `spogw run`'s, no temporary file is left and no executor call was made twice."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from spogw_dagster.pipeline.defs.partitions import PARTITIONS_NAME

from .conftest import (all_new_calls, cache_rows, catalog_agrees, record, rows_lost_and_duplicated, table_state,
                       temp_files)

pytestmark = [pytest.mark.faults, pytest.mark.model]

REPO = Path(__file__).resolve().parents[2]
LOCATION = "spogw"
REPO_SELECTOR = {"repositoryLocationName": LOCATION, "repositoryName": "__repository__"}

ADD_PARTITION = """
mutation Add($repo: RepositorySelector!, $def: String!, $key: String!) {
  addDynamicPartition(repositorySelector: $repo, partitionsDefName: $def, partitionKey: $key) {
    __typename ... on PythonError { message } ... on UnauthorizedError { message }
  }
}"""
LAUNCH = """
mutation Launch($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
    ... on RunConfigValidationInvalid { errors { message } } ... on InvalidSubsetError { message }
  }
}"""
REEXECUTE = """
mutation Reexecute($params: ReexecutionParams!) {
  launchRunReexecution(reexecutionParams: $params) {
    __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
  }
}"""
RUN = """
query Run($runId: ID!) {
  runOrError(runId: $runId) {
    __typename
    ... on Run { status tags { key value } stepStats { stepKey status }
                 eventConnection(afterCursor: null) { events { __typename ... on MessageEvent { message } } } }
  }
}"""
RUNS = """
query Runs { runsOrError { __typename ... on Runs { results { runId status tags { key value } } } } }"""


def _run(dev, run_id: str) -> dict:
    r = dev.graphql(RUN, {"runId": run_id})["runOrError"]
    assert r["__typename"] == "Run", r
    return r


def _wait(pred, what: str, dev, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}:\n{dev.log_tail()}")


def test_killed_dagster_dev_run_is_closed_by_the_sensor_and_reexecution_finishes_the_loop(undisturbed, tmp_path):
    import sys

    sys.path.insert(0, str(REPO / "tests"))
    from ui_helpers import DagsterDev, tree

    root = tmp_path / "assets"
    root.mkdir()
    home = tmp_path / "dagster_home"
    env = {k: v for k, v in os.environ.items() if k not in ("SPOGW_CONFIG", "DAGSTER_HOME", "SPOGW_PROFILE")}
    env.update(SPOGW_PROFILE="ci", SPOGW_ASSETS_DIR=str(root), OMP_WAIT_POLICY="PASSIVE")
    dev = DagsterDev(REPO, home, env, log_path=tmp_path / "dagster_dev.log")
    dev.start()
    t0 = time.monotonic()
    try:
        dev.wait_ready()
        res = dev.graphql(ADD_PARTITION, {"repo": REPO_SELECTOR, "def": PARTITIONS_NAME, "key": "0000"})
        assert res["addDynamicPartition"]["__typename"] == "AddDynamicPartitionSuccess", res
        params = {"selector": {**REPO_SELECTOR, "jobName": "spogw_iteration"},
                  "executionMetadata": {"tags": [{"key": "dagster/partition", "value": "0000"}]}}
        res = dev.graphql(LAUNCH, {"params": params})["launchRun"]
        assert res["__typename"] == "LaunchRunSuccess", res
        run_id = res["run"]["runId"]

        def training_started():
            r = _run(dev, run_id)
            assert r["status"] not in ("SUCCESS", "FAILURE", "CANCELED"), (r["status"], dev.log_tail())
            started = any("optimizer step 1/" in (e.get("message") or "") and "started" in (e.get("message") or "")
                          for e in r["eventConnection"]["events"])
            return r if started else None

        r = _wait(training_started, "lora_checkpoint's first optimizer step", dev, 600)
        pid = int({t["key"]: t["value"] for t in r["tags"]}["spogw/pid"])  # the worker, recorded by our executor
        procs = tree(dev.proc.pid)
        assert pid in procs, (pid, procs)
        for p in [dev.proc.pid, *procs]:  # everything at once: nothing survives to report the run
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        dev.proc.wait(30)
    finally:
        dev.stop()
    killed_at = sorted(t for t, parts in table_state(root).items() if "0000" in parts)

    dev = DagsterDev(REPO, home, env, log_path=tmp_path / "dagster_dev_2.log")
    dev.start()
    try:
        dev.wait_ready()
        # the sensor's first tick closes the run, naming the dead worker
        closed = _wait(lambda: (x := _run(dev, run_id))["status"] == "FAILURE" and x, "the run marked failed", dev,
                       240)
        msgs = " ".join(e.get("message") or "" for e in closed["eventConnection"]["events"])
        assert f"the run worker (pid {pid})" in msgs and "ended before the run finished" in msgs, msgs[-2000:]
        steps = {s["stepKey"]: s["status"] for s in closed["stepStats"]}
        done_before = {k for k, v in steps.items() if v == "SUCCESS"}
        assert "sampled_workflows" in done_before and "lora_checkpoint" not in done_before, steps

        res = dev.graphql(REEXECUTE, {"params": {"parentRunId": run_id, "strategy": "FROM_FAILURE"}})
        res = res["launchRunReexecution"]
        assert res["__typename"] == "LaunchRunSuccess", res
        rerun = res["run"]["runId"]
        done = _wait(lambda: (x := _run(dev, rerun))["status"] in ("SUCCESS", "FAILURE", "CANCELED") and x,
                     "the re-execution", dev, 600)
        assert done["status"] == "SUCCESS", (done["status"], dev.log_tail())
        rerun_steps = {s["stepKey"] for s in done["stepStats"]}
        assert not (rerun_steps & done_before), (rerun_steps, done_before)  # finished steps were not run again

        # the loop goes on by itself: the sensor launches iteration 0001
        def loop_done():
            runs = dev.graphql(RUNS)["runsOrError"]["results"]
            busy = [x for x in runs if x["status"] in ("QUEUED", "NOT_STARTED", "STARTING", "STARTED")]
            return (root / "benchmark_report" / "0001.parquet").exists() and not busy and runs
        runs = _wait(loop_done, "the sensor's iteration 0001", dev, 600)
        assert all(x["status"] == "SUCCESS" for x in runs if x["runId"] != run_id), runs
    finally:
        dev.stop()
    assert not dev.leftovers()
    state = table_state(root)
    assert state == undisturbed["state"]
    lost, dup = rows_lost_and_duplicated(state, undisturbed["state"])
    assert temp_files(root) == []
    catalog_agrees(root)
    made = all_new_calls(root, home)
    assert cache_rows(root) == undisturbed["cache_rows"] and made == undisturbed["cache_rows"], \
        (made, cache_rows(root), undisturbed["cache_rows"])
    record("SIGKILL of the whole `dagster dev` tree during lora_checkpoint of a UI launch, restart, re-execution "
           "from failure", survived=True, closed_by="next_iteration_sensor", partitions_at_kill=killed_at,
           steps_rerun=sorted(rerun_steps), executor_calls_repeated=made - undisturbed["cache_rows"],
           rows_lost=lost, rows_duplicated=dup, wall_s=round(time.monotonic() - t0, 1))
