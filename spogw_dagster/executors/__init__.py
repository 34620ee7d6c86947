"""Executors: the LLMs that workflows call.

- `Executor` (the protocol), `ExecutorError`, `RequestFaultError` (the request's content made the call fail:
  the caller's fault) and its case `PromptTooLongError` (the request does not fit the context window),
  `MeteredExecutor` (per-run accounting): `base`
- `FaultAttributingExecutor`: tells a request's fault from the endpoint's by a control request: `attribution`
- `OpenAICompatExecutor`: any OpenAI-compatible HTTP endpoint (vLLM, llama.cpp server, hosted APIs)
- `FleetExecutor`: several such endpoints serving one model (balancing, health checks, failover): `fleet`
- `CallCache`, `CachingExecutor`: the persistent call cache

Typical composition (one shared executor per process, one meter per workflow run):

    shared = CachingExecutor(OpenAICompatExecutor(url, model), CallCache("assets/call_cache.sqlite"))
    run_exec = MeteredExecutor(shared)

`OpenAICompatExecutor` and `FleetExecutor` are imported lazily (they pull httpx and tenacity).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from spogw_dagster.executors.base import Executor, ExecutorError, MeteredExecutor, PromptTooLongError, RequestFaultError
from spogw_dagster.executors.cache import CachedCall, CachingExecutor, CallCache, cache_key, is_cacheable

if TYPE_CHECKING:
    from spogw_dagster.executors.fleet import FleetExecutor
    from spogw_dagster.executors.openai_compat import OpenAICompatExecutor

__all__ = [
    "Executor",
    "ExecutorError",
    "MeteredExecutor",
    "PromptTooLongError",
    "RequestFaultError",
    "OpenAICompatExecutor",
    "FleetExecutor",
    "CallCache",
    "CachedCall",
    "CachingExecutor",
    "cache_key",
    "is_cacheable",
]


def __getattr__(name: str) -> Any:
    if name == "OpenAICompatExecutor":
        # lazy: httpx and tenacity load only when an endpoint executor is asked for
        from spogw_dagster.executors.openai_compat import OpenAICompatExecutor

        return OpenAICompatExecutor
    if name == "FleetExecutor":
        # lazy: httpx and tenacity load only when an endpoint executor is asked for
        from spogw_dagster.executors.fleet import FleetExecutor

        return FleetExecutor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
