"""The executor interface: one async chat call, its failure type, and per-run accounting.

Every executor (OpenAI-compatible HTTP, the embedded llama.cpp model, test fakes) satisfies
`Executor`. Wrappers compose around it:

    shared = CachingExecutor(OpenAICompatExecutor(url, model), CallCache(path))   # one per process
    run_exec = MeteredExecutor(shared)                                            # one per workflow run
    ...
    run_exec.usage        # this run's calls, cached calls, tokens, latency

A call that finally fails raises `ExecutorError`; callers map it to `Status.EXECUTOR_ERROR`
(our infrastructure failed, not the workflow). One subclass is the caller's fault, not ours:
`RequestFaultError`, a request the executor fails on because of what it holds (its content), shown by the
endpoint serving a control request right after (`attribution.FaultAttributingExecutor`), or a request that
does not fit the model's context window (`PromptTooLongError`). Callers map it to the workflow's failure,
so a workflow cannot make a bad row disappear by sending what the executor chokes on.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from spogw_dagster.contracts import ChatResult, SamplingParams, Usage

__all__ = ["Executor", "ExecutorError", "MeteredExecutor", "PromptTooLongError", "RequestFaultError"]


@runtime_checkable
class Executor(Protocol):
    """An LLM that answers chat requests.

    `messages` are OpenAI-style dicts (`{"role": "user", "content": "..."}`). Implementations must be
    safe to call from many concurrent asyncio tasks, raise `ExecutorError` (and nothing else, except
    `asyncio.CancelledError`) when a call fails, and fill `ChatResult.latency_s`.
    """

    model: str

    async def chat(self, messages: list[dict], params: SamplingParams) -> ChatResult: ...

    async def aclose(self) -> None: ...


class ExecutorError(RuntimeError):
    """The executor failed for good: retries exhausted, or a non-retryable reply (most 4xx).

    `status_code` is the last HTTP status seen (None for connection errors, timeouts, garbled
    replies or non-HTTP executors); `attempts` is how many requests were made; `kind` names the last
    retryable failure (see below). The message never
    contains an API key.
    """

    def __init__(self, message: str, *, status_code: int | None = None, attempts: int = 0,
                 retryable: bool = False, kind: str | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.attempts = attempts
        # What the last retryable failure was, for health checks of a fleet (`fleet.py`): "unreachable"
        # (connection refused), "connection" (dropped mid-request), "timeout", "http" (408/425/429/5xx,
        # see status_code), "garbled" (a 2xx reply we cannot read); None when not known.
        self.kind = kind
        # True when the last failure was of a retryable kind (the budget ran out), False for a
        # definitive rejection (e.g. HTTP 400). Useful to tell "endpoint flaky" from "request bad".
        self.retryable = retryable


class RequestFaultError(ExecutorError):
    """The executor failed on this request because of its content, not because the endpoint is down.

    Never retried (`retryable` is False). Callers treat it as the failure of whoever wrote the request (a
    workflow, through an operator), never as an infrastructure failure.
    """


class PromptTooLongError(RequestFaultError):
    """The request does not fit the model's context window (the prompt, or prompt + max_tokens).

    Never retried (`retryable` is False): the same request would fail again. Unlike other
    `ExecutorError`s this is the caller's doing (e.g. a workflow that built a huge prompt), so callers
    should treat it as the workflow's failure, not as an infrastructure failure.
    """


class MeteredExecutor:
    """A thin wrapper that records every successful call of `inner` into its own `Usage`.

    Create one per workflow run around a shared executor: each run gets its own accounting while
    all runs share the inner executor's connection pool, concurrency limit and cache. Failed calls
    are counted in `failed_calls` (they are not in `Usage`, which sums results).

    The wrapper does not own `inner`: `aclose()` leaves it open unless `close_inner=True`.
    """

    def __init__(self, inner: Executor, usage: Usage | None = None, *, close_inner: bool = False) -> None:
        self.inner = inner
        self.usage = usage if usage is not None else Usage()
        self.failed_calls = 0
        self._close_inner = close_inner

    @property
    def model(self) -> str:  # type: ignore[override]
        return self.inner.model

    async def chat(self, messages: list[dict], params: SamplingParams) -> ChatResult:
        try:
            result = await self.inner.chat(messages, params)
        except ExecutorError:
            self.failed_calls += 1
            raise
        self.usage.add(result)
        return result

    async def aclose(self) -> None:
        if self._close_inner:
            await self.inner.aclose()

    async def __aenter__(self) -> "MeteredExecutor":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"MeteredExecutor({self.inner!r}, usage={self.usage})"


TIME_SPLIT_KEYS = ("calls", "queued_s", "served_s", "prefill_s", "decode_s", "prefill_tokens", "decode_tokens")


def time_split_of(executor: Any) -> dict[str, float]:
    """Where an executor's served calls spent their time, summed over the endpoint clients under its wrappers
    (the cache's and the attribution's `inner`, the embedded executor's per-worker clients, a fleet's members):
    calls, seconds queued for a slot, seconds served, and the server's prefill and decode seconds and tokens
    where it reports them (llama.cpp does; a cached call counts nowhere)."""
    total: dict[str, float] = dict.fromkeys(TIME_SPLIT_KEYS, 0)
    seen: set[int] = set()

    def visit(node: Any) -> None:
        if node is None or id(node) in seen:
            return
        seen.add(id(node))
        split = getattr(node, "time_split", None)
        if isinstance(split, dict):
            for k in TIME_SPLIT_KEYS:
                total[k] += split.get(k, 0)
        visit(getattr(node, "inner", None))
        for client in list(getattr(node, "_clients", {}).values()):
            visit(client)
        for member in getattr(node, "endpoints", None) or []:
            visit(getattr(member, "client", None))

    visit(executor)
    return total
