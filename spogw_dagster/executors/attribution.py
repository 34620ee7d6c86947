"""Who caused a failed call: the endpoint, or the request's own content?

A failed executor call used to mean "our infrastructure failed" (`executor_error`), and such rows leave
training groups and metrics. But a request can fail because of what it holds: a string the server's chat
template or tokenizer chokes on (HTTP 400/500), a prompt so long that the reply times out, an input that
crashes llama.cpp. A workflow writes that content, so it could make its own bad rows disappear.

`FaultAttributingExecutor` decides by experiment. When a call fails (after the inner executor's own
retries), it sends a *control request*: the same sampling settings (so that a setting the endpoint refuses,
say a `max_tokens` above its limit, fails the control too), a short fixed prompt. If the control
fails too, the endpoint is down: the original error stands (`executor_error`). If the control succeeds, the
endpoint is up and the original request is sent once more (a transient failure, e.g. a crash the runtime
recovered from, or an overload that has passed, then simply succeeds); if it fails again, the call raises
`RequestFaultError`, the request's fault, which callers charge to the workflow. A definitive rejection (HTTP
4xx, or a request the client could not even send) is not re-sent: it is the answer to this request, and
the control shows the endpoint takes others. A timeout is re-sent like a 5xx: it is the failure most likely
to be the endpoint's (load), so it is charged to the request only when it repeats after a good control.
The time all this takes counts toward the workflow's operator-time budget (`workflow/runtime.py`).

Concurrent failures share one control request (one that ended after they failed), so an outage costs one
control per burst, not one per call. The control never goes through the call cache (wrap this below
`CachingExecutor`): a cached reply would prove nothing about the endpoint now.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any

from spogw_dagster.contracts import ChatResult, SamplingParams
from spogw_dagster.executors.base import Executor, ExecutorError, RequestFaultError

__all__ = ["CONTROL_MESSAGES", "FaultAttributingExecutor"]

log = logging.getLogger(__name__)

CONTROL_MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": "Reply with the single word: ready"}]


class FaultAttributingExecutor:
    """Wrap `inner`; see the module docstring. Counters: `controls` (control requests sent), `request_faults`
    (calls blamed on their request), `endpoint_faults` (failures the control confirmed as the endpoint's),
    `recovered` (calls that failed, then succeeded when re-sent after a good control)."""

    def __init__(self, inner: Executor) -> None:
        self.inner = inner
        self.controls = 0
        self.request_faults = 0
        self.endpoint_faults = 0
        self.recovered = 0
        self._lock: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last_control: tuple[float, str | None] | None = None  # (ended at, None if it succeeded else why)

    @property
    def model(self) -> str:  # type: ignore[override]
        return self.inner.model

    def __getattr__(self, name: str) -> Any:  # the inner executor's own counters and helpers (check, probe, ...)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    async def chat(self, messages: list[dict], params: SamplingParams) -> ChatResult:
        t0 = time.monotonic()
        try:
            return await self.inner.chat(messages, params)
        except RequestFaultError:
            raise
        except ExecutorError as first:
            failed_at = time.monotonic()
            down = await self._control(params, failed_at)
            if down is not None:
                self.endpoint_faults += 1
                raise
            if first.kind == "crash" or first.retryable:  # may have been transient: the request once more
                try:
                    result = await self.inner.chat(messages, params)
                except RequestFaultError:
                    raise
                except ExecutorError as again:
                    raise self._blame(again, "failed twice") from None
                self.recovered += 1
                # the failed attempts and the control served this call too: the workflow's budget counts them
                return dataclasses.replace(result, latency_s=max(result.latency_s, time.monotonic() - t0))
            raise self._blame(first, "failed") from None

    def _blame(self, e: ExecutorError, how: str) -> RequestFaultError:
        self.request_faults += 1
        log.warning("executor %s: a request %s while a control request succeeded: charged to the request (%s)",
                    self.model, how, e)
        return RequestFaultError(
            f"the executor {how} on this request ({e}) but answered a control request with the same settings: "
            "the request's content is the cause", status_code=e.status_code, attempts=e.attempts, kind=e.kind)

    async def _control(self, params: SamplingParams, failed_at: float) -> str | None:
        """None when a control request that ended after `failed_at` succeeded, else why it failed."""
        loop = asyncio.get_running_loop()
        if self._lock is None or self._loop is not loop:
            self._lock, self._loop = asyncio.Lock(), loop
        async with self._lock:
            # a control that ended after this failure says how the endpoint was since (calls that failed
            # while it was in flight wait here and share it)
            if self._last_control is not None and self._last_control[0] >= failed_at:
                return self._last_control[1]
            self.controls += 1
            try:  # the same settings: a setting the endpoint refuses (max_tokens, stop) fails the control too
                await self.inner.chat(CONTROL_MESSAGES, params)
                why = None
            except ExecutorError as e:
                why = str(e) or type(e).__name__
            self._last_control = (time.monotonic(), why)
            return why

    def request_faults_of(self) -> dict[str, int]:
        """The counters, for asset metadata."""
        return {"control_requests": self.controls, "request_faults": self.request_faults,
                "endpoint_faults": self.endpoint_faults, "recovered_calls": self.recovered}

    async def aclose(self) -> None:
        await self.inner.aclose()

    def __repr__(self) -> str:
        return f"FaultAttributingExecutor({self.inner!r})"
