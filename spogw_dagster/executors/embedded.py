"""The embedded executor: the bundled SmolLM2-135M-Instruct GGUF run in-process by llama.cpp.

No server, no key, no download. Calls run in a worker thread (the event loop stays free) and are
serialised by a `threading.Lock` taken *inside* that thread: llama.cpp contexts are not thread-safe, and
cancelling an awaiting caller does not stop its thread, which keeps the lock until llama.cpp is done.
(An asyncio lock would be released on cancellation while the thread still runs, letting the next call
use the same context concurrently, which aborts the process; it would also bind to one event loop.)
A cancelled call therefore still finishes its generation in the background, bounded by its max_tokens,
and delays the next call by that much.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
import time
from pathlib import Path
from typing import Any

from ..paths import smollm2_gguf
from ..contracts import ChatResult, SamplingParams
from .base import ExecutorError, PromptTooLongError


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:12]


class EmbeddedExecutor:
    """`Executor` on a local GGUF file (default: the bundled SmolLM2). `model` names the file's content."""

    def __init__(self, gguf_path: str | os.PathLike | None = None, *, n_ctx: int = 8192,
                 n_threads: int | None = None):
        path = Path(gguf_path) if gguf_path else smollm2_gguf()
        if not path.is_file():
            raise FileNotFoundError(f"GGUF model file not found: {path}")
        try:
            from llama_cpp import Llama
        except ImportError as e:  # pragma: no cover - install problem
            raise ExecutorError(f"llama-cpp-python is not installed ({e}); fix: pip install llama-cpp-python") from e
        self.path = path
        self.model = f"{path.stem}@{_file_digest(path)}"
        self._llm = Llama(model_path=str(path), n_ctx=n_ctx, n_threads=n_threads or min(os.cpu_count() or 1, 4),
                          verbose=False)
        # held by the worker thread for the whole llama.cpp call; never by the event loop
        self._lock = threading.Lock()

    def _complete(self, messages: list[dict], params: SamplingParams) -> ChatResult:
        """One llama.cpp call, in a worker thread. Takes the lock itself, so the thread holds it until
        llama.cpp returns even if the awaiting task was cancelled meanwhile."""
        with self._lock:
            llm = self._llm
            if llm is None:
                raise ExecutorError("embedded model is closed")
            return self._complete_locked(llm, messages, params)

    def _complete_locked(self, llm: Any, messages: list[dict], params: SamplingParams) -> ChatResult:
        t0 = time.monotonic()
        out = llm.create_chat_completion(
            messages=messages,
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_tokens,
            stop=list(params.stop) or None,
            seed=params.seed if params.seed is not None else -1,
        )
        usage = out.get("usage") or {}
        text = out["choices"][0]["message"].get("content") or ""
        return ChatResult(text=text, prompt_tokens=int(usage.get("prompt_tokens", 0)),
                          completion_tokens=int(usage.get("completion_tokens", 0)),
                          latency_s=time.monotonic() - t0, model=self.model)

    async def chat(self, messages: list[dict], params: SamplingParams) -> ChatResult:
        try:
            return await asyncio.to_thread(self._complete, messages, params)
        except ExecutorError:
            raise
        except ValueError as e:
            # llama-cpp-python: "Requested tokens (N) exceed context window of M" (the request's fault)
            if "exceed context window" in str(e):
                raise PromptTooLongError(f"prompt too long for the embedded model: {e}") from e
            raise ExecutorError(f"embedded model rejected the request: {e}") from e
        except Exception as e:  # llama.cpp failures are our infrastructure's, not the workflow's
            raise ExecutorError(f"embedded model failed: {type(e).__name__}: {e}") from e

    def _close(self) -> None:
        with self._lock:  # waits for a running (possibly abandoned) call to finish first
            llm, self._llm = self._llm, None
        if llm is not None and hasattr(llm, "close"):
            llm.close()

    async def aclose(self) -> None:
        await asyncio.to_thread(self._close)
