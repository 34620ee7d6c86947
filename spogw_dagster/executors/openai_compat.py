"""An async client for any OpenAI-compatible chat endpoint (vLLM, llama.cpp server, hosted APIs).

`base_url` is the API root including the version prefix, as for the OpenAI SDK, e.g.
`http://127.0.0.1:8000/v1`; requests go to `{base_url}/chat/completions` and `{base_url}/models`.

Retries (tenacity, exponential backoff plus jitter) cover HTTP 408/425/429/5xx, connection errors,
timeouts and garbled replies (invalid JSON, no `choices`). `Retry-After` (seconds or an HTTP date) is
honoured when a retryable reply carries it, capped by `backoff_max_s`. Any other 4xx fails at once;
a 400/413 saying the request exceeds the model's context (vLLM "maximum context length", OpenAI code
`context_length_exceeded`, llama.cpp server `exceed_context_size_error`) raises `PromptTooLongError`.
`max_retries` counts retries, so a call makes at most `max_retries + 1` requests.

A dead endpoint fails fast: once one call has used up its retries on refused connections (nothing listens
at the URL any more), later calls make a single attempt each while the endpoint keeps refusing, instead of
each waiting out the whole backoff schedule (minutes over a partition's calls, all of them failing); the first
call that gets through restores the full retry budget. An outage shorter than one call's retry schedule is
carried by the retries and never reaches this state.

The API key is read once, at construction, from the environment variable named by `api_key_env`;
it is sent only as the `Authorization` header and scrubbed from every message we produce.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import os
import random
import re
import time
from datetime import timezone
from typing import Any

import httpx
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt

from spogw_dagster.contracts import ChatResult, SamplingParams, clean_json, clean_text
from spogw_dagster.executors.base import ExecutorError, PromptTooLongError

__all__ = ["OpenAICompatExecutor", "parse_retry_after", "UNREACHABLE_HINT"]

log = logging.getLogger(__name__)

UNREACHABLE_HINT = "start a server (vllm serve / llama.cpp server) or pass --executor-url"
RETRYABLE_STATUS = frozenset({408, 425, 429}) | frozenset(range(500, 600))


class _Retryable(Exception):
    """One failed attempt that is worth retrying (internal; never escapes `chat`)."""

    def __init__(self, message: str, *, status_code: int | None = None,
                 retry_after: float | None = None, unreachable: bool = False, kind: str | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.retry_after = retry_after
        self.unreachable = unreachable
        # unreachable | connection | timeout | http | garbled (ExecutorError.kind)
        self.kind = kind or ("unreachable" if unreachable else "http" if status_code and status_code >= 300
                             else "garbled")


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a `Retry-After` header (delta-seconds or an HTTP date); None if absent/invalid."""
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    now_ts = time.time() if now is None else now
    return max(0.0, when.timestamp() - now_ts)


def _error_message(resp: httpx.Response, limit: int = 500) -> str:
    """The human-readable error of a reply body: OpenAI `{"error": {"message"}}`, FastAPI `detail`, or text."""
    text = resp.text
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        data = None
    msg: Any = None
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict):
            msg = err.get("message") or err.get("msg") or err
        elif err:
            msg = err
        else:
            msg = data.get("detail") or data.get("message")
    if msg is None:
        msg = text
    if not isinstance(msg, str):
        msg = json.dumps(msg, ensure_ascii=False)
    msg = " ".join(msg.split())
    if len(msg) > limit:
        msg = msg[:limit] + "..."
    return msg or "(empty body)"


# Error codes/types and message fragments meaning "the request does not fit the context window":
# OpenAI (code context_length_exceeded), vLLM ("This model's maximum context length is N tokens...",
# "... is longer than the maximum model length of N"), llama.cpp server (type exceed_context_size_error,
# "the request exceeds the available context size"), others ("prompt is too long").
_CONTEXT_CODES = frozenset({"context_length_exceeded", "exceed_context_size_error", "string_above_max_length"})
_CONTEXT_MSG_RE = re.compile(
    r"maximum context length|context[ _]length[ _]exceeded|exceeds? the (?:available )?context"
    r"|exceed(?:s|ed)? context window|longer than the maximum model length|prompt is too long"
    r"|prompt too long|too many tokens in (?:the )?prompt",
    re.I,
)
CONTEXT_OVERFLOW_STATUS = frozenset({400, 413})


