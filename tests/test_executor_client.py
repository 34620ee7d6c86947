"""OpenAICompatExecutor against a local fake server: retries, backoff, timeouts, errors, concurrency."""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_openai_server import FakeOpenAIServer, error, ok, raw, slow  # noqa: E402

from spogw_dagster.executors import Executor, ExecutorError, MeteredExecutor, PromptTooLongError  # noqa: E402
from spogw_dagster.executors.openai_compat import OpenAICompatExecutor, parse_retry_after  # noqa: E402
from spogw_dagster.contracts import SamplingParams, Usage  # noqa: E402

SECRET = "sk-test-SECRET-0123456789abcdef"
MSGS = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is two plus two"}]


@pytest.fixture
def server():
    with FakeOpenAIServer() as srv:
        yield srv


@pytest.fixture(autouse=True)
def _api_key(monkeypatch):
    monkeypatch.setenv("SPOGW_TEST_KEY", SECRET)


def make(srv: FakeOpenAIServer, **kw) -> OpenAICompatExecutor:
    opts = dict(api_key_env="SPOGW_TEST_KEY", timeout_s=5.0, max_retries=3, backoff_base_s=0.01,
                backoff_max_s=0.05)
    opts.update(kw)
    return OpenAICompatExecutor(srv.base_url, srv.model, **opts)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_ok_roundtrip_sends_everything(server):
    exe = make(server)
    params = SamplingParams(temperature=0.7, top_p=0.9, max_tokens=32, seed=11, stop=("\n\n", "END"))
    r = await exe.chat(MSGS, params)
    await exe.aclose()
    assert r.text == "echo: what is two plus two"
    assert (r.prompt_tokens, r.completion_tokens) == (2 + 5, 6)
    assert r.model == "fake-model" and r.cached is False and r.latency_s > 0
    body = server.requests[0]
    assert body == {"model": "fake-model", "messages": MSGS, "temperature": 0.7, "top_p": 0.9,
                    "max_tokens": 32, "seed": 11, "stop": ["\n\n", "END"]}
    assert server.headers[0]["Authorization"] == f"Bearer {SECRET}"
    assert server.request_count == 1 and exe.retries == 0


async def test_unseeded_request_omits_seed_and_empty_stop(server):
    exe = make(server, api_key_env=None)
    await exe.chat(MSGS, SamplingParams())
    await exe.aclose()
    assert "seed" not in server.requests[0] and "stop" not in server.requests[0]
    assert "Authorization" not in server.headers[0]


def test_satisfies_protocol(server):
    exe = make(server)
    assert isinstance(exe, Executor)
    assert isinstance(MeteredExecutor(exe), Executor)


async def test_500_then_success_is_retried(server):
    server.script(error(500), error(502), "ok")
    exe = make(server)
    r = await exe.chat(MSGS, SamplingParams())
    await exe.aclose()
    assert r.text.startswith("echo:")
    assert server.request_count == 3 and exe.retries == 2


async def test_429_retry_after_is_waited_for(server):
    server.script(error(429, "slow down", retry_after="1"), "ok")
    exe = make(server, backoff_max_s=5.0)
    t0 = time.perf_counter()
    r = await exe.chat(MSGS, SamplingParams())
    elapsed = time.perf_counter() - t0
    await exe.aclose()
    assert r.text.startswith("echo:")
    assert server.request_count == 2
    assert elapsed >= 1.0
    assert elapsed < 3.0


async def test_retry_after_is_capped_by_backoff_max(server):
    server.script(error(503, "busy", retry_after="120"), "ok")
    exe = make(server, backoff_max_s=0.2)
    t0 = time.perf_counter()
    await exe.chat(MSGS, SamplingParams())
    elapsed = time.perf_counter() - t0
    await exe.aclose()
    assert server.request_count == 2
    assert 0.2 <= elapsed < 2.0


