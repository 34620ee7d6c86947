"""The embedded executor: the bundled SmolLM2 GGUF in a supervised llama.cpp server child.

- a multi-token prompt with default batch settings gets an answer (the AMX builds died exactly here);
- a child killed by SIGSEGV mid-call is an `ExecutorError` (kind "crash") naming the cause and the fix, the
  child is restarted and the next call is answered, and this process (the step) lives on;
- a runtime that crashes on its self-check fails fast with that message (a fake binary stands in for a
  crashing build: what is tested is our supervision around it);
- concurrent calls are answered side by side (both workers busy at once), with the same texts as one at a time;
- cancellation, two event loops in turn, and prompts over the context window.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
import time

import httpx
import pytest

from spogw_dagster.contracts import ChatResult, SamplingParams
from spogw_dagster.executors import ExecutorError, PromptTooLongError
from spogw_dagster.executors.base import time_split_of
from spogw_dagster.executors.factory import make_executor
from spogw_dagster.executors.embedded import EmbeddedExecutor, LlamaServer, RuntimeCrashError
from spogw_dagster.paths import smollm2_gguf

pytestmark = pytest.mark.model

LONG_PROMPT = ("Here is a Python function.\n\ndef add_all(xs):\n    total = 0\n    for x in xs:\n        total += x\n"
               "    return total\n\n" * 12 + "Explain in one sentence what add_all returns.")


@pytest.fixture(scope="module")
def embedded():
    return EmbeddedExecutor()


def test_multi_token_prompt_with_default_batching_gets_an_answer(embedded):
    before = time_split_of(embedded)
    r = asyncio.run(embedded.chat([{"role": "user", "content": LONG_PROMPT}],
                                  SamplingParams(temperature=0.0, max_tokens=24, seed=0)))
    assert r.prompt_tokens > 300 and r.completion_tokens > 0 and r.text.strip()
    # llama.cpp's own timings of the call: its prefill and decode tokens are the usage's, with seconds for each
    split = {k: v - before[k] for k, v in time_split_of(embedded).items()}
    assert split["calls"] == 1 and split["decode_tokens"] == r.completion_tokens
    assert 0 < split["prefill_tokens"] <= r.prompt_tokens and split["prefill_s"] > 0 and split["decode_s"] > 0
    assert split["prefill_s"] + split["decode_s"] <= split["served_s"] + 0.05
    assert r.model == embedded.model and embedded.model.startswith("SmolLM2-135M-Instruct.Q4_1@")
    info = embedded.runtime_info()
    assert "AVX2" in info["cpu_features_used"] and not any(f.startswith("AMX") for f in info["cpu_features_used"])
    assert info["workers"] == (os.cpu_count() or 1) and info["threads"] == 1


def test_sigsegv_mid_call_is_a_crash_error_and_the_child_restarts(tmp_path):
    srv = LlamaServer(smollm2_gguf(), n_ctx=2048, threads=1)
    ex = EmbeddedExecutor(servers=[srv])
    try:
        pid = srv.pid

        async def crash_during_call():
            task = asyncio.create_task(ex.chat([{"role": "user", "content": "Write a long story about a castle."}],
                                               SamplingParams(temperature=0.7, max_tokens=400, seed=3)))
            await asyncio.sleep(0.5)
            os.kill(pid, signal.SIGSEGV)
            with pytest.raises(ExecutorError) as ei:
                await task
            after = await ex.chat([{"role": "user", "content": "Say hi."}], SamplingParams(max_tokens=4, seed=1))
            return ei.value, after

        err, after = asyncio.run(crash_during_call())
        assert isinstance(err, RuntimeCrashError) and err.kind == "crash"
        msg = str(err)
        assert "died of SIGSEGV during a call" in msg and "native crash in llama.cpp" in msg
        assert "Fix: rebuild the portable runtime: `spogw runtime install --force`" in msg
        assert isinstance(after, ChatResult) and after.completion_tokens > 0
        assert srv.pid != pid and srv.generation == 2
        assert ex.runtime_info()["restarts"] == 1 and ex.crash_errors == 1
    finally:
        asyncio.run(ex.aclose())
        srv.stop()


_CRASHING_BINARY = textwrap.dedent("""\
    #!{python}
    # Stands in for a llama.cpp build that loads the model and then dies of SIGSEGV on its first batched decode.
    import os, signal, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    port = int(sys.argv[sys.argv.index("--port") + 1])
    print("system_info: n_threads = 2 | CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 1 | AMX_INT8 = 1 | REPACK = 1 |",
          flush=True)
    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b'{{"status":"ok"}}')
        def do_POST(self):
            os.kill(os.getpid(), signal.SIGSEGV)
        def log_message(self, *a):
            pass
    HTTPServer(("127.0.0.1", port), H).serve_forever()
