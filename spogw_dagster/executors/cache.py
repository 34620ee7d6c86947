"""A persistent call cache, so that rerunning a partition does not pay for the same LLM calls again.

`CallCache` is a SQLite file (stdlib sqlite3, WAL mode): many processes may read and write it at once,
and many asyncio tasks may share one instance. Entries are keyed by the sha256 of a canonical JSON of
(model, messages, sampling params including seed and stop, and an optional namespace). A greedy call
(temperature 0) is keyed without its seed: it draws nothing, so its text does not depend on one. (A served
endpoint that batches calls can still vary a greedy text with the batch's float rounding; with the cache on,
such a call is made once and that variation is not sampled again, which is what the reruns of a workflow at
T = 0 would otherwise be averaging.)

`CachingExecutor` wraps any executor with it:

- a hit returns the stored text and token counts with `cached=True` and `latency_s=0.0`;
- a miss calls the inner executor and stores the result only after it succeeded (a failed call,
  i.e. an `ExecutorError`, is never cached);
- **a call with temperature > 0 and no seed is never cached** (neither looked up nor stored): it is
  not reproducible, and caching it would make every "independent" sample return the same text.
  Callers that want sampled calls cached give each sample its own seed (e.g. seed = base + i);
- concurrent identical calls in one process are coalesced: one goes to the endpoint, the others wait
  and then read its result from the cache (counted as hits).

Token counts of a hit are the original call's, so `Usage` reports a workflow's token cost the same way
whether the cache was warm or cold; `Usage.cached_calls` tells how many calls were free.

Cache errors (a locked or full disk) never fail a call: they are logged and the call proceeds uncached.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

from spogw_dagster.contracts import ChatResult, SamplingParams, clean_json
from spogw_dagster.executors.base import Executor

__all__ = ["CallCache", "CachedCall", "CachingExecutor", "StoredCall", "cache_key", "canonical_request",
           "is_cacheable", "stored_calls"]

log = logging.getLogger(__name__)

# Bump when the key's content or meaning changes: old entries then simply stop matching.
CACHE_KEY_VERSION = 1


def is_cacheable(params: SamplingParams) -> bool:
    """Greedy calls and seeded calls are reproducible; unseeded sampling (temperature > 0) is not."""
    return params.temperature <= 0 or params.seed is not None


def canonical_request(model: str, messages: list[dict], params: SamplingParams, namespace: str = "") -> str:
    """The canonical JSON a cache key hashes: sorted keys, no whitespace, numbers normalised."""
    p = {
        "temperature": float(params.temperature),
        "top_p": float(params.top_p),
        "max_tokens": int(params.max_tokens),
        # greedy decoding draws nothing, so its seed is no part of the call: ScoreFlow's 3 runs of a workflow
        # at T = 0 (and any repeated greedy call) are one call, not three
        "seed": None if params.seed is None or params.temperature <= 0 else int(params.seed),
        "stop": list(params.stop),
    }
    obj = {"v": CACHE_KEY_VERSION, "ns": namespace, "model": model, "messages": messages, "params": p}
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def cache_key(model: str, messages: list[dict], params: SamplingParams, namespace: str = "") -> str:
    return hashlib.sha256(canonical_request(model, messages, params, namespace).encode("utf-8")).hexdigest()


class CachedCall(NamedTuple):
    text: str
    prompt_tokens: int
    completion_tokens: int
    model: str


_SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (
    key TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    text TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    created_at REAL NOT NULL,
    request TEXT
)
"""


class StoredCall(NamedTuple):
    """A cached call with the request that made it (what the bench scripts replay)."""

    messages: list[dict]
    params: SamplingParams
    text: str
    completion_tokens: int