def test_parse_retry_after_forms():
    now = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC
    assert parse_retry_after("1") == 1.0
    assert parse_retry_after(" 2.5 ") == 2.5
    assert parse_retry_after("-3") == 0.0
    assert parse_retry_after("Tue, 14 Nov 2023 22:13:30 GMT", now=now) == pytest.approx(10.0)
    assert parse_retry_after("Tue, 14 Nov 2023 22:13:00 GMT", now=now) == 0.0  # in the past
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("") is None


async def test_http_date_retry_after_is_honoured(server):
    from email.utils import formatdate

    server.script(error(429, "later", retry_after=formatdate(time.time() + 2, usegmt=True)), "ok")
    exe = make(server, backoff_max_s=5.0)
    t0 = time.perf_counter()
    await exe.chat(MSGS, SamplingParams())
    elapsed = time.perf_counter() - t0
    await exe.aclose()
    # An HTTP date has 1 s resolution: the wait is between 1 and 2 s.
    assert server.request_count == 2 and 0.9 <= elapsed < 3.0


async def test_timeouts_are_retried_then_fail(server):
    server.default = slow(3.0)
    exe = make(server, timeout_s=0.2, max_retries=2)
    t0 = time.perf_counter()
    with pytest.raises(ExecutorError) as ei:
        await exe.chat(MSGS, SamplingParams())
    elapsed = time.perf_counter() - t0
    await exe.aclose()
    assert server.request_count == 3  # 1 + max_retries
    assert ei.value.attempts == 3 and ei.value.retryable
    assert "timed out after 0.2s" in str(ei.value) and "after 3 attempts" in str(ei.value)
    assert elapsed < 2.0  # the per-request timeout, not the server's 3 s


async def test_garbled_replies_are_retried(server):
    server.script("garbled", "no_choices", "ok")
    exe = make(server)
    r = await exe.chat(MSGS, SamplingParams())
    await exe.aclose()
    assert r.text == "echo: what is two plus two"
    assert server.request_count == 3


async def test_garbled_forever_fails_clearly(server):
    server.default = "garbled"
    exe = make(server, max_retries=1)
    with pytest.raises(ExecutorError, match="garbled reply: invalid JSON"):
        await exe.chat(MSGS, SamplingParams())
    await exe.aclose()
    assert server.request_count == 2


async def test_dropped_connection_is_retried(server):
    server.script("drop", "ok")
    exe = make(server)
    r = await exe.chat(MSGS, SamplingParams())
    await exe.aclose()
    assert r.text.startswith("echo:") and server.request_count == 2


async def test_400_is_not_retried_and_names_status_and_message(server):
    server.script(error(400, "max_tokens must be at least 1"))
    exe = make(server)
    with pytest.raises(ExecutorError) as ei:
        await exe.chat(MSGS, SamplingParams(max_tokens=0))
    await exe.aclose()
    assert server.request_count == 1
    e = ei.value
    assert e.status_code == 400 and e.attempts == 1 and not e.retryable
    assert "HTTP 400" in str(e) and "max_tokens must be at least 1" in str(e)


async def test_401_hint_names_the_env_var(server):
    server.script(error(401, "invalid api key"))
    exe = make(server)
    with pytest.raises(ExecutorError, match=r"\$SPOGW_TEST_KEY") as ei:
        await exe.chat(MSGS, SamplingParams())
    await exe.aclose()
    assert server.request_count == 1 and SECRET not in str(ei.value)


async def test_api_key_never_in_errors_or_repr(server):
    # A (misbehaving) server that echoes the key back in its error bodies.
    exe = make(server, max_retries=1)
    server.script(error(400, f"bad key {SECRET}"))
    with pytest.raises(ExecutorError) as e1:
        await exe.chat(MSGS, SamplingParams())
    server.default = error(500, f"upstream said Bearer {SECRET}")
    with pytest.raises(ExecutorError) as e2:
        await exe.chat(MSGS, SamplingParams())
    await exe.aclose()
    for e in (e1.value, e2.value):
        assert SECRET not in str(e) and SECRET not in repr(e)
        assert "***" in str(e)
        assert e.__cause__ is None and (e.__context__ is None or e.__suppress_context__)
    assert SECRET not in repr(exe)