def _is_context_overflow(resp: httpx.Response) -> bool:
    """Whether an error reply says the request is longer than the model's context window."""
    try:
        data = json.loads(resp.text)
    except (ValueError, RecursionError):
        data = None
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict):
            for field in ("code", "type"):
                v = err.get(field)
                if isinstance(v, str) and v.lower() in _CONTEXT_CODES:
                    return True
    return bool(_CONTEXT_MSG_RE.search(_error_message(resp, limit=2000)))


class OpenAICompatExecutor:
    """Chat completions over HTTP with bounded concurrency, timeouts, retries and backoff.

    One instance is meant to be shared by all workflow runs of a process: its semaphore bounds the
    requests in flight to the endpoint (`max_concurrency`), its connection pool is reused. It may be
    used from several event loops one after another (each `asyncio.run` gets a fresh client and
    semaphore), but not from two loops at the same time.

    `timeout_s` bounds each request as a whole (connect + send + wait + read), not just one socket read.
    `ChatResult.latency_s` is the call's wall time from start to return, retries and backoff included,
    time spent waiting for a concurrency slot excluded.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str | None = "OPENAI_API_KEY",
        max_concurrency: int = 8,
        timeout_s: float = 120.0,
        max_retries: int = 6,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 30.0,
        *,
        connect_timeout_s: float = 10.0,
        headers: dict[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key_env = api_key_env
        self.max_concurrency = int(max_concurrency)
        self.timeout_s = float(timeout_s)
        self.connect_timeout_s = float(min(connect_timeout_s, timeout_s))
        self.max_retries = int(max_retries)
        self.backoff_base_s = float(backoff_base_s)
        self.backoff_max_s = float(backoff_max_s)
        self._api_key: str | None = (os.environ.get(api_key_env) or None) if api_key_env else None
        self._headers = dict(headers or {})
        if self._api_key:
            self._headers["Authorization"] = f"Bearer {self._api_key}"
        self._transport = transport
        self._extra_body = dict(extra_body or {})  # server-specific request fields (e.g. llama.cpp's cache_prompt)
        self._chat_url = f"{self.base_url}/chat/completions"
        # Per-event-loop state, created lazily (an httpx client and a semaphore belong to one loop).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: httpx.AsyncClient | None = None
        self._sem: asyncio.Semaphore | None = None
        # Counters (process lifetime of this instance).
        self.requests_sent = 0
        self.retries = 0
        self.missing_usage_calls = 0  # successful replies without a `usage` field (tokens counted as 0)
        self._warned_missing_usage = False
        # monotonic time since which the endpoint refuses connections (a call used up its retries on it);
        # None while it answers. While set, calls make one attempt each (see the module docstring).
        self.down_since: float | None = None
        self.fast_failures = 0  # calls that failed after one attempt because the endpoint was down
        # Where the served calls' time went: seconds waiting for a free slot here, seconds in flight, and the
        # server's own prefill / decode split where it reports one (llama.cpp's `timings`; others leave 0).
        self.time_split = {"calls": 0, "queued_s": 0.0, "served_s": 0.0, "prefill_s": 0.0, "decode_s": 0.0,
                           "prefill_tokens": 0, "decode_tokens": 0}

    # ------------------------------------------------------------------ plumbing

    def __repr__(self) -> str:
        return (f"OpenAICompatExecutor(base_url={self.base_url!r}, model={self.model!r}, "
                f"max_concurrency={self.max_concurrency}, timeout_s={self.timeout_s}, "
                f"max_retries={self.max_retries})")

    def _scrub(self, text: str) -> str:
        if self._api_key and len(self._api_key) >= 4:
            text = text.replace(self._api_key, "***")
        return text

    def _state(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._client is None or self._sem is None:
            # A client bound to a previous (now finished) loop cannot be used or closed here; drop it.
            self._client = httpx.AsyncClient(
                headers=self._headers,
                timeout=httpx.Timeout(self.timeout_s, connect=self.connect_timeout_s),
                limits=httpx.Limits(max_connections=self.max_concurrency,
                                    max_keepalive_connections=self.max_concurrency),
                transport=self._transport,
            )
            self._sem = asyncio.Semaphore(self.max_concurrency)
            self._loop = loop
        return self._client, self._sem

    def _wait(self, rs: RetryCallState) -> float:
        exc = rs.outcome.exception() if rs.outcome is not None else None
        retry_after = getattr(exc, "retry_after", None)
        if retry_after is not None:
            return min(retry_after, self.backoff_max_s)
        delay = min(self.backoff_max_s, self.backoff_base_s * (2 ** (rs.attempt_number - 1)))
        return min(self.backoff_max_s, delay + random.uniform(0.0, delay / 2))

    def _before_sleep(self, rs: RetryCallState) -> None:
        self.retries += 1
        exc = rs.outcome.exception() if rs.outcome is not None else None
        wait = rs.next_action.sleep if rs.next_action is not None else 0.0
        log.warning("executor %s (%s): attempt %d failed (%s); retrying in %.2fs",
                    self.base_url, self.model, rs.attempt_number, exc, wait)

    def _body(self, messages: list[dict], params: SamplingParams) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": clean_json(messages),  # lone surrogates would fail the encoder, before any request
            "temperature": params.temperature,
            "top_p": params.top_p,
            "max_tokens": params.max_tokens,
        }
        if params.seed is not None:
            body["seed"] = params.seed
        if params.stop:
            body["stop"] = list(params.stop)
        body.update(self._extra_body)
        return body

    # ------------------------------------------------------------------ one attempt

    async def _attempt(self, client: httpx.AsyncClient, sem: asyncio.Semaphore,
                       body: dict[str, Any], queued: list[float]) -> tuple[str, int, int, bool]:
        t_queue = time.perf_counter()
        async with sem:
            queued[0] += time.perf_counter() - t_queue
            self.requests_sent += 1
            try:
                async with asyncio.timeout(self.timeout_s):
                    resp = await client.post(self._chat_url, json=body)
            except (TimeoutError, httpx.TimeoutException):
                raise _Retryable(f"request timed out after {self.timeout_s:g}s", kind="timeout") from None
            except httpx.TransportError as e:
                refused = isinstance(e, httpx.ConnectError)
                raise _Retryable(self._scrub(f"connection error: {type(e).__name__}: {e}"),
                                 unreachable=refused, kind="unreachable" if refused else "connection") from None
            except httpx.HTTPError as e:  # e.g. an invalid URL: not worth retrying
                raise ExecutorError(self._scrub(
                    f"executor request to {self._chat_url} failed: {type(e).__name__}: {e}")) from None

        status = resp.status_code
        if status in RETRYABLE_STATUS:
            raise _Retryable(self._scrub(f"HTTP {status}: {_error_message(resp)}"), status_code=status,
                             retry_after=parse_retry_after(resp.headers.get("retry-after")))
        if status in CONTEXT_OVERFLOW_STATUS and _is_context_overflow(resp):
            raise PromptTooLongError(self._scrub(
                f"prompt too long: HTTP {status} from {self._chat_url} (model {self.model!r}): "
                f"{_error_message(resp)}"), status_code=status)
        if status >= 400:
            hint = ""
            if status in (401, 403):
                hint = (f" (check the API key in ${self.api_key_env})" if self.api_key_env
                        else " (no API key configured: pass api_key_env)")
            raise ExecutorError(self._scrub(
                f"executor rejected the request: HTTP {status} from {self._chat_url} "
                f"(model {self.model!r}): {_error_message(resp)}{hint}"), status_code=status)

        try:
            return self._parse_reply(resp)
        except _Retryable:
            raise
        except Exception as e:  # anything unexpected in a 2xx body is a garbled reply, worth a retry
            raise _Retryable(self._scrub(f"garbled reply (HTTP {status}): {type(e).__name__}: {e}"),
                             status_code=status) from None

    def _parse_reply(self, resp: httpx.Response) -> tuple[str, int, int, bool]:
        """(text, prompt_tokens, completion_tokens, has_usage) of a 2xx reply; `_Retryable` if garbled."""
        status = resp.status_code
        try:
            data = resp.json()
        except ValueError:
            raise _Retryable(self._scrub(f"garbled reply: invalid JSON (HTTP {status}): {resp.text[:200]!r}"),
                             status_code=status) from None
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise _Retryable(self._scrub(f"garbled reply: no choices (HTTP {status}): {resp.text[:200]!r}"),
                             status_code=status)
        message = choices[0].get("message")
        if not isinstance(message, dict):
            raise _Retryable("garbled reply: choices[0] has no message", status_code=status)
        content = message.get("content")
        if content is None:
            text = ""
        elif isinstance(content, str):
            text = content
        elif isinstance(content, list):  # content parts; a part's "text" may be null
            texts = []
            for part in content:
                if not isinstance(part, dict):
                    continue
                t = part.get("text")
                if t is None:
                    continue
                if not isinstance(t, str):
                    raise _Retryable(f"garbled reply: content part text of type {type(t).__name__}",
                                     status_code=status)
                texts.append(t)
            text = "".join(texts)
        else:
            raise _Retryable(f"garbled reply: content of type {type(content).__name__}", status_code=status)

        usage = data.get("usage")
        has_usage = isinstance(usage, dict)
        usage = usage if has_usage else {}

        def count(v: Any) -> int:
            return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0

        self._add_timings(data.get("timings"))
        return clean_text(text), count(usage.get("prompt_tokens")), count(usage.get("completion_tokens")), has_usage

    def _add_timings(self, t: Any) -> None:
        if not isinstance(t, dict):
            return
        try:
            self.time_split["prefill_s"] += max(0.0, float(t.get("prompt_ms") or 0)) / 1000
            self.time_split["decode_s"] += max(0.0, float(t.get("predicted_ms") or 0)) / 1000
            self.time_split["prefill_tokens"] += max(0, int(t.get("prompt_n") or 0))
            self.time_split["decode_tokens"] += max(0, int(t.get("predicted_n") or 0))
        except (TypeError, ValueError):  # a server's odd timings are no reason to fail a good reply
            pass

    # ------------------------------------------------------------------ public API

    async def chat(self, messages: list[dict], params: SamplingParams) -> ChatResult:
        client, sem = self._state()
        body = self._body(messages, params)
        t0 = time.perf_counter()
        queued = [0.0]
        attempts = 0
        down = self.down_since is not None
        retrying = AsyncRetrying(
            stop=stop_after_attempt(1 if down else self.max_retries + 1),
            wait=self._wait,
            retry=retry_if_exception_type(_Retryable),
            before_sleep=self._before_sleep,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    attempts += 1
                    text, pt, ct, has_usage = await self._attempt(client, sem, body, queued)
        except _Retryable as e:
            msg = (f"executor call to {self._chat_url} (model {self.model!r}) failed after "
                   f"{attempts} attempt{'s' if attempts != 1 else ''}: {e}")
            if e.unreachable:
                msg += f"; cannot reach executor endpoint at {self.base_url}: {UNREACHABLE_HINT}"
                if self.down_since is None:
                    self.down_since = time.monotonic()
                    if self.max_retries > 0:  # (a fleet's members make one attempt anyway)
                        log.warning("executor %s refuses connections after %d attempts: later calls fail after "
                                    "one attempt until it answers again", self.base_url, attempts)
                elif down:
                    self.fast_failures += 1
                    msg += (f" (down for {time.monotonic() - self.down_since:.0f}s: one attempt per call until it "
                            "answers)")
            err = ExecutorError(self._scrub(msg), status_code=e.status_code, attempts=attempts,
                                retryable=True, kind=e.kind)
            err.retry_after = e.retry_after  # type: ignore[attr-defined]  # a fleet's backoff honours it
            raise err from None
        except ExecutorError as e:
            e.attempts = attempts
            raise
        except Exception as e:  # a bug of ours or an oddity we did not foresee: still only ExecutorError escapes
            raise ExecutorError(self._scrub(
                f"executor call to {self._chat_url} (model {self.model!r}) failed unexpectedly after "
                f"{attempts} attempt{'s' if attempts != 1 else ''}: {type(e).__name__}: {e}"),
                attempts=attempts) from e
        self.down_since = None
        if not has_usage:
            self.missing_usage_calls += 1
            if not self._warned_missing_usage:
                self._warned_missing_usage = True
                log.warning("executor %s returned no `usage` field; token counts are recorded as 0 "
                            "(see missing_usage_calls)", self.base_url)
        latency = time.perf_counter() - t0 - queued[0]
        self.time_split["calls"] += 1
        self.time_split["queued_s"] += queued[0]
        self.time_split["served_s"] += latency
        return ChatResult(text=text, prompt_tokens=pt, completion_tokens=ct,
                          latency_s=latency, cached=False, model=self.model)

    async def list_models(self) -> list[str]:
        """The model ids the endpoint serves (GET {base_url}/models). Raises ExecutorError with a clear
        message when the endpoint cannot be reached or refuses."""
        client, _ = self._state()
        url = f"{self.base_url}/models"
        try:
            async with asyncio.timeout(min(self.timeout_s, 30.0)):
                resp = await client.get(url)
        except (TimeoutError, httpx.TimeoutException):
            raise ExecutorError(f"cannot reach executor endpoint at {self.base_url}: timed out; "
                                f"{UNREACHABLE_HINT}") from None
        except httpx.HTTPError as e:
            raise ExecutorError(self._scrub(f"cannot reach executor endpoint at {self.base_url}: "
                                            f"{type(e).__name__}: {e}; {UNREACHABLE_HINT}")) from None
        if resp.status_code >= 400:
            hint = ""
            if resp.status_code in (401, 403) and self.api_key_env:
                hint = f" (check the API key in ${self.api_key_env})"
            raise ExecutorError(self._scrub(
                f"executor endpoint at {self.base_url} answered HTTP {resp.status_code} to GET /models: "
                f"{_error_message(resp)}{hint}"), status_code=resp.status_code)
        try:
            data = resp.json()
            return [str(m["id"]) for m in data["data"]]
        except (ValueError, KeyError, TypeError):
            raise ExecutorError(self._scrub(
                f"executor endpoint at {self.base_url} is not OpenAI-compatible: GET /models gave "
                f"{resp.text[:200]!r} (is base_url missing its /v1 suffix?)")) from None

    async def probe(self, timeout_s: float = 5.0) -> str | None:
        """A cheap health check (GET {base_url}/models): None when the server answers at all with a status
        below 500 (a 404 or 401 still means a live server), else why not (refused, timed out, 5xx)."""
        client, _ = self._state()
        try:
            async with asyncio.timeout(timeout_s):
                resp = await client.get(f"{self.base_url}/models")
        except (TimeoutError, httpx.TimeoutException):
            return f"probe timed out after {timeout_s:g}s"
        except httpx.HTTPError as e:
            return self._scrub(f"probe failed: {type(e).__name__}: {e}")
        if resp.status_code >= 500:
            return f"probe answered HTTP {resp.status_code}"
        return None

    async def check(self, require_model: bool = False) -> list[str]:
        """Fail fast, with a clear message, if the endpoint is unreachable. Returns the served model ids.

        A model that is not listed is only logged by default: llama.cpp's server answers to any
        model name. Pass `require_model=True` to make it an error (vLLM, hosted APIs)."""
        ids = await self.list_models()
        if self.model not in ids:
            msg = f"model {self.model!r} is not among the models served at {self.base_url}: {ids}"
            if require_model:
                raise ExecutorError(msg)
            log.warning(msg)
        return ids

    async def aclose(self) -> None:
        client, self._client, self._sem = self._client, None, None
        loop, self._loop = self._loop, None
        if client is not None:
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                await client.aclose()

    async def __aenter__(self) -> "OpenAICompatExecutor":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()
