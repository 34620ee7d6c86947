"""CallCache and CachingExecutor: hits, persistence, what is never cached, keys, accounting."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_openai_server import FakeOpenAIServer, error, ok  # noqa: E402

from spogw_dagster.executors import (  # noqa: E402
    CachingExecutor,
    CallCache,
    Executor,
    ExecutorError,
    MeteredExecutor,
    cache_key,
    is_cacheable,
)
from spogw_dagster.executors.openai_compat import OpenAICompatExecutor  # noqa: E402
from spogw_dagster.contracts import ChatResult, SamplingParams  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SECRET = "sk-cache-test-SECRET-987654321"
MSGS = [{"role": "user", "content": "name a prime number"}]
GREEDY = SamplingParams(temperature=0.0, max_tokens=16)


@pytest.fixture
def server():
    # A counter in the answer: a cache hit must return the *stored* text, not a fresh equal one.
    with FakeOpenAIServer(answer_fn=lambda body, n: f"answer #{n} to {body['messages'][-1]['content']}") as srv:
        yield srv


@pytest.fixture(autouse=True)
def _api_key(monkeypatch):
    monkeypatch.setenv("SPOGW_CACHE_TEST_KEY", SECRET)


def inner(srv: FakeOpenAIServer, **kw) -> OpenAICompatExecutor:
    opts = dict(api_key_env="SPOGW_CACHE_TEST_KEY", timeout_s=5.0, max_retries=1, backoff_base_s=0.01,
                backoff_max_s=0.02)
    opts.update(kw)
    return OpenAICompatExecutor(srv.base_url, srv.model, **opts)


async def test_hit_returns_identical_text_without_a_request(server, tmp_path):
    cache = CallCache(tmp_path / "calls.sqlite")
    exe = CachingExecutor(inner(server), cache)
    assert isinstance(exe, Executor)
    first = await exe.chat(MSGS, GREEDY)
    second = await exe.chat(MSGS, GREEDY)
    await exe.aclose()
    assert first.text == "answer #1 to name a prime number" and not first.cached
    assert second.text == first.text and second.cached
    assert (second.prompt_tokens, second.completion_tokens) == (first.prompt_tokens, first.completion_tokens)
    assert second.latency_s == 0.0 and second.model == "fake-model"
    assert server.request_count == 1
    assert (exe.hits, exe.misses, exe.uncacheable) == (1, 1, 0)
    assert len(cache) == 1
    cache.close()


async def test_cache_persists_across_instances(server, tmp_path):
    path = tmp_path / "sub" / "calls.sqlite"  # parent folder is created
    with CallCache(path) as c1:
        e1 = CachingExecutor(inner(server), c1)
        r1 = await e1.chat(MSGS, GREEDY)
        await e1.aclose()
    with CallCache(path) as c2:
        e2 = CachingExecutor(inner(server), c2)
        r2 = await e2.chat(MSGS, GREEDY)
        await e2.aclose()
    assert r2.cached and r2.text == r1.text
    assert server.request_count == 1


async def test_greedy_calls_share_one_entry_whatever_their_seed(server, tmp_path):
    """ScoreFlow scores a workflow as the mean of 3 runs at T = 0, each run with its own executor seed: greedy
    decoding draws nothing, so the three runs' calls are one endpoint request. A sampled call keeps its seed."""
    cache = CallCache(tmp_path / "c.sqlite")
    exe = CachingExecutor(inner(server), cache)
    runs = [await exe.chat(MSGS, dataclasses.replace(GREEDY, seed=s)) for s in (11, 12, 13)]
    assert [r.cached for r in runs] == [False, True, True] and len({r.text for r in runs}) == 1
    assert server.request_count == 1 and len(cache) == 1
    hot = [await exe.chat(MSGS, SamplingParams(temperature=0.7, max_tokens=16, seed=s)) for s in (11, 12)]
    await exe.aclose()
    assert not any(r.cached for r in hot) and server.request_count == 3 and len(cache) == 3
    cache.close()