async def test_unreachable_endpoint_gives_clear_error():
    url = f"http://127.0.0.1:{free_port()}/v1"
    exe = OpenAICompatExecutor(url, "m", api_key_env=None, max_retries=1, backoff_base_s=0.01,
                               backoff_max_s=0.02)
    with pytest.raises(ExecutorError) as ei:
        await exe.check()
    msg = str(ei.value)
    assert f"cannot reach executor endpoint at {url}" in msg
    assert "vllm serve / llama.cpp server" in msg and "--executor-url" in msg
    with pytest.raises(ExecutorError, match="cannot reach executor endpoint") as ei2:
        await exe.chat(MSGS, SamplingParams())
    assert ei2.value.attempts == 2
    await exe.aclose()


async def test_check_and_list_models(server):
    exe = make(server)
    assert await exe.list_models() == ["fake-model"]
    assert await exe.check(require_model=True) == ["fake-model"]
    other = OpenAICompatExecutor(server.base_url, "other-model", api_key_env=None)
    assert await other.check() == ["fake-model"]  # only a warning by default
    with pytest.raises(ExecutorError, match="not among the models served"):
        await other.check(require_model=True)
    wrong = OpenAICompatExecutor(server.base_url.removesuffix("/v1"), "m", api_key_env=None)
    with pytest.raises(ExecutorError, match="HTTP 404"):
        await wrong.list_models()
    for e in (exe, other, wrong):
        await e.aclose()


async def test_missing_usage_counts_zero_and_is_recorded(server):
    server.script("no_usage")
    exe = make(server)
    r = await exe.chat(MSGS, SamplingParams())
    await exe.aclose()
    assert r.text.startswith("echo:") and (r.prompt_tokens, r.completion_tokens) == (0, 0)
    assert exe.missing_usage_calls == 1


async def test_concurrency_is_bounded(server):
    server.default = ok(delay_s=0.05)
    exe = make(server, max_concurrency=3)
    results = await asyncio.gather(*[
        exe.chat([{"role": "user", "content": f"q{i}"}], SamplingParams()) for i in range(20)
    ])
    await exe.aclose()
    assert [r.text for r in results] == [f"echo: q{i}" for i in range(20)]
    assert server.request_count == 20
    assert server.max_in_flight <= 3
    assert server.max_in_flight == 3  # and the limit is actually used


async def test_concurrency_bound_holds_during_retries(server):
    server.default = ok(delay_s=0.03)
    server.script(*[error(500)] * 6)
    exe = make(server, max_concurrency=2)
    await asyncio.gather(*[exe.chat([{"role": "user", "content": f"q{i}"}], SamplingParams())
                           for i in range(8)])
    await exe.aclose()
    assert server.request_count == 14 and server.max_in_flight <= 2


def test_usable_from_successive_event_loops(server):
    exe = make(server)
    for _ in range(2):
        r = asyncio.run(exe.chat(MSGS, SamplingParams()))
        assert r.text.startswith("echo:")
    asyncio.run(exe.aclose())
    assert server.request_count == 2


async def test_metered_executor_sums_per_run(server):
    shared = make(server, max_retries=0)
    run_a, run_b = MeteredExecutor(shared), MeteredExecutor(shared)
    await run_a.chat([{"role": "user", "content": "one two three"}], SamplingParams())  # 3 in, 4 out
    await run_a.chat([{"role": "user", "content": "four"}], SamplingParams())  # 1 in, 2 out
    await run_b.chat([{"role": "user", "content": "five six"}], SamplingParams())  # 2 in, 3 out
    server.script(error(400))
    with pytest.raises(ExecutorError):
        await run_b.chat(MSGS, SamplingParams())
    assert (run_a.usage.llm_calls, run_a.usage.prompt_tokens, run_a.usage.completion_tokens) == (2, 4, 6)
    assert (run_b.usage.llm_calls, run_b.usage.prompt_tokens, run_b.usage.completion_tokens) == (1, 2, 3)
    assert run_a.failed_calls == 0 and run_b.failed_calls == 1
    assert run_a.usage.cached_calls == 0 and run_a.usage.latency_s > 0
    total = Usage()
    total.merge(run_a.usage)
    total.merge(run_b.usage)
    assert (total.llm_calls, total.prompt_tokens, total.completion_tokens) == (3, 6, 9)
    await run_a.aclose()  # does not close the shared executor
    await shared.chat(MSGS, SamplingParams())
    await shared.aclose()