""")


def test_runtime_that_crashes_on_its_self_check_fails_fast(tmp_path, monkeypatch):
    fake = tmp_path / "llama-server"
    fake.write_text(_CRASHING_BINARY.format(python=sys.executable))
    fake.chmod(0o755)
    monkeypatch.setenv("SPOGW_LLAMA_SERVER", str(fake))
    srv = LlamaServer(smollm2_gguf(), slots=2, threads=1, ready_timeout_s=30)
    t0 = time.monotonic()
    with pytest.raises(RuntimeCrashError) as ei:
        srv.start()
    assert time.monotonic() - t0 < 30
    msg = str(ei.value)
    assert "died of SIGSEGV on its self-check (one multi-token prompt)" in msg
    assert "native crash in llama.cpp" in msg and "unset SPOGW_LLAMA_SERVER" in msg
    assert srv.pid is None  # nothing left running


def test_concurrent_calls_run_side_by_side_with_the_texts_of_one_at_a_time():
    """Two single-thread workers answer concurrent calls together; each call is computed alone on one thread,
    so its text is the one a single worker gives when the calls come one after another (reproducible reruns)."""
    workers = [LlamaServer(smollm2_gguf(), n_ctx=2048, threads=1) for _ in range(2)]
    both = EmbeddedExecutor(servers=workers)
    # shared prefixes of different lengths, as operator prompts share their instructions: a call's text must not
    # depend on which call ran before it on the worker
    calls = [([{"role": "user", "content": "You are a careful poet. " * (1 + i % 3) + f"Write a poem about {i}."}],
              SamplingParams(temperature=0.7, max_tokens=48, seed=i)) for i in range(6)]
    busy_peak = 0

    async def watch(stop: asyncio.Event):
        nonlocal busy_peak
        async with httpx.AsyncClient() as c:
            while not stop.is_set():
                busy = 0
                for w in workers:
                    slots = (await c.get(f"{w.url}/slots", timeout=5)).json()
                    busy += sum(1 for sl in slots if sl.get("is_processing"))
                busy_peak = max(busy_peak, busy)
                await asyncio.sleep(0.05)

    async def together():
        stop = asyncio.Event()
        w = asyncio.create_task(watch(stop))
        rs = await asyncio.gather(*[both.chat(m, p) for m, p in calls])
        stop.set()
        await w
        return rs

    async def one_at_a_time():  # in reverse order, on one worker
        one = EmbeddedExecutor(servers=[workers[1]])
        return [await one.chat(m, p) for m, p in reversed(calls)][::-1]

    try:
        rs = asyncio.run(together())
        assert busy_peak == 2, f"at most {busy_peak} worker busy at once: calls were served one at a time"
        assert both.runtime_info()["served_per_worker"] == [3, 3]
        alone = asyncio.run(one_at_a_time())
        assert [r.text for r in rs] == [r.text for r in alone]
        assert all(r.completion_tokens > 0 for r in rs)
    finally:
        for w in workers:
            w.stop()


def test_cancelled_call_and_a_second_event_loop(embedded):
    msgs = [{"role": "user", "content": "Write a very long story about dragons and castles."}]

    async def first():
        t = asyncio.create_task(embedded.chat(msgs, SamplingParams(temperature=0.8, max_tokens=300, seed=1)))
        await asyncio.sleep(0.3)
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        return await embedded.chat([{"role": "user", "content": "Say hi."}], SamplingParams(max_tokens=8, seed=1))

    async def second():
        return await asyncio.gather(*[embedded.chat([{"role": "user", "content": "hi"}],
                                                    SamplingParams(max_tokens=4, seed=i)) for i in range(2)])

    assert asyncio.run(first()).completion_tokens > 0
    assert all(isinstance(r, ChatResult) for r in asyncio.run(second()))


def test_prompt_longer_than_the_context_is_prompt_too_long(embedded):
    huge = [{"role": "user", "content": "dragon castle knight " * 3500}]  # ~10k tokens > 8192 per slot

    async def main():
        with pytest.raises(PromptTooLongError) as ei:
            await embedded.chat(huge, SamplingParams(max_tokens=4))
        assert not ei.value.retryable
        return await embedded.chat([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=4, seed=1))

    assert asyncio.run(main()).completion_tokens > 0  # the server is still usable


def test_the_fast_mode_runs_its_own_servers_and_keys_its_calls_apart(tmp_path):
    """`reproducible=False`: the best runtime variant built for this CPU (the portable one where none is) with
    n-gram speculation, named in `numerics`; the call cache keys its calls apart from the reproducible mode's, so
    a text computed one way never answers for the other."""
    fast = EmbeddedExecutor(workers=1, reproducible=False)
    try:
        assert "--spec-type ngram-simple" in fast.numerics and fast.numerics.split(":")[0] in ("portable", "avx512")
        assert EmbeddedExecutor(workers=1).numerics == ""
        r = asyncio.run(fast.chat([{"role": "user", "content": LONG_PROMPT}],
                                  SamplingParams(temperature=0.0, max_tokens=24, seed=0)))
        assert r.completion_tokens > 0 and r.text.strip()
    finally:
        asyncio.run(fast.aclose())
    cache = tmp_path / "calls.sqlite"
    for reproducible in (True, False):
        ex = make_executor(None, None, cache_path=cache, workers=1, reproducible=reproducible)
        try:
            asyncio.run(ex.chat([{"role": "user", "content": "Say hi."}], SamplingParams(max_tokens=4, seed=1)))
        finally:
            asyncio.run(ex.aclose())
            ex.cache.close()
    import sqlite3

    con = sqlite3.connect(cache)
    assert con.execute("select count(*) from calls").fetchone()[0] == 2  # one entry per mode, not one hit
    con.close()


@pytest.fixture(autouse=True)
def _no_fast_workers_left():
    """The fast mode's shared workers are this module's own: later tests (and assets' runtime metadata, which
    lists every embedded server of the process) see only the reproducible mode's."""
    yield
    import spogw_dagster.executors.embedded as emb

    with emb._SERVERS_LOCK:
        fast = [k for k in emb._SERVERS if k[-1]]  # the key's last part: the servers' extra flags
        workers = [w for k in fast for w in emb._SERVERS.pop(k)]
    for w in workers:
        w.stop()