async def test_failures_are_not_cached(server, tmp_path):
    cache = CallCache(tmp_path / "c.sqlite")
    exe = CachingExecutor(inner(server), cache)
    server.script(error(400, "nope"))
    with pytest.raises(ExecutorError):
        await exe.chat(MSGS, GREEDY)
    server.script(error(500), error(500))  # retries exhausted (max_retries=1)
    with pytest.raises(ExecutorError):
        await exe.chat(MSGS, GREEDY)
    assert len(cache) == 0
    r = await exe.chat(MSGS, GREEDY)
    await exe.aclose()
    assert not r.cached and r.text == "answer #4 to name a prime number"
    assert server.request_count == 4 and len(cache) == 1


async def test_unseeded_sampling_is_never_cached(server, tmp_path):
    cache = CallCache(tmp_path / "c.sqlite")
    exe = CachingExecutor(inner(server), cache)
    hot = SamplingParams(temperature=0.8, max_tokens=16)
    a = await exe.chat(MSGS, hot)
    b = await exe.chat(MSGS, hot)
    assert not a.cached and not b.cached and a.text != b.text
    assert server.request_count == 2 and exe.uncacheable == 2 and len(cache) == 0
    seeded = dataclasses.replace(hot, seed=7)
    c = await exe.chat(MSGS, seeded)
    d = await exe.chat(MSGS, seeded)
    await exe.aclose()
    assert not c.cached and d.cached and c.text == d.text
    assert server.request_count == 3
    assert is_cacheable(GREEDY) and is_cacheable(seeded) and not is_cacheable(hot)


def test_key_changes_with_every_input():
    base_params = SamplingParams(temperature=0.5, top_p=0.9, max_tokens=64, seed=1, stop=("\n",))
    base = cache_key("m", MSGS, base_params)
    variants = [
        cache_key("m2", MSGS, base_params),
        cache_key("m", [{"role": "user", "content": "name a prime number!"}], base_params),
        cache_key("m", [{"role": "system", "content": "name a prime number"}], base_params),
        cache_key("m", MSGS + [{"role": "assistant", "content": ""}], base_params),
        cache_key("m", MSGS, base_params, namespace="other-server"),
        cache_key("m", MSGS, dataclasses.replace(base_params, temperature=0.6)),
        cache_key("m", MSGS, dataclasses.replace(base_params, top_p=0.95)),
        cache_key("m", MSGS, dataclasses.replace(base_params, max_tokens=65)),
        cache_key("m", MSGS, dataclasses.replace(base_params, seed=2)),  # sampled: the seed is part of the call
        cache_key("m", MSGS, dataclasses.replace(base_params, seed=None)),
        cache_key("m", MSGS, dataclasses.replace(base_params, stop=())),
        cache_key("m", MSGS, dataclasses.replace(base_params, stop=("\n", "END"))),
    ]
    assert base not in variants and len(set(variants)) == len(variants)
    # Canonical: dict key order and int-vs-float spellings of the same number do not matter.
    reordered = [{"content": "name a prime number", "role": "user"}]
    assert cache_key("m", reordered, base_params) == base
    assert cache_key("m", MSGS, SamplingParams(temperature=0, top_p=1)) == \
        cache_key("m", MSGS, SamplingParams(temperature=0.0, top_p=1.0))
    # The key is sha256 of the documented canonical form: JSON with sorted keys, no whitespace, numbers
    # normalised (floats as floats, ints as ints), the key version v = 1 and the namespace; written out here.
    canonical = ('{"messages":[{"content":"name a prime number","role":"user"}],"model":"m","ns":"",'
                 '"params":{"max_tokens":64,"seed":1,"stop":["\\n"],"temperature":0.5,"top_p":0.9},"v":1}')
    assert base == hashlib.sha256(canonical.encode("utf-8")).hexdigest()
    greedy = ('{"messages":[{"content":"name a prime number","role":"user"}],"model":"m","ns":"http://h:1/v1",'
              '"params":{"max_tokens":512,"seed":null,"stop":[],"temperature":0.0,"top_p":1.0},"v":1}')
    assert cache_key("m", MSGS, SamplingParams(temperature=0, top_p=1), namespace="http://h:1/v1") == \
        hashlib.sha256(greedy.encode("utf-8")).hexdigest()