async def test_cancellation_propagates_and_is_not_retried(server):
    server.default = slow(2.0)
    exe = make(server, timeout_s=5.0)
    metered = MeteredExecutor(exe)
    task = asyncio.create_task(metered.chat(MSGS, SamplingParams()))
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await exe.aclose()
    assert server.request_count == 1 and exe.retries == 0
    assert metered.failed_calls == 0 and metered.usage.llm_calls == 0


# ---------------------------------------------------------------- prompts longer than the context


@pytest.mark.parametrize(
    "status,body",
    [
        # vLLM
        (400, {"object": "error", "message": "This model's maximum context length is 2048 tokens. However, you "
               "requested 9000 tokens (8000 in the messages, 1000 in the completion). Please reduce the length "
               "of the messages or completion.", "type": "BadRequestError", "param": None, "code": 400}),
        # OpenAI
        (400, {"error": {"message": "Please reduce the length of the messages.", "type": "invalid_request_error",
                         "param": "messages", "code": "context_length_exceeded"}}),
        # llama.cpp server
        (400, {"error": {"code": 400, "message": "the request exceeds the available context size, try "
                         "increasing it", "type": "exceed_context_size_error"}}),
        (413, {"error": {"message": "prompt is too long: 300000 tokens > 200000 maximum"}}),
    ],
)
async def test_context_overflow_is_prompt_too_long_and_not_retried(server, status, body):
    server.script(raw(status, body))
    exe = make(server)
    with pytest.raises(PromptTooLongError) as ei:
        await exe.chat(MSGS, SamplingParams())
    await exe.aclose()
    assert server.request_count == 1
    e = ei.value
    assert isinstance(e, ExecutorError) and e.status_code == status and e.attempts == 1 and not e.retryable
    assert "prompt too long" in str(e)


async def test_other_400_is_not_prompt_too_long(server):
    server.script(error(400, "max_tokens must be at least 1"))
    exe = make(server)
    with pytest.raises(ExecutorError) as ei:
        await exe.chat(MSGS, SamplingParams())
    await exe.aclose()
    assert not isinstance(ei.value, PromptTooLongError)


# ---------------------------------------------------------------- odd replies never escape as other errors


def _reply(content, usage=None):
    body = {"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant",
                                                                                          "content": content}}]}
    if usage is not None:
        body["usage"] = usage
    return body


async def test_content_parts_with_null_text(server):
    server.script(raw(200, _reply([{"type": "text", "text": None}, {"type": "text", "text": "hi"},
                                   {"type": "image_url"}, "junk"], {"prompt_tokens": 3, "completion_tokens": 1})))
    exe = make(server)
    r = await exe.chat(MSGS, SamplingParams())
    await exe.aclose()
    assert r.text == "hi" and (r.prompt_tokens, r.completion_tokens) == (3, 1) and server.request_count == 1


def _raw_text(text: str):
    from fake_openai_server import Behaviour

    return Behaviour("raw", status=200, body_json=text)


@pytest.mark.parametrize(
    "behaviour",
    [
        raw(200, _reply([{"type": "text", "text": 5}])),  # a part's text is not a string
        raw(200, {"choices": [None]}),
        _raw_text("[" * 100_000 + "]" * 100_000),  # too deep for the JSON parser: RecursionError, not ValueError
    ],
    ids=["part-text-int", "choice-null", "deep-json"],
)
async def test_garbled_replies_are_retried_then_fail_as_executor_error(server, behaviour):
    server.default = behaviour
    exe = make(server, max_retries=1)
    with pytest.raises(ExecutorError, match="garbled") as ei:
        await exe.chat(MSGS, SamplingParams())
    await exe.aclose()
    assert ei.value.retryable and ei.value.attempts == 2 and server.request_count == 2


