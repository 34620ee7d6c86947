"""Who caused a failed executor call (`executors.attribution.FaultAttributingExecutor`), against a local fake
OpenAI-compatible server whose failures depend on the request's content or on its own state.

A request the server fails on while it serves a control request is the request's fault (`RequestFaultError`,
charged to the workflow); a server that fails the control too is down (a plain `ExecutorError`, the outage
path); a failure that does not repeat when the request is sent again after a good control was transient."""

from __future__ import annotations

import asyncio

import pytest

from spogw_dagster.contracts import SamplingParams
from spogw_dagster.executors.attribution import CONTROL_MESSAGES, FaultAttributingExecutor
from spogw_dagster.executors.base import ExecutorError, RequestFaultError
from spogw_dagster.executors.openai_compat import OpenAICompatExecutor
from tests.fake_openai_server import FakeOpenAIServer, error

PARAMS = SamplingParams(temperature=0.7, max_tokens=64, seed=3)
POISON = [{"role": "user", "content": "please POISON the server"}]
FINE = [{"role": "user", "content": "what is 6 times 7?"}]


def _chokes_on(behaviour):
    """A server that answers `behaviour` to any request whose last message holds POISON."""
    return lambda body: behaviour if "POISON" in str(body["messages"][-1]["content"]) else None


def _client(server: FakeOpenAIServer, retries: int = 1) -> FaultAttributingExecutor:
    return FaultAttributingExecutor(OpenAICompatExecutor(server.base_url, server.model, api_key_env=None,
                                                         max_retries=retries, backoff_base_s=0.01,
                                                         backoff_max_s=0.02, timeout_s=5))


@pytest.mark.parametrize("status", [400, 422])
async def test_a_definitive_rejection_of_one_request_is_the_requests_fault(status):
    with FakeOpenAIServer(behaviour_fn=_chokes_on(error(status, "template error: unexpected character"))) as srv:
        ex = _client(srv)
        with pytest.raises(RequestFaultError, match="answered a control request") as info:
            await ex.chat(POISON, PARAMS)
        assert info.value.status_code == status and not info.value.retryable
        # one rejected request (4xx is not retried, nor re-sent), one control with the same settings
        assert srv.request_count == 2
        control = srv.requests[1]
        assert control["messages"] == CONTROL_MESSAGES
        assert (control["max_tokens"], control["temperature"], control["seed"]) == (64, 0.7, 3)
        assert (ex.controls, ex.request_faults, ex.endpoint_faults) == (1, 1, 0)
        assert (await ex.chat(FINE, PARAMS)).text.startswith("echo:")  # other requests are served


async def test_a_5xx_that_repeats_for_one_request_only_is_the_requests_fault():
    with FakeOpenAIServer(behaviour_fn=_chokes_on(error(500, "tokenizer crashed"))) as srv:
        ex = _client(srv, retries=1)
        with pytest.raises(RequestFaultError, match="failed twice"):
            await ex.chat(POISON, PARAMS)
        # 2 attempts, the control, then the request once more (2 attempts): 5 requests
        assert srv.request_count == 5 and ex.controls == 1 and ex.request_faults == 1


async def test_a_transient_failure_is_retried_after_a_good_control_and_succeeds():
    with FakeOpenAIServer() as srv:
        srv.script(error(503), error(503))  # the outage ends after the original's two attempts
        ex = _client(srv, retries=1)
        res = await ex.chat(FINE, PARAMS)
        assert res.text.startswith("echo: what is 6")
        assert (ex.controls, ex.recovered, ex.request_faults) == (1, 1, 0)
        assert srv.request_count == 4  # 2 failed attempts, the control, the request again


@pytest.mark.parametrize("down", ["503", "400", "refused"])
async def test_an_endpoint_that_fails_the_control_too_is_down_not_the_requests_fault(down):
    """Every request fails (an outage, a setting the endpoint refuses, nothing listening): a plain
    ExecutorError, so the run is an executor_error and the outage rules apply."""
    srv = FakeOpenAIServer(default=down if down != "refused" else "ok").start()
    ex = _client(srv, retries=1)
    if down == "refused":
        srv.stop()
    try:
        with pytest.raises(ExecutorError) as info:
            await ex.chat(POISON, PARAMS)
        assert not isinstance(info.value, RequestFaultError)
        assert (ex.controls, ex.endpoint_faults, ex.request_faults) == (1, 1, 0)
    finally:
        srv.stop()


async def test_concurrent_failures_in_an_outage_share_a_control():
    with FakeOpenAIServer(default=error(503, delay_s=0.2)) as srv:
        ex = _client(srv, retries=0)
        results = await asyncio.gather(*(ex.chat(FINE, PARAMS) for _ in range(8)), return_exceptions=True)
        assert all(isinstance(r, ExecutorError) and not isinstance(r, RequestFaultError) for r in results)
        # a failure that lands after the shared control ended needs a control of its own (a busy machine may
        # stagger the 8): a burst costs one or two controls, not one each
        assert ex.controls <= 2 and ex.endpoint_faults == 8
        assert srv.request_count == 8 + ex.controls


async def test_a_timeout_is_charged_to_the_request_only_when_it_repeats_after_a_good_control():
    from tests.fake_openai_server import slow

    def client():
        return FaultAttributingExecutor(OpenAICompatExecutor(srv.base_url, srv.model, api_key_env=None, max_retries=0,
                                                             timeout_s=0.5))

    with FakeOpenAIServer(behaviour_fn=_chokes_on(slow(3.0))) as srv:  # this prompt always takes 3 s
        ex = client()
        t0 = asyncio.get_running_loop().time()
        with pytest.raises(RequestFaultError, match="failed twice") as info:
            await ex.chat(POISON, PARAMS)
        assert info.value.kind == "timeout" and srv.request_count == 3  # the request, the control, the request
        assert asyncio.get_running_loop().time() - t0 < 3.0
    with FakeOpenAIServer() as srv:
        srv.script(slow(3.0))  # one slow reply (a passing overload), then the endpoint is quick again
        ex = client()
        assert (await ex.chat(FINE, PARAMS)).text.startswith("echo:")
        assert (ex.recovered, ex.request_faults) == (1, 0)


async def test_a_recovered_call_reports_the_time_it_really_took():
    """The failed attempts and the control count toward the workflow's operator-time budget (latency_s)."""
    with FakeOpenAIServer() as srv:
        srv.script(error(503, delay_s=0.3), error(503, delay_s=0.3))
        ex = _client(srv, retries=1)
        res = await ex.chat(FINE, PARAMS)
        assert ex.recovered == 1 and res.latency_s >= 0.6