def test_key_ignores_what_does_not_change_the_answer():
    """Equal requests spelled differently give the same key: a stop list vs tuple, a fresh copy of the
    messages, int vs float numbers; and the key never depends on the executor's transport settings."""
    p = SamplingParams(temperature=0.5, top_p=0.9, max_tokens=64, seed=1, stop=("\n",))
    k = cache_key("m", MSGS, p)
    assert cache_key("m", [dict(m) for m in MSGS], p) == k
    assert cache_key("m", MSGS, dataclasses.replace(p, stop=["\n"])) == k
    assert cache_key("m", MSGS, dataclasses.replace(p, max_tokens=64.0, seed=1.0)) == k
    assert cache_key("m", MSGS, p, namespace="") == k


async def test_transport_settings_do_not_change_the_key(server, tmp_path):
    """Timeouts, retries and back-off say how to reach the endpoint, not what it answers: an executor with
    other settings on the same endpoint and model is served the stored answer."""
    with CallCache(tmp_path / "c.sqlite") as cache:
        a = CachingExecutor(inner(server), cache)
        b = CachingExecutor(inner(server, timeout_s=9.0, max_retries=3, backoff_base_s=0.05), cache)
        ra, rb = await a.chat(MSGS, GREEDY), await b.chat(MSGS, GREEDY)
        await a.aclose()
        await b.aclose()
    assert not ra.cached and rb.cached and rb.text == ra.text == "answer #1 to name a prime number"
    assert server.request_count == 1


async def test_api_key_is_not_part_of_the_stored_request(server, tmp_path):
    path = tmp_path / "c.sqlite"
    with CallCache(path) as cache:
        exe = CachingExecutor(inner(server), cache)
        await exe.chat(MSGS, GREEDY)
        await exe.aclose()
    assert SECRET.encode() not in path.read_bytes()
    wal = path.with_name(path.name + "-wal")
    if wal.exists():
        assert SECRET.encode() not in wal.read_bytes()


async def test_concurrent_identical_calls_are_coalesced(server, tmp_path):
    server.default = ok(delay_s=0.1)
    cache = CallCache(tmp_path / "c.sqlite")
    exe = CachingExecutor(inner(server), cache)
    results = await asyncio.gather(*[exe.chat(MSGS, GREEDY) for _ in range(5)])
    await exe.aclose()
    assert server.request_count == 1
    assert len({r.text for r in results}) == 1
    assert sum(r.cached for r in results) == 4 and (exe.hits, exe.misses) == (4, 1)


async def test_coalesced_waiters_retry_when_the_leader_fails(server, tmp_path):
    server.script(error(400, "first fails", delay_s=0.1))
    cache = CallCache(tmp_path / "c.sqlite")
    exe = CachingExecutor(inner(server), cache)
    results = await asyncio.gather(*[exe.chat(MSGS, GREEDY) for _ in range(3)], return_exceptions=True)
    await exe.aclose()
    assert isinstance(results[0], ExecutorError)
    ok_results = [r for r in results[1:] if isinstance(r, ChatResult)]
    assert len(ok_results) == 2 and len({r.text for r in ok_results}) == 1
    assert server.request_count == 2  # the failed leader, then one follower; the other one hits


