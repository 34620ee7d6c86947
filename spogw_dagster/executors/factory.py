"""Build the executor a user asked for: the embedded model by default, an endpoint when given one,
wrapped in the persistent call cache unless disabled.

Cache keys of an endpoint include its base URL (the cache namespace): two servers serving different
weights under the same model name must not share entries. The embedded model needs no namespace: its
model id already names the GGUF file's content hash. A fleet (several URLs serving one model) uses its sorted
URLs as the namespace: any member may answer any call, and a different set of servers is a different cache.

Every executor is wrapped in `attribution.FaultAttributingExecutor` (below the cache, so that its control
requests reach the endpoint): a call that fails on its own content is the caller's fault, not an outage."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..paths import cache_dir
from .attribution import FaultAttributingExecutor
from .cache import CachingExecutor, CallCache


def default_cache_path() -> Path:
    return cache_dir() / "calls.sqlite"


def make_executor(url: str | Sequence[str] | None = None, model: str | None = None, *,
                  cache_path: str | Path | None = None, use_cache: bool = True,
                  api_key_env: str | None = "OPENAI_API_KEY", max_concurrency: int = 8, timeout_s: float = 120.0,
                  workers: int | None = None, threads: int | None = None, reproducible: bool = True):
    """`url`: one endpoint URL, or several (a fleet serving one model: `fleet.FleetExecutor`); None for the
    embedded model, which is `model` when given (a bundled model's alias or a .gguf path), else SmolLM2. A list of one is a single endpoint. `max_concurrency` and `timeout_s` are per endpoint.
    `workers` and `threads` size the embedded model's llama.cpp servers (parallel calls, CPU threads each);
    `reproducible` False runs them in their faster mode (`EmbeddedExecutor`), cached under its own namespace."""
    urls = [url] if isinstance(url, str) else [u for u in (url or []) if u]
    namespace = ""
    if urls:
        if not model:
            raise ValueError("--executor-url needs --executor-model (the model name the endpoint serves)")
        if len(urls) == 1:
            # lazy: only the executor chosen loads (httpx and tenacity for endpoints, the llama.cpp runtime)
            from .openai_compat import OpenAICompatExecutor

            inner = OpenAICompatExecutor(urls[0], model, api_key_env=api_key_env, max_concurrency=max_concurrency,
                                         timeout_s=timeout_s)
            namespace = inner.base_url  # normalised (no trailing slash)
        else:
            # lazy: only the executor chosen loads (httpx and tenacity for endpoints, the llama.cpp runtime)
            from .fleet import FleetExecutor

            inner = FleetExecutor(urls, model, api_key_env=api_key_env, max_concurrency=max_concurrency,
                                  timeout_s=timeout_s)
            namespace = inner.namespace  # the sorted URLs: any member may answer any call
    else:
        # no URL: the embedded llama.cpp executor on a bundled model (default SmolLM2) or a local .gguf file
        # lazy: only the executor chosen loads (httpx and tenacity for endpoints, the llama.cpp runtime)
        from ..bundled_models import BundledModelError, resolve_gguf
        from .embedded import EmbeddedExecutor

        try:
            gguf = resolve_gguf(model, role="executor model") if model else None
        except BundledModelError as e:
            hint = " (with an endpoint URL, the model is the name the endpoint serves)" if "neither" in str(e) else ""
            raise ValueError(f"{e}{hint}") from None
        inner = EmbeddedExecutor(gguf, workers=workers, threads=threads, timeout_s=timeout_s,
                                 reproducible=reproducible)
        namespace = inner.numerics

    inner = FaultAttributingExecutor(inner)
    if not use_cache:
        return inner

    return CachingExecutor(inner, CallCache(cache_path or default_cache_path()), namespace=namespace)