async def test_unexpected_parse_failure_is_a_retryable_garbled_reply(server, monkeypatch):
    calls = []

    def broken(self, resp):
        calls.append(1)
        if len(calls) == 1:
            raise KeyError("surprise")
        return "fine", 1, 1, True

    monkeypatch.setattr(OpenAICompatExecutor, "_parse_reply", broken)
    exe = make(server)
    r = await exe.chat(MSGS, SamplingParams())
    await exe.aclose()
    assert r.text == "fine" and server.request_count == 2 and exe.retries == 1


async def test_only_executor_error_escapes_chat(server, monkeypatch):
    async def boom(self, *a, **k):
        raise TypeError("unforeseen")

    monkeypatch.setattr(OpenAICompatExecutor, "_attempt", boom)
    exe = make(server)
    with pytest.raises(ExecutorError, match="unforeseen"):
        await exe.chat(MSGS, SamplingParams())
    await exe.aclose()


def test_time_split_sums_the_endpoint_clients_under_every_wrapper():
    """`time_split_of` finds each endpoint client under the cache's and attribution's `inner`, an embedded
    executor's per-worker clients and a fleet's members, each counted once."""
    from types import SimpleNamespace

    from spogw_dagster.executors.base import TIME_SPLIT_KEYS, time_split_of

    def client(calls, decode_s):
        return SimpleNamespace(time_split={**dict.fromkeys(TIME_SPLIT_KEYS, 0), "calls": calls, "decode_s": decode_s})

    a, b, c = client(2, 1.5), client(3, 2.0), client(1, 0.25)
    embedded = SimpleNamespace(_clients={"w0": a, "w1": b})
    fleet = SimpleNamespace(endpoints=[SimpleNamespace(client=c), SimpleNamespace(client=a)])  # a: seen already
    wrapped = SimpleNamespace(inner=SimpleNamespace(inner=embedded, extra=fleet))
    assert time_split_of(wrapped)["calls"] == 5 and time_split_of(wrapped)["decode_s"] == 3.5
    both = SimpleNamespace(inner=embedded, endpoints=fleet.endpoints)
    assert time_split_of(both)["calls"] == 6 and time_split_of(both)["decode_s"] == 3.75
    assert time_split_of(SimpleNamespace())["calls"] == 0


def test_stored_calls_read_back_every_request_in_order(tmp_path):
    """What the bench scripts replay: each stored call's messages, sampling params (stop included) and text."""
    from spogw_dagster.contracts import ChatResult, SamplingParams
    from spogw_dagster.executors.cache import CallCache, canonical_request, stored_calls

    path = tmp_path / "calls.sqlite"
    p1 = SamplingParams(temperature=0.7, top_p=0.95, max_tokens=64, seed=3, stop=("\n```\n",))
    p2 = SamplingParams(temperature=0.0, top_p=1.0, max_tokens=8, seed=None)
    with CallCache(path) as cache:
        for i, (msgs, p) in enumerate(((["a"], p1), (["b"], p2))):
            m = [{"role": "user", "content": msgs[0]}]
            cache.put(f"k{i}", ChatResult(text=f"t{i}", prompt_tokens=5, completion_tokens=7 + i, latency_s=0.1,
                                          model="m"), request=canonical_request("m", m, p))
        cache.put("k2", ChatResult(text="no request", prompt_tokens=1, completion_tokens=1, latency_s=0.0, model="m"))
    calls = stored_calls(path)
    assert [(c.messages[0]["content"], c.text, c.completion_tokens) for c in calls] == [("a", "t0", 7), ("b", "t1", 8)]
    assert calls[0].params == p1 and calls[1].params.max_tokens == 8 and calls[1].params.stop == ()
