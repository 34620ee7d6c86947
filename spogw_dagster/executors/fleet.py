"""A fleet of OpenAI-compatible endpoints serving one model: load balancing, health checks, failover.

    fleet = FleetExecutor(["http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1"], "Qwen/Qwen2.5-7B-Instruct")
    shared = CachingExecutor(fleet, CallCache(path), namespace=fleet.namespace)

One `chat` is one *logical* call; it returns one result or raises one `ExecutorError`, however many
requests it took, so the call cache and the meters above it count it once.

- **Balancing**: each request goes to the healthy endpoint with the fewest requests in flight (this
  fleet's own, waiting for the endpoint's concurrency slot included); ties go to the endpoint picked
  least often, so an idle fleet is used round-robin.
- **Health**: an endpoint is marked *down* at once when a request cannot connect (refused), is dropped
  mid-request (the server died), or times out; and after `failure_threshold` consecutive 5xx or garbled
  replies. 408/425/429 (busy, alive) do not count. A down endpoint gets no requests; it is re-probed
  (GET /models; any answer below 500 means alive) after `probe_interval_s`, doubling on each failed
  probe up to `probe_interval_max_s`; a probe that succeeds puts it back.
- **Failover**: a logical call whose request failed in a retryable way (above, and 408/425/429) is
  retried at once on another healthy endpoint that has not failed it yet; when there is none it backs
  off (exponential with jitter, honouring Retry-After) or, with every endpoint down, waits for the next
  probe. `max_retries` bounds the retries of one logical call over the whole fleet. A non-retryable
  reply (4xx, `PromptTooLongError`) is the request's fault: raised at once, and no health signal.

Retry mechanics are tenacity's (`AsyncRetrying`); each endpoint is an `OpenAICompatExecutor` with
`max_retries=0`, so the fleet decides where every retry goes.

Counters: `calls` (logical calls), `failovers` (requests retried after a failure), and per endpoint
(`stats()`) `served` (successful replies), `failed` (failed requests), `in_flight`, `up`, `marked_down`.
Sum of `served` == logical calls that succeeded.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import httpx
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt

from spogw_dagster.contracts import ChatResult, SamplingParams
from spogw_dagster.executors.base import ExecutorError
from spogw_dagster.executors.openai_compat import OpenAICompatExecutor

__all__ = ["FleetExecutor", "Endpoint", "fleet_namespace"]

log = logging.getLogger(__name__)

# failure kinds (ExecutorError.kind) that mark an endpoint down at once
_DEAD_KINDS = frozenset({"unreachable", "connection", "timeout"})


def fleet_namespace(base_urls: Sequence[str]) -> str:
    """The call-cache namespace of a fleet: its normalised base URLs, sorted (order does not matter; one URL
    gives that URL, as a single endpoint's namespace)."""
    return " ".join(sorted({u.rstrip("/") for u in base_urls}))


@dataclass
class Endpoint:
    """One member of the fleet and its health."""

    index: int
    client: OpenAICompatExecutor
    up: bool = True
    in_flight: int = 0
    picks: int = 0
    served: int = 0
    failed: int = 0
    consecutive_failures: int = 0
    marked_down: int = 0
    next_probe_at: float = 0.0
    probe_backoff_s: float = 0.0
    last_error: str = ""
    probe_task: asyncio.Task | None = field(default=None, repr=False)

    @property
    def base_url(self) -> str:
        return self.client.base_url


class _Failover(Exception):
    """One failed request of a logical call, worth retrying elsewhere (internal; never escapes `chat`)."""

    def __init__(self, message: str, *, error: ExecutorError | None = None, all_down: bool = False) -> None:
        super().__init__(message)
        self.error = error
        self.all_down = all_down


class FleetExecutor:
    """Several OpenAI-compatible endpoints serving the same model, used as one `Executor` (module docstring).

    `max_concurrency` and `timeout_s` apply per endpoint. Safe to share between asyncio tasks of one event
    loop (the balancing choice happens without an await between reading and updating the counts).
    """

    def __init__(
        self,
        base_urls: Sequence[str],
        model: str,
        api_key_env: str | None = "OPENAI_API_KEY",
        max_concurrency: int = 8,
        timeout_s: float = 120.0,
        max_retries: int = 6,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 30.0,
        *,
        failure_threshold: int = 3,
        probe_interval_s: float = 1.0,
        probe_interval_max_s: float = 30.0,
        probe_timeout_s: float = 5.0,
        connect_timeout_s: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        urls = [str(u).rstrip("/") for u in base_urls]
        if not urls:
            raise ValueError("a fleet needs at least one endpoint URL")
        dupes = sorted({u for u in urls if urls.count(u) > 1})
        if dupes:
            raise ValueError(f"executor fleet lists an endpoint twice: {', '.join(dupes)}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if failure_threshold < 1:
            raise ValueError(f"failure_threshold must be >= 1, got {failure_threshold}")
        if probe_interval_s <= 0 or probe_interval_max_s < probe_interval_s:
            raise ValueError("need 0 < probe_interval_s <= probe_interval_max_s")
        self.model = model
        self.max_retries = int(max_retries)
        self.backoff_base_s = float(backoff_base_s)
        self.backoff_max_s = float(backoff_max_s)
        self.failure_threshold = int(failure_threshold)
        self.probe_interval_s = float(probe_interval_s)
        self.probe_interval_max_s = float(probe_interval_max_s)
        self.probe_timeout_s = float(probe_timeout_s)
        self.endpoints = [
            Endpoint(i, OpenAICompatExecutor(u, model, api_key_env=api_key_env, max_concurrency=max_concurrency,
                                             timeout_s=timeout_s, max_retries=0, connect_timeout_s=connect_timeout_s,
                                             transport=transport),
                     probe_backoff_s=self.probe_interval_s)
            for i, u in enumerate(urls)
        ]
        self.namespace = fleet_namespace(urls)
        self.calls = 0
        self.failovers = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        return f"FleetExecutor({[e.base_url for e in self.endpoints]!r}, model={self.model!r})"

    # ------------------------------------------------------------------ health

    def _on_loop(self) -> None:
        """Probe tasks and in-flight counts belong to one event loop; a new loop starts them afresh."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop = loop
            for ep in self.endpoints:
                ep.probe_task = None
                ep.in_flight = 0

    def _mark_down(self, ep: Endpoint, reason: str) -> None:
        ep.last_error = reason
        if not ep.up:
            return
        ep.up = False
        ep.marked_down += 1
        ep.probe_backoff_s = self.probe_interval_s
        ep.next_probe_at = time.monotonic() + ep.probe_backoff_s
        log.warning("executor fleet: endpoint %s marked down (%s); re-probing in %.1fs",
                    ep.base_url, reason, ep.probe_backoff_s)

    def _record(self, ep: Endpoint, error: ExecutorError | None) -> None:
        """Update an endpoint's health after one request."""
        if error is None:
            ep.served += 1
            ep.consecutive_failures = 0
            return
        ep.failed += 1
        if not error.retryable:
            return  # the request's fault (4xx, prompt too long), not the endpoint's
        kind = error.kind
        if kind in _DEAD_KINDS:
            self._mark_down(ep, f"{kind}: {error}")
        elif kind == "garbled" or (error.status_code is not None and error.status_code >= 500):
            ep.consecutive_failures += 1
            if ep.consecutive_failures >= self.failure_threshold:
                self._mark_down(ep, f"{ep.consecutive_failures} consecutive failures, last: {error}")

    async def _probe(self, ep: Endpoint) -> bool:
        why = await ep.client.probe(self.probe_timeout_s)
        if why is None:
            if not ep.up:
                log.warning("executor fleet: endpoint %s is back up", ep.base_url)
            ep.up = True
            ep.consecutive_failures = 0
            ep.probe_backoff_s = self.probe_interval_s
            return True
        ep.last_error = why
        ep.probe_backoff_s = min(self.probe_interval_max_s, ep.probe_backoff_s * 2)
        ep.next_probe_at = time.monotonic() + ep.probe_backoff_s
        return False

    def _probes_due(self) -> list[Endpoint]:
        now = time.monotonic()
        return [ep for ep in self.endpoints if not ep.up and ep.next_probe_at <= now
                and (ep.probe_task is None or ep.probe_task.done())]

    def _start_probes(self) -> None:
        for ep in self._probes_due():
            ep.probe_task = asyncio.create_task(self._probe(ep), name=f"probe {ep.base_url}")

    # ------------------------------------------------------------------ balancing

    def pick(self, exclude: frozenset[int] | set[int] = frozenset()) -> Endpoint | None:
        """The healthy endpoint with the fewest requests in flight (preferring ones not in `exclude`),
        counted as one more in flight; None when every endpoint is down. No await: atomic in asyncio."""
        up = [ep for ep in self.endpoints if ep.up]
        if not up:
            return None
        candidates = [ep for ep in up if ep.index not in exclude] or up
        best = min(candidates, key=lambda ep: (ep.in_flight, ep.picks, ep.index))
        best.in_flight += 1
        best.picks += 1
        return best

    async def _acquire(self, exclude: set[int]) -> Endpoint:
        self._start_probes()
        ep = self.pick(exclude)
        if ep is None:  # all down: probe the due ones here and now, then try again
            due = self._probes_due()
            if due:
                await asyncio.gather(*(self._probe(e) for e in due))
            ep = self.pick(exclude)
        if ep is None:
            raise _Failover(f"all {len(self.endpoints)} endpoints are down", all_down=True)
        return ep

    # ------------------------------------------------------------------ retries (tenacity)

    def _wait(self, rs: RetryCallState, tried: set[int]) -> float:
        exc = rs.outcome.exception() if rs.outcome is not None else None
        if isinstance(exc, _Failover) and exc.all_down:
            nxt = min(ep.next_probe_at for ep in self.endpoints) - time.monotonic()
            return min(self.backoff_max_s, max(0.05, nxt))
        if any(ep.up and ep.index not in tried for ep in self.endpoints):
            return 0.0  # fail over at once to a healthy endpoint this call has not tried
        err = exc.error if isinstance(exc, _Failover) else None
        retry_after = getattr(err, "retry_after", None)
        if retry_after is not None:
            return min(float(retry_after), self.backoff_max_s)
        delay = min(self.backoff_max_s, self.backoff_base_s * (2 ** (rs.attempt_number - 1)))
        return min(self.backoff_max_s, delay + random.uniform(0.0, delay / 2))

    def _before_sleep(self, rs: RetryCallState) -> None:
        self.failovers += 1
        exc = rs.outcome.exception() if rs.outcome is not None else None
        log.info("executor fleet (%s): attempt %d failed (%s); retrying in %.2fs", self.model, rs.attempt_number,
                 exc, rs.next_action.sleep if rs.next_action is not None else 0.0)

    # ------------------------------------------------------------------ public API

    async def chat(self, messages: list[dict], params: SamplingParams) -> ChatResult:
        self._on_loop()
        self.calls += 1
        t0 = time.perf_counter()
        tried: set[int] = set()
        attempts = 0
        started = t0
        retrying = AsyncRetrying(stop=stop_after_attempt(self.max_retries + 1),
                                 wait=lambda rs: self._wait(rs, tried),
                                 retry=retry_if_exception_type(_Failover), before_sleep=self._before_sleep,
                                 reraise=True)
        try:
            async for attempt in retrying:
                with attempt:
                    attempts += 1
                    ep = await self._acquire(tried)
                    started = time.perf_counter()
                    try:
                        result = await ep.client.chat(messages, params)
                    except ExecutorError as e:
                        self._record(ep, e)
                        if not e.retryable:
                            raise
                        tried.add(ep.index)
                        raise _Failover(f"{ep.base_url}: {e}", error=e) from None
                    finally:
                        ep.in_flight -= 1
                    self._record(ep, None)
        except _Failover as f:
            last = f.error
            raise ExecutorError(
                f"executor fleet of {len(self.endpoints)} endpoint(s) (model {self.model!r}): call failed after "
                f"{attempts} attempt{'s' if attempts != 1 else ''}; last: {f}",
                status_code=last.status_code if last else None, attempts=attempts, retryable=True,
                kind=last.kind if last else "unreachable") from None
        except ExecutorError as e:
            e.attempts = attempts
            raise
        # latency: the successful request's own time plus what failed attempts and waits cost before it
        return dataclasses.replace(result, latency_s=result.latency_s + (started - t0))

    def stats(self) -> list[dict[str, Any]]:
        return [{"url": ep.base_url, "up": ep.up, "in_flight": ep.in_flight, "served": ep.served,
                 "failed": ep.failed, "marked_down": ep.marked_down, "requests": ep.client.requests_sent,
                 "last_error": ep.last_error} for ep in self.endpoints]

    async def check(self, require_model: bool = False) -> list[str]:
        """Fail fast when no endpoint answers GET /models; endpoints that do not answer are marked down.
        Returns the model ids the live endpoints serve."""
        ids: list[str] = []
        errors = []
        for ep in self.endpoints:
            try:
                ids.extend(i for i in await ep.client.check(require_model) if i not in ids)
            except ExecutorError as e:
                errors.append(str(e))
                self._mark_down(ep, str(e))
        if len(errors) == len(self.endpoints):
            raise ExecutorError("no endpoint of the executor fleet answers: " + " | ".join(errors))
        return ids

    async def aclose(self) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        for ep in self.endpoints:
            task, ep.probe_task = ep.probe_task, None
            if task is not None and not task.done() and running is self._loop:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await ep.client.aclose()

    async def __aenter__(self) -> "FleetExecutor":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()