async def test_accounting_cold_then_warm(server, tmp_path):
    cache = CallCache(tmp_path / "c.sqlite")
    shared = CachingExecutor(inner(server), cache)
    prompts = [[{"role": "user", "content": "a b c"}], [{"role": "user", "content": "d e"}]]

    async def run() -> MeteredExecutor:
        m = MeteredExecutor(shared)
        for p in prompts:
            await m.chat(p, GREEDY)
        return m

    cold, warm = await run(), await run()
    await shared.aclose()
    # answers are "answer #n to <prompt>": 3 + words(prompt) tokens
    assert (cold.usage.llm_calls, cold.usage.cached_calls) == (2, 0)
    assert (cold.usage.prompt_tokens, cold.usage.completion_tokens) == (5, 3 + 3 + 3 + 2)
    assert cold.usage.latency_s > 0
    assert (warm.usage.llm_calls, warm.usage.cached_calls) == (2, 2)
    assert (warm.usage.prompt_tokens, warm.usage.completion_tokens) == (5, 11)  # same token cost
    assert warm.usage.latency_s == 0.0
    assert server.request_count == 2


def test_safe_across_processes(tmp_path):
    path = tmp_path / "shared.sqlite"
    CallCache(path).close()  # create the file first
    writer = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO)!r})
        from spogw_dagster.executors.cache import CallCache
        from spogw_dagster.contracts import ChatResult
        tag = sys.argv[1]
        c = CallCache({str(path)!r})
        for i in range(150):
            c.put(f"{{tag}}-{{i}}", ChatResult(text=f"{{tag}} {{i}}", prompt_tokens=i, completion_tokens=1))
            c.put(f"shared-{{i}}", ChatResult(text=f"shared {{i}}"))
            assert c.get(f"{{tag}}-{{i}}").text == f"{{tag}} {{i}}"
        c.close()
    """)
    procs = [subprocess.Popen([sys.executable, "-c", writer, tag]) for tag in ("p1", "p2", "p3")]
    assert [p.wait(timeout=60) for p in procs] == [0, 0, 0]
    with CallCache(path) as c:
        assert len(c) == 3 * 150 + 150
        assert c.get("p2-149").prompt_tokens == 149 and c.get("shared-3").text == "shared 3"
        mode = c._c().execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_corrupt_file_gives_clear_error(tmp_path):
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"this is not a database" * 100)
    with pytest.raises(RuntimeError, match="cannot be opened as a SQLite database"):
        CallCache(bad)


def test_memory_cache_and_first_write_wins():
    with CallCache(":memory:") as c:
        c.put("k", ChatResult(text="first", prompt_tokens=1, completion_tokens=2, model="m"))
        c.put("k", ChatResult(text="second"))
        assert c.get("k") == ("first", 1, 2, "m") and "k" in c and "x" not in c and len(c) == 1
    with pytest.raises(RuntimeError, match="closed"):
        c.get("k")


# ---------------------------------------------------------------- factory: endpoints get their own keys


async def test_make_executor_keeps_endpoints_with_the_same_model_name_apart(tmp_path):
    from spogw_dagster.executors.factory import make_executor

    path = tmp_path / "calls.sqlite"
    with FakeOpenAIServer(answer_fn=lambda body, n: "weights A") as a, \
            FakeOpenAIServer(answer_fn=lambda body, n: "weights B") as b:
        assert a.model == b.model
        ex_a = make_executor(a.base_url, a.model, cache_path=path, api_key_env=None)
        ex_b = make_executor(b.base_url + "/", b.model, cache_path=path, api_key_env=None)
        key_a = cache_key(ex_a.model, MSGS, GREEDY, ex_a.namespace)
        key_b = cache_key(ex_b.model, MSGS, GREEDY, ex_b.namespace)
        assert key_a != key_b
        assert ex_a.namespace == a.base_url and ex_b.namespace == b.base_url  # trailing slash normalised
        assert (await ex_a.chat(MSGS, GREEDY)).text == "weights A"
        rb = await ex_b.chat(MSGS, GREEDY)
        assert rb.text == "weights B" and not rb.cached  # not served A's entry
        assert b.request_count == 1
        again = make_executor(a.base_url, a.model, cache_path=path, api_key_env=None)
        ra = await again.chat(MSGS, GREEDY)
        assert ra.cached and ra.text == "weights A" and a.request_count == 1
        for ex in (ex_a, ex_b, again):
            await ex.aclose()
            ex.cache.close()