def stored_calls(path: str | Path) -> list[StoredCall]:
    """Every call a cache file holds with its request, in the order they were made, read-only (a running
    pipeline may keep writing). Calls stored without their request are skipped."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = con.execute("select request, text, completion_tokens from calls where request is not null "
                           "order by created_at").fetchall()
    finally:
        con.close()
    out = []
    for req, text, ct in rows:
        r = json.loads(req)
        p = r["params"]
        out.append(StoredCall(r["messages"], SamplingParams(temperature=p["temperature"], top_p=p["top_p"],
                                                            max_tokens=p["max_tokens"], seed=p["seed"],
                                                            stop=tuple(p.get("stop") or ())), text, int(ct)))
    return out


class CallCache:
    """A persistent map from request key to result, in one SQLite file (WAL mode).

    Safe across processes (SQLite locking, a 30 s busy timeout) and across threads and asyncio tasks
    (one connection guarded by a lock; each operation is one short statement, run synchronously).
    `path` may be ":memory:" for a throwaway cache.
    """

    def __init__(self, path: str | Path, *, busy_timeout_s: float = 30.0) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        conn = None
        try:
            conn = sqlite3.connect(self.path, timeout=busy_timeout_s, check_same_thread=False,
                                   isolation_level=None)  # autocommit: each statement is its own transaction
            conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(_SCHEMA)
            conn.execute("SELECT key FROM calls LIMIT 1").fetchone()  # a damaged header/schema fails here
        except sqlite3.DatabaseError as e:  # sqlite3.OperationalError included (e.g. an unwritable file)
            if conn is not None:
                conn.close()
            raise RuntimeError(f"call cache {self.path} cannot be opened as a SQLite database ({e}); "
                               f"delete the file (and its -wal/-shm files; only the cached calls are lost, they "
                               f"are made again) or choose another cache path") from None
        self._conn: sqlite3.Connection | None = conn

    def _c(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError(f"call cache {self.path} is closed")
        return self._conn

    def get(self, key: str) -> CachedCall | None:
        with self._lock:
            row = self._c().execute(
                "SELECT text, prompt_tokens, completion_tokens, model FROM calls WHERE key = ?", (key,)
            ).fetchone()
        return CachedCall(*row) if row else None

    def put(self, key: str, result: ChatResult, request: str | None = None) -> None:
        """Store a successful result. The first stored result of a key wins (later puts are ignored),
        so concurrent writers in several processes agree on one answer."""
        with self._lock:
            self._c().execute(
                "INSERT OR IGNORE INTO calls (key, model, text, prompt_tokens, completion_tokens, created_at, request)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (key, result.model, result.text, int(result.prompt_tokens), int(result.completion_tokens),
                 time.time(), request),
            )

    def __len__(self) -> int:
        with self._lock:
            return int(self._c().execute("SELECT COUNT(*) FROM calls").fetchone()[0])

    def __contains__(self, key: str) -> bool:
        return self.get(key) is not None

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> "CallCache":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"CallCache({self.path!r})"


class CachingExecutor:
    """Wrap `inner` with a `CallCache`. See the module docstring for the rules.

    `namespace` goes into every key: use it to keep apart endpoints that serve different weights
    under the same model name (e.g. two llama.cpp servers both calling their model "default").
    Counters: `hits`, `misses` (calls that went to `inner`), `failures` (misses that raised: nothing stored),
    `uncacheable` (unseeded sampling, passed straight through), `store_errors`.

    `aclose()` closes `inner` (the wrapper owns it unless `close_inner=False`), never the cache.
    """

    def __init__(self, inner: Executor, cache: CallCache, *, namespace: str = "",
                 close_inner: bool = True) -> None:
        self.inner = inner
        self.cache = cache
        self.namespace = namespace
        self.hits = 0
        self.misses = 0
        self.failures = 0
        self.uncacheable = 0
        self.store_errors = 0
        self._close_inner = close_inner
        self._inflight: dict[str, asyncio.Event] = {}

    @property
    def model(self) -> str:  # type: ignore[override]
        return self.inner.model

    def _lookup(self, key: str) -> CachedCall | None:
        try:
            return self.cache.get(key)
        except sqlite3.Error as e:
            log.warning("call cache %s: lookup failed (%s); calling the executor", self.cache.path, e)
            return None

    async def chat(self, messages: list[dict], params: SamplingParams) -> ChatResult:
        messages = clean_json(messages)  # the key must encode (a lone surrogate would not); valid text is unchanged
        if not is_cacheable(params):
            self.uncacheable += 1
            return await self.inner.chat(messages, params)
        model = self.model
        request = canonical_request(model, messages, params, self.namespace)
        key = hashlib.sha256(request.encode("utf-8")).hexdigest()
        while True:
            hit = self._lookup(key)
            if hit is not None:
                self.hits += 1
                return ChatResult(text=hit.text, prompt_tokens=hit.prompt_tokens,
                                  completion_tokens=hit.completion_tokens, latency_s=0.0, cached=True,
                                  model=hit.model or model)
            pending = self._inflight.get(key)
            if pending is None:
                break
            await pending.wait()  # an identical call is in flight: wait, then look again
        self.misses += 1
        done = asyncio.Event()
        self._inflight[key] = done
        try:
            try:
                result = await self.inner.chat(messages, params)  # an ExecutorError propagates, nothing stored
            except BaseException:
                self.failures += 1
                raise
            try:
                self.cache.put(key, result, request)
            except sqlite3.Error as e:
                self.store_errors += 1
                log.warning("call cache %s: store failed (%s); result not cached", self.cache.path, e)
        finally:
            if self._inflight.get(key) is done:
                del self._inflight[key]
            done.set()
        return result

    async def aclose(self) -> None:
        if self._close_inner:
            await self.inner.aclose()

    async def __aenter__(self) -> "CachingExecutor":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"CachingExecutor({self.inner!r}, {self.cache!r})"
