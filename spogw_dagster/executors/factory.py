"""Build the executor a user asked for: the embedded model by default, an endpoint when given one,
wrapped in the persistent call cache unless disabled.

Cache keys of an endpoint include its base URL (the cache namespace): two servers serving different
weights under the same model name must not share entries. The embedded model needs no namespace: its
model id already names the GGUF file's content hash."""

from __future__ import annotations

from pathlib import Path

from ..paths import cache_dir


def default_cache_path() -> Path:
    return cache_dir() / "calls.sqlite"


def make_executor(url: str | None = None, model: str | None = None, *, cache_path: str | Path | None = None,
                  use_cache: bool = True, api_key_env: str | None = "OPENAI_API_KEY", max_concurrency: int = 8,
                  timeout_s: float = 120.0):
    namespace = ""
    if url:
        if not model:
            raise ValueError("--executor-url needs --executor-model (the model name the endpoint serves)")
        from .openai_compat import OpenAICompatExecutor

        inner = OpenAICompatExecutor(url, model, api_key_env=api_key_env, max_concurrency=max_concurrency,
                                     timeout_s=timeout_s)
        namespace = inner.base_url  # normalised (no trailing slash)
    else:
        if model:
            raise ValueError("--executor-model without --executor-url: give the endpoint URL too")
        from .embedded import EmbeddedExecutor

        inner = EmbeddedExecutor()
    if not use_cache:
        return inner
    from .cache import CachingExecutor, CallCache

    return CachingExecutor(inner, CallCache(cache_path or default_cache_path()), namespace=namespace)
