"""The executor fleet (spogw_dagster/executors/fleet.py): the balancing choice, health checks, failover and
exact accounting, against local fake servers; then two real llama.cpp servers of the bundled model, one
killed with SIGKILL mid-run."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_openai_server import FakeOpenAIServer, error, ok  # noqa: E402

from spogw_dagster.contracts import SamplingParams  # noqa: E402
from spogw_dagster.executors import CachingExecutor, CallCache, ExecutorError, MeteredExecutor  # noqa: E402
from spogw_dagster.executors.fleet import FleetExecutor, fleet_namespace  # noqa: E402
from spogw_dagster.executors.openai_compat import OpenAICompatExecutor  # noqa: E402

GREEDY = SamplingParams(temperature=0.0, max_tokens=16)


def msgs(i: int) -> list[dict]:
    return [{"role": "user", "content": f"question number {i}"}]


def fleet(*servers: FakeOpenAIServer, **kw) -> FleetExecutor:
    opts = dict(api_key_env=None, timeout_s=5.0, max_retries=4, backoff_base_s=0.01, backoff_max_s=0.05,
                probe_interval_s=0.1, probe_interval_max_s=0.4, probe_timeout_s=1.0)
    opts.update(kw)
    return FleetExecutor([s.base_url for s in servers], servers[0].model, **opts)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- the balancing choice


def test_pick_takes_the_healthy_endpoint_with_the_fewest_in_flight():
    f = FleetExecutor(["http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1", "http://127.0.0.1:3/v1"], "m",
                      api_key_env=None)
    a, b, c = f.endpoints
    a.in_flight, b.in_flight, c.in_flight = 3, 1, 2
    assert f.pick() is b and b.in_flight == 2  # counted as in flight at once
    assert f.pick() is c  # now 3, 2, 2: tie between b and c broken by fewer picks so far -> c
    assert c.in_flight == 3 and c.picks == 1
    b.up = False  # down endpoints get nothing, however idle
    b.in_flight = 0
    assert f.pick() is a  # a 3 (0 picks) vs c 3 (1 pick)
    assert f.pick(exclude={0}) is c  # a call avoids an endpoint that already failed it ...
    a.up = c.up = False
    assert f.pick() is None  # ... and with all down there is nothing to pick
    c.up = True
    assert f.pick(exclude={2}) is c  # ... unless it is the only healthy one left


def test_idle_fleet_is_used_round_robin():
    f = FleetExecutor(["http://h1/v1", "http://h2/v1", "http://h3/v1"], "m", api_key_env=None)
    order = []
    for _ in range(6):
        ep = f.pick()
        order.append(ep.index)
        ep.in_flight -= 1  # the request finished
    assert order == [0, 1, 2, 0, 1, 2]


def test_fleet_rejects_bad_lists():
    with pytest.raises(ValueError, match="at least one"):
        FleetExecutor([], "m")
    with pytest.raises(ValueError, match="twice"):
        FleetExecutor(["http://a/v1", "http://a/v1/"], "m")
    assert fleet_namespace(["http://b/v1/", "http://a/v1"]) == "http://a/v1 http://b/v1"


async def test_concurrent_calls_spread_by_outstanding_requests():
    with FakeOpenAIServer(default=ok(0.3)) as a, FakeOpenAIServer(default=ok(0.3)) as b:
        f = fleet(a, b)
        rs = await asyncio.gather(*(f.chat(msgs(i), GREEDY) for i in range(6)))
        assert [r.text for r in rs] == [f"echo: question number {i}" for i in range(6)]
        assert (a.request_count, b.request_count) == (3, 3)
        assert (a.max_in_flight, b.max_in_flight) == (3, 3)
        # a slow endpoint accumulates outstanding requests, so the fast one takes more of the work
        a.default, b.default = ok(0.4), ok(0.02)
        a.reset(), b.reset()
        sem = asyncio.Semaphore(4)

        async def one(i):
            async with sem:
                return await f.chat(msgs(100 + i), GREEDY)

        await asyncio.gather(*(one(i) for i in range(24)))
        assert a.request_count + b.request_count == 24
        assert b.request_count >= 3 * a.request_count, (a.request_count, b.request_count)
        await f.aclose()


# ---------------------------------------------------------------- health and failover


async def test_dropped_requests_fail_over_and_are_counted_once(tmp_path):
    with FakeOpenAIServer(default="drop") as a, FakeOpenAIServer() as b:
        f = fleet(a, b, probe_interval_s=30.0, probe_interval_max_s=30.0)
        cache = CachingExecutor(f, CallCache(tmp_path / "c.sqlite"), namespace=f.namespace)
        meters = [MeteredExecutor(cache) for _ in range(10)]
        rs = await asyncio.gather(*(m.chat(msgs(i), GREEDY) for i, m in enumerate(meters)))
        assert all(r.text.startswith("echo: question number") for r in rs)
        sa, sb = f.stats()
        assert sa["up"] is False and sa["marked_down"] == 1 and "connection" in sa["last_error"]
        assert sa["served"] == 0 and sb["served"] == 10 == b.request_count  # every call served once, by b
        # the 10 calls started together: 5 went to a; all 5 died there and were retried on b, and once a
        # was down it got nothing more
        assert a.request_count == 5 == sa["failed"] and f.failovers == 5
        assert f.calls == 10 and cache.misses == 10 and cache.hits == 0
        assert sum(m.usage.llm_calls for m in meters) == 10 and all(m.failed_calls == 0 for m in meters)
        await cache.aclose()


async def test_repeated_5xx_marks_down_after_the_threshold():
    with FakeOpenAIServer(default=error(500)) as a, FakeOpenAIServer() as b:
        f = fleet(a, b, failure_threshold=3, probe_interval_s=30.0, probe_interval_max_s=30.0)
        for i in range(8):  # one at a time: ties go round-robin, so a is tried until it is marked down
            assert (await f.chat(msgs(i), GREEDY)).text == f"echo: question number {i}"
        assert a.request_count == 3 and f.endpoints[0].up is False
        assert b.request_count == 8 and f.stats()[1]["served"] == 8
        await f.aclose()


async def test_busy_429_fails_over_without_marking_down():
    with FakeOpenAIServer(default=error(429, "slow down")) as a, FakeOpenAIServer() as b:
        f = fleet(a, b)
        for i in range(4):
            await f.chat(msgs(i), GREEDY)
        assert f.endpoints[0].up is True and f.endpoints[0].marked_down == 0
        assert b.request_count == 4 and f.failovers == a.request_count
        await f.aclose()


async def test_a_dead_endpoint_is_reprobed_and_comes_back():
    port = free_port()
    b = FakeOpenAIServer().start()
    f = FleetExecutor([f"http://127.0.0.1:{port}/v1", b.base_url], b.model, api_key_env=None, max_retries=3,
                      probe_interval_s=0.1, probe_interval_max_s=0.2, probe_timeout_s=1.0)
    try:
        await f.chat(msgs(0), GREEDY)  # nothing listens on `port`: refused -> down, served by b
        assert f.endpoints[0].up is False and "unreachable" in f.endpoints[0].last_error
        a = FakeOpenAIServer(port=port).start()
        try:
            deadline = time.monotonic() + 5
            while not f.endpoints[0].up and time.monotonic() < deadline:
                await f.chat(msgs(1), GREEDY)  # each call starts the probes that are due
                await asyncio.sleep(0.05)
            assert f.endpoints[0].up, f.stats()
            assert a.other_requests >= 1  # the probe: GET /models
            await asyncio.gather(*(f.chat(msgs(10 + i), GREEDY) for i in range(4)))
            assert a.request_count >= 2  # back in the rotation
        finally:
            a.stop()
    finally:
        await f.aclose()
        b.stop()


async def test_all_down_fails_with_a_clear_error():
    ports = [free_port(), free_port()]
    f = FleetExecutor([f"http://127.0.0.1:{p}/v1" for p in ports], "m", api_key_env=None, max_retries=3,
                      backoff_max_s=0.05, probe_interval_s=0.05, probe_interval_max_s=0.1)
    t0 = time.monotonic()
    with pytest.raises(ExecutorError, match="fleet of 2 endpoint") as ei:
        await f.chat(msgs(0), GREEDY)
    assert time.monotonic() - t0 < 5
    assert ei.value.retryable and ei.value.attempts == 4 and ei.value.kind == "unreachable"
    await f.aclose()


async def test_a_bad_request_is_not_retried_and_not_a_health_signal():
    with FakeOpenAIServer(default="400") as a, FakeOpenAIServer(default="400") as b:
        f = fleet(a, b)
        with pytest.raises(ExecutorError, match="HTTP 400") as ei:
            await f.chat(msgs(0), GREEDY)
        assert not ei.value.retryable and a.request_count + b.request_count == 1
        assert all(ep.up for ep in f.endpoints)
        await f.aclose()


def test_make_executor_and_settings_build_a_fleet(tmp_path):
    from spogw_dagster.executors.attribution import FaultAttributingExecutor
    from spogw_dagster.executors.factory import make_executor
    from spogw_dagster.pipeline.settings import ConfigValidationError, load_config

    ex = make_executor(["http://b:1/v1/", "http://a:1/v1"], "m", cache_path=tmp_path / "c.sqlite",
                       api_key_env=None)
    assert isinstance(ex.inner.inner, FleetExecutor) and ex.namespace == "http://a:1/v1 http://b:1/v1"
    one = make_executor(["http://a:1/v1"], "m", use_cache=False, api_key_env=None)
    assert isinstance(one, FaultAttributingExecutor)  # every executor tells a request's fault from its own
    assert isinstance(one.inner, OpenAICompatExecutor)  # a fleet of one is the plain client (its own retries)
    ex.cache.close()
    cfg = load_config("ci", overrides={"executor": {"urls": ["http://a:1/v1", "http://b:1/v1"], "model": "m"}})
    assert cfg.executor.endpoints() == ["http://a:1/v1", "http://b:1/v1"]
    assert load_config("ci", overrides={"executor": {"url": "http://a:1/v1", "model": "m"}}).executor.endpoints() \
        == ["http://a:1/v1"]
    assert "urls" not in load_config("ci").canonical()["executor"]  # unset: old configs keep their hash
    with pytest.raises(ConfigValidationError, match="executor.url and executor.urls are both set"):
        load_config("ci", overrides={"executor": {"url": "http://a:1/v1", "urls": ["http://b:1/v1"], "model": "m"}})
    with pytest.raises(ConfigValidationError, match="lists an endpoint twice"):
        load_config("ci", overrides={"executor": {"urls": ["http://a:1/v1", "http://a:1/v1/"], "model": "m"}})
    with pytest.raises(ConfigValidationError, match="executor.urls needs executor.model"):
        load_config("ci", overrides={"executor": {"urls": ["http://a:1/v1"]}})


# ---------------------------------------------------------------- two real llama.cpp servers, one killed


def _start_llama_server(gguf: Path, port: int, log: Path) -> subprocess.Popen:
    from spogw_dagster.executors.llama_runtime import find_runtime

    with open(log, "wb") as fh:
        return subprocess.Popen(
            [str(find_runtime().binary), "--model", str(gguf), "--host", "127.0.0.1", "--port", str(port),
             "--threads", "1", "--ctx-size", "1024", "--parallel", "1", "--no-webui"],
            stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)


def _wait_ready(procs: list[subprocess.Popen], ports: list[int], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    pending = set(ports)
    while pending and time.monotonic() < deadline:
        for p, port in zip(procs, ports):
            assert p.poll() is None, f"llama.cpp server on port {port} exited with {p.returncode}"
            if port in pending:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1).status_code == 200:
                        pending.discard(port)
                except httpx.HTTPError:
                    pass
        time.sleep(0.3)
    assert not pending, f"llama.cpp servers on {sorted(pending)} did not come up in {timeout_s}s"


def _served_200(log: Path) -> int:
    """Completed requests, by llama-server's own log (one timing summary per finished task)."""
    return len(re.findall(r"print_timing: .* total time =", log.read_text(errors="replace")))


