"""Fault 5: the executor endpoint fails under `execution_scores`. A fake OpenAI-compatible server *process*
(tests/fake_openai_server.py: deterministic answers, a request log, `--die-after N` to die mid-call, `--delay`)
serves the `ci` profile's executor (`executor: {url, model}`); real in-process Dagster runs of
execution_scores[0000] on sampled_workflows[0000] made once by the ci generator.

- the endpoint dies mid-run and comes back a second later: the retries carry the run; every row is scored,
  none `executor_error`, and the table equals the undisturbed one's (content hash);
- it dies for good: the asset fails (dg.Failure naming the endpoint URL, the threshold and the fix) and
  writes nothing; the calls answered before the death are in the call cache, no failure is; a dead endpoint
  fails fast (one call waits out the retry schedule, the rest one attempt each);
- it comes back and the partition is rematerialized: the server receives exactly the missing calls;
- a slow endpoint (each reply slower than the workflow's `execution.wall_s`, faster than `executor.timeout_s`):
  no workflow times out, since time in operator calls is served by the parent (the server sees the parent's
  httpx client, never the sandbox) and is excluded from the workflow's wall clock."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from spogw_dagster.pipeline.runs.loop import _failure_message
from spogw_dagster.pipeline.defs.partitions import PARTITIONS_NAME
from spogw_dagster.pipeline.defs.sensors import JOB_NAME
from spogw_dagster.pipeline.data.storage import AssetStore
from spogw_dagster.pipeline.defs.wiring import build_definitions

from .conftest import _frame_hash, cache_rows, record, temp_files

pytestmark = [pytest.mark.faults, pytest.mark.model]

FAKE = Path(__file__).resolve().parents[1] / "fake_openai_server.py"
MODEL = "fake-model"
KEY = "0000"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Endpoint:
    """The fake server as a process on a fixed port: it can die (SIGKILL, or by itself with --die-after) and be
    started again on the same URL. Every chat request it received is a line in its log."""

    def __init__(self, log: Path, port: int | None = None):
        self.port = port or _free_port()
        self.log = log
        self.p: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, *opts: str) -> Endpoint:
        self.p = subprocess.Popen([sys.executable, str(FAKE), "--port", str(self.port), "--model", MODEL,
                                   "--log", str(self.log), *opts], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, start_new_session=True)
        line = self.p.stdout.readline()
        assert line.startswith("PORT "), line
        return self

    def alive(self) -> bool:
        return self.p is not None and self.p.poll() is None

    def stop(self) -> None:
        if self.alive():
            os.kill(self.p.pid, signal.SIGKILL)
        if self.p is not None:
            self.p.wait(10)

    def requests(self) -> list[dict]:
        return [json.loads(s) for s in self.log.read_text().splitlines()] if self.log.exists() else []


def _overrides(url: str, **execution) -> dict:
    return {"executor": {"url": url, "model": MODEL, "timeout_s": execution.pop("timeout_s", 120.0)},
            "execution": execution}


def _materialize(root: Path, home: Path, assets: list[str], overrides: dict):
    job = build_definitions("ci", assets_dir=root, overrides=overrides).resolve_job_def(JOB_NAME)
    home.mkdir(parents=True, exist_ok=True)
    with dg.instance_for_test(temp_dir=str(home)) as inst:
        inst.add_dynamic_partitions(PARTITIONS_NAME, [KEY])
        return job.execute_in_process(partition_key=KEY, instance=inst, raise_on_error=False,
                                      asset_selection=[dg.AssetKey(a) for a in assets])


def _scores(root: Path) -> pl.DataFrame:
    return AssetStore(root).read_parquet("execution_scores", KEY)


def _copy(base: Path, dst: Path) -> Path:
    shutil.copytree(base, dst, ignore=shutil.ignore_patterns(".dagster", "call_cache.sqlite*"))
    return dst


@pytest.fixture(scope="module")
def sampled(tmp_path_factory) -> Path:
    """sampled_workflows[0000] of the ci profile (the generator only; no executor call)."""
    base = tmp_path_factory.mktemp("outage") / "assets"
    res = _materialize(base, base.parent / "home", ["sampled_workflows"], _overrides("http://127.0.0.1:9/v1"))
    assert res.success, _failure_message(res)
    df = AssetStore(base).read_parquet("sampled_workflows", KEY)
    assert df.filter(pl.col("parse_status") == "ok").height >= 1, df["parse_status"].to_list()
    return base


@pytest.fixture(scope="module")
def reference(sampled, tmp_path_factory) -> dict:
    """execution_scores[0000] against a healthy endpoint: the table every disturbed run must reproduce."""
    d = tmp_path_factory.mktemp("reference")
    root = _copy(sampled, d / "assets")
    ep = Endpoint(d / "requests.log").start()
    try:
        t0 = time.monotonic()
        res = _materialize(root, d / "home", ["execution_scores"], _overrides(ep.url))
        wall = time.monotonic() - t0
    finally:
        ep.stop()
    assert res.success, _failure_message(res)
    df = _scores(root)
    calls = len(ep.requests())
    assert calls >= 2 and "executor_error" not in df["status"].to_list(), (calls, df["status"].to_list())
    assert cache_rows(root) == calls  # every call seeded (cacheable) and made once
    executed = df.filter(pl.col("runs") > 0)
    return {"hash": _frame_hash(df, root), "calls": calls, "wall_s": wall, "executed": executed.height,
            "max_calls": int(executed["llm_calls"].max())}


def test_endpoint_dies_mid_run_and_comes_back(sampled, reference, tmp_path):
    root = _copy(sampled, tmp_path / "assets")
    ep = Endpoint(tmp_path / "requests.log").start("--die-after", "1")  # dies when the 2nd call arrives
    down: list[float] = []

    def revive():  # the operator restarts the server a second after it died
        ep.p.wait()
        down.append(time.monotonic())
        time.sleep(1.0)
        ep.start()
        down.append(time.monotonic())

    reviver = threading.Thread(target=revive, daemon=True)
    reviver.start()
    try:
        t0 = time.monotonic()
        res = _materialize(root, tmp_path / "home", ["execution_scores"], _overrides(ep.url))
        wall = time.monotonic() - t0
        reviver.join(30)
    finally:
        ep.stop()
    assert len(down) == 2, "the endpoint never died: the run made fewer than 2 calls"
    assert res.success, _failure_message(res)
    df = _scores(root)
    assert "executor_error" not in df["status"].to_list(), df.select("status", "error").rows()
    assert _frame_hash(df, root) == reference["hash"]
    # the call that met the dead server is retried on the revived one: each call answered exactly once
    assert len(ep.requests()) == reference["calls"] == cache_rows(root)
    assert temp_files(root) == []
    record("executor endpoint dies mid execution_scores, back after 1 s", survived=True,
           outage_s=round(down[1] - down[0], 1), wall_s=round(wall, 1), reference_wall_s=round(reference["wall_s"], 1),
           executor_error_rows=0, rows_lost=0, rows_duplicated=0, executor_calls_repeated=0)


def test_endpoint_dies_for_good_asset_fails_then_rerun_makes_only_missing_calls(sampled, reference, tmp_path):
    root = _copy(sampled, tmp_path / "assets")
    ep = Endpoint(tmp_path / "requests.log").start("--die-after", "1")
    t0 = time.monotonic()
    res = _materialize(root, tmp_path / "home", ["execution_scores"], _overrides(ep.url))
    failed_s = time.monotonic() - t0
    assert not ep.alive()
    assert not res.success
    msg = _failure_message(res)
    assert msg.startswith("execution_scores:"), msg
    for want in (f"failed on the executor at endpoint {ep.url}", "execution.max_executor_error_rate = 0.5",
                 "nothing written", f"bring endpoint {ep.url} back", "rematerialize execution_scores[0000]",
                 "kept in the call cache", "only the missing calls", f"cannot reach executor endpoint at {ep.url}"):
        assert want in msg, (want, msg)
    assert not (root / "execution_scores" / f"{KEY}.parquet").exists()
    assert temp_files(root) == []
    received = len(ep.requests())  # logged on arrival; the request that killed the server is not
    assert received == 1
    # the cache holds the answered call (at most the calls received) and nothing else: no failure was stored
    answered = cache_rows(root)
    assert 1 <= answered <= received
    con = sqlite3.connect(f"file:{root / 'call_cache.sqlite'}?mode=ro", uri=True)
    texts = [r[0] for r in con.execute("select text from calls")]
    con.close()
    assert all(t.startswith("echo: ") for t in texts), texts  # the server's answers only
    # a dead endpoint fails fast: one call waits out the retry schedule (~30-47 s), not every call
    assert failed_s < 120, failed_s

    ep2 = Endpoint(tmp_path / "requests-after.log", port=ep.port).start()
    try:
        res2 = _materialize(root, tmp_path / "home2", ["execution_scores"], _overrides(ep2.url))
    finally:
        ep2.stop()
    assert res2.success, _failure_message(res2)
    df = _scores(root)
    assert _frame_hash(df, root) == reference["hash"]
    after = len(ep2.requests())
    assert after == reference["calls"] - answered  # only the missing calls
    assert cache_rows(root) == reference["calls"]
    record("executor endpoint dies for good mid execution_scores, rerun after it is back", survived=True,
           asset_failed=True, failed_after_s=round(failed_s, 1), rows_written_on_failure=0,
           executor_calls_before_death=answered, executor_calls_rerun=after,
           executor_calls_repeated=answered + after - reference["calls"], rows_lost=0, rows_duplicated=0)


def test_slow_endpoint_does_not_count_against_the_workflow_wall_clock(sampled, reference, tmp_path):
    root = _copy(sampled, tmp_path / "assets")
    wall_s, delay, timeout = 3.0, 4.0, 12.0  # each reply takes longer than a workflow may run, less than timeout_s
    ep = Endpoint(tmp_path / "requests.log").start("--delay", str(delay))
    try:
        t0 = time.monotonic()
        res = _materialize(root, tmp_path / "home", ["execution_scores"],
                           _overrides(ep.url, wall_s=wall_s, timeout_s=timeout))
        wall = time.monotonic() - t0
    finally:
        ep.stop()
    assert res.success, _failure_message(res)
    df = _scores(root)
    assert "timeout" not in df["status"].to_list(), df.select("status", "error").rows()
    assert _frame_hash(df, root) == reference["hash"]
    reqs = ep.requests()
    assert len(reqs) == reference["calls"]
    # the calls come from the parent's httpx client (the sandbox has no network and speaks only the RPC)
    assert {r["ua"].split("/")[0] for r in reqs} == {"python-httpx"}, {r["ua"] for r in reqs}
    slowest = float(df["wall_s"].max())
    assert slowest > wall_s  # a workflow ran past its wall limit, all of it in executor calls
    record("slow executor endpoint (reply 4 s > execution.wall_s 3 s, < executor.timeout_s 12 s)", survived=True,
           timeouts=0, slowest_workflow_s=round(slowest, 1), wall_s=round(wall, 1), rows_lost=0, rows_duplicated=0,
           executor_calls_repeated=0)


def test_dead_endpoint_fails_fast_after_one_full_retry_schedule():
    """The client side of "dies for good": the first call waits out its retries, the next ones make one attempt
    each while nothing listens, and the first call that gets through restores the full budget."""
    import asyncio

    sys.path.insert(0, str(FAKE.parent))
    from fake_openai_server import FakeOpenAIServer

    from spogw_dagster.contracts import SamplingParams
    from spogw_dagster.executors import ExecutorError
    from spogw_dagster.executors.openai_compat import OpenAICompatExecutor

    params = SamplingParams(temperature=0.0, max_tokens=8)
    srv = FakeOpenAIServer(model=MODEL).start()
    port = srv.port
    srv.stop()
    ex = OpenAICompatExecutor(f"http://127.0.0.1:{port}/v1", MODEL, api_key_env=None, max_retries=3,
                              backoff_base_s=0.01, backoff_max_s=0.02)

    async def go():
        msgs = [{"role": "user", "content": "hi"}]
        errors = []
        for _ in range(3):
            with pytest.raises(ExecutorError) as e:
                await ex.chat(msgs, params)
            errors.append(e.value)
        with FakeOpenAIServer(model=MODEL, port=port) as back:
            r = await ex.chat(msgs, params)
            assert r.text and back.request_count == 1
        await ex.aclose()  # (a stopped in-process server's handler threads still serve open keep-alive connections)
        with pytest.raises(ExecutorError) as again:  # down again: the full schedule again
            await ex.chat(msgs, params)
        await ex.aclose()
        return errors, again.value

    errors, again = asyncio.run(go())
    assert [e.attempts for e in errors] == [4, 1, 1]
    assert all(e.kind == "unreachable" and f"cannot reach executor endpoint at http://127.0.0.1:{port}/v1" in str(e)
               for e in errors)
    assert "one attempt per call until it answers" in str(errors[1])
    assert again.attempts == 4 and ex.fast_failures == 2


def test_report_on_a_dead_endpoint_fails_and_writes_nothing(undisturbed, tmp_path):
    """benchmark_report executes held-out workflows too: an outage there fails the step (it must not compare
    outages instead of policies), writing neither the report nor heldout_results."""
    from .conftest import copy_assets

    root = copy_assets(undisturbed["root"], tmp_path / "assets")
    for t in ("benchmark_report", "heldout_results"):
        (root / t / f"{KEY}.parquet").unlink()
    ep = Endpoint(tmp_path / "requests.log").start()
    ep.stop()  # a port that answered once and now refuses
    res = _materialize(root, tmp_path / "home", ["benchmark_report"], _overrides(ep.url))
    assert not res.success
    msg = _failure_message(res)
    assert msg.startswith("benchmark_report:"), msg
    for want in (f"failed on the executor at endpoint {ep.url}", "execution.max_executor_error_rate = 0.5",
                 "nothing written", "rematerialize benchmark_report[0000]", "only the missing calls"):
        assert want in msg, (want, msg)
    for t in ("benchmark_report", "heldout_results"):
        assert not (root / t / f"{KEY}.parquet").exists(), t
    assert temp_files(root) == []
    record("executor endpoint dead during benchmark_report", survived=True, asset_failed=True,
           rows_written_on_failure=0, rows_lost=0, rows_duplicated=0)