@pytest.mark.model
def test_two_llama_servers_one_killed_mid_run_loses_nothing(tmp_path):
    from spogw_dagster.paths import smollm2_gguf

    gguf = smollm2_gguf()
    ports = [free_port(), free_port()]
    logs = [tmp_path / "server_a.log", tmp_path / "server_b.log"]
    procs = [_start_llama_server(gguf, port, log) for port, log in zip(ports, logs)]
    try:
        _wait_ready(procs, ports)
        n_calls = 24
        params = SamplingParams(temperature=0.7, max_tokens=12, seed=7)

        async def run_pass(kill_b_after: int | None):
            f = FleetExecutor([f"http://127.0.0.1:{p}/v1" for p in ports], "smollm2", api_key_env=None,
                              max_concurrency=2, timeout_s=30, max_retries=6, backoff_base_s=0.05,
                              backoff_max_s=0.5, probe_interval_s=0.5, probe_interval_max_s=2.0)
            cache = CachingExecutor(f, CallCache(tmp_path / "calls.sqlite"), namespace=f.namespace)
            meters = [MeteredExecutor(cache) for _ in range(n_calls)]
            killed_with_in_flight = None

            async def killer():
                nonlocal killed_with_in_flight
                while f.endpoints[1].served < kill_b_after:
                    await asyncio.sleep(0.01)
                killed_with_in_flight = f.endpoints[1].in_flight
                os.kill(procs[1].pid, signal.SIGKILL)

            tasks = [asyncio.create_task(m.chat(msgs(i), params)) for i, m in enumerate(meters)]
            k = asyncio.create_task(killer()) if kill_b_after is not None else None
            results = await asyncio.gather(*tasks)
            if k is not None:
                await k
            await cache.aclose()
            cache.cache.close()
            return f, cache, meters, results, killed_with_in_flight

        f, cache, meters, results, in_flight = asyncio.run(run_pass(kill_b_after=3))
        procs[1].wait(10)
        assert procs[1].returncode == -signal.SIGKILL
        a, b = f.stats()
        # all rows present, each logical call counted once
        assert len(results) == n_calls and all(r.text.strip() for r in results)
        assert in_flight and in_flight > 0, "server b was killed with calls in flight"
        assert b["up"] is False and b["marked_down"] == 1 and b["failed"] >= 1 and b["served"] >= 3
        assert a["served"] + b["served"] == n_calls == f.calls == cache.misses and cache.hits == 0
        assert sum(m.usage.llm_calls for m in meters) == n_calls and sum(m.failed_calls for m in meters) == 0
        assert f.failovers >= b["failed"]
        # what the servers say they answered: a (alive) exactly what we counted; b at most one reply more
        # (a reply it wrote as it died and we never received: that call was served again by a, correctly)
        assert _served_200(logs[0]) == a["served"]
        assert b["served"] <= _served_200(logs[1]) <= b["served"] + 1
        # the same calls again: all from the cache, no request to the surviving server
        f2, cache2, meters2, results2, _ = asyncio.run(run_pass(kill_b_after=None))
        assert [r.text for r in results2] == [r.text for r in results]
        assert cache2.hits == n_calls and cache2.misses == 0 and f2.calls == 0
        assert sum(m.usage.cached_calls for m in meters2) == n_calls
        assert _served_200(logs[0]) == a["served"]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(10)
