"""A local fake OpenAI-compatible server for tests and benchmarks (stdlib only).

    with FakeOpenAIServer() as srv:                 # 127.0.0.1, ephemeral port, a background thread
        srv.script(error(500), "ok")                # the next chat requests, in order; then the default
        exe = OpenAICompatExecutor(srv.base_url, srv.model)
        ...
        srv.request_count, srv.max_in_flight, srv.requests

Behaviours (a `Behaviour`, or a string shortcut):
    "ok"          200 with a deterministic answer, `ok(delay_s=...)` to make it take a while
    "no_usage"    200 without a `usage` field
    "garbled"     200 with a body that is not JSON
    "no_choices"  200 with JSON that has no `choices`
    "drop"        close the connection without answering
    "slow"        answer only after `slow(delay_s)` seconds (default 5)
    error(status, message, retry_after=None)   an OpenAI-style error body, optional Retry-After header
    raw(status, body)   exactly this JSON body (any JSON value) with this status
                  (shortcuts "400", "429", "500", "503": 429 and 503 carry Retry-After: 1)

The answer to a chat request is `answer_fn(body, n)`; by default "echo: <last message content>".
Token counts are whitespace word counts (prompt: all message contents; completion: the answer).

Run as a script (`python tests/fake_openai_server.py [--port N]`) it serves instant "ok" replies in
the foreground and prints `PORT <n>` once listening; the benchmark uses that. A process that can die and be
restarted on the same port is what the fault matrix uses (tests/faults/test_executor_outage.py):
`--delay S` (every reply takes S seconds), `--log FILE` (one JSON line per chat request received, appended
and flushed before it is answered: `{"n": ..., "key": <sha256 of the body>, "ua": <User-Agent>}`), `--die-after N` (the process
exits at once, without answering, when chat request N + 1 arrives: an endpoint dying mid-call).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import threading
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable


@dataclass(frozen=True)
class Behaviour:
    kind: str = "ok"  # ok | no_usage | garbled | no_choices | drop | error | raw
    status: int = 200
    message: str = ""
    retry_after: str | None = None
    delay_s: float = 0.0
    body_json: str = ""  # raw: the body, as JSON text


def ok(delay_s: float = 0.0) -> Behaviour:
    return Behaviour("ok", delay_s=delay_s)


def slow(delay_s: float = 5.0) -> Behaviour:
    return Behaviour("ok", delay_s=delay_s)


def error(status: int, message: str = "", retry_after: str | float | None = None, delay_s: float = 0.0) -> Behaviour:
    return Behaviour("error", status=status, message=message or f"fake error {status}",
                     retry_after=None if retry_after is None else str(retry_after), delay_s=delay_s)


def raw(status: int, body: Any, delay_s: float = 0.0) -> Behaviour:
    return Behaviour("raw", status=status, body_json=json.dumps(body), delay_s=delay_s)


_SHORTCUTS = {
    "ok": ok(),
    "slow": slow(),
    "no_usage": Behaviour("no_usage"),
    "garbled": Behaviour("garbled"),
    "no_choices": Behaviour("no_choices"),
    "drop": Behaviour("drop"),
    "400": error(400, "bad request: max_tokens must be positive"),
    "429": error(429, "rate limit reached", retry_after="1"),
    "500": error(500, "internal server error"),
    "503": error(503, "server overloaded", retry_after="1"),
}


def as_behaviour(b: Behaviour | str) -> Behaviour:
    if isinstance(b, Behaviour):
        return b
    try:
        return _SHORTCUTS[b]
    except KeyError:
        raise ValueError(f"unknown behaviour {b!r}; known: {sorted(_SHORTCUTS)}") from None


def default_answer(body: dict[str, Any], n: int) -> str:
    messages = body.get("messages") or [{}]
    return f"echo: {messages[-1].get('content', '')}"


def _words(s: Any) -> int:
    return len(s.split()) if isinstance(s, str) else 0


class FakeOpenAIServer:
    def __init__(self, model: str = "fake-model", default: Behaviour | str = "ok",
                 answer_fn: Callable[[dict[str, Any], int], str] = default_answer,
                 host: str = "127.0.0.1", port: int = 0,
                 on_request: Callable[[dict[str, Any], int, dict[str, str]], None] | None = None,
                 behaviour_fn: Callable[[dict[str, Any]], Behaviour | str | None] | None = None) -> None:
        self.model = model
        self.on_request = on_request  # (body, n, headers) of every chat request, before it is answered
        # by content: a behaviour for this request body (a server that chokes on some prompts), None for the usual
        self.behaviour_fn = behaviour_fn
        self.default = as_behaviour(default)
        self.answer_fn = answer_fn
        self._host, self._port = host, port
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._queue: deque[Behaviour] = deque()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.reset()

    # ---------------------------------------------------------------- control

    def reset(self) -> None:
        with self._lock:
            self._queue.clear()
            self.request_count = 0  # chat requests received (whatever their outcome)
            self.other_requests = 0  # anything else (GET /models, ...)
            self.in_flight = 0
            self.max_in_flight = 0
            self.requests: list[dict[str, Any]] = []  # chat request bodies, in arrival order
            self.headers: list[dict[str, str]] = []  # their headers

    def script(self, *behaviours: Behaviour | str) -> "FakeOpenAIServer":
        """Queue behaviours for the next chat requests; afterwards `default` applies again."""
        with self._lock:
            self._queue.extend(as_behaviour(b) for b in behaviours)
        return self

    @property
    def default(self) -> Behaviour:
        """What chat requests get once the script is used up (assign a Behaviour or a shortcut)."""
        return self._default

    @default.setter
    def default(self, b: Behaviour | str) -> None:
        self._default = as_behaviour(b)

    @property
    def port(self) -> int:
        assert self._httpd is not None, "server not started"
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://{self._host}:{self.port}/v1"

    def start(self) -> "FakeOpenAIServer":
        server = self

        class Handler(_Handler):
            fake = server

        self._stop.clear()
        self._httpd = ThreadingHTTPServer((self._host, self._port), Handler)
        self._httpd.daemon_threads = True
        self._httpd.block_on_close = False
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-openai-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()  # wakes handlers sleeping in slow replies
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = self._thread = None

    def __enter__(self) -> "FakeOpenAIServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ---------------------------------------------------------------- used by the handler

    def _next(self, body: dict[str, Any], headers: dict[str, str]) -> tuple[Behaviour, int]:
        with self._lock:
            self.request_count += 1
            self.requests.append(body)
            self.headers.append(headers)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            chosen = self.behaviour_fn(body) if self.behaviour_fn is not None else None
            if chosen is not None:
                b = as_behaviour(chosen)
            else:
                b = self._queue.popleft() if self._queue else self._default
            n = self.request_count
        if self.on_request is not None:
            self.on_request(body, n, headers)
        return b, n

    def _done(self) -> None:
        with self._lock:
            self.in_flight -= 1

    def _completion(self, body: dict[str, Any], n: int, with_usage: bool = True) -> dict[str, Any]:
        text = self.answer_fn(body, n)
        out: dict[str, Any] = {
            "id": f"chatcmpl-fake-{n}",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", self.model),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": "stop"}],
        }
        if with_usage:
            pt = sum(_words(m.get("content")) for m in body.get("messages") or [] if isinstance(m, dict))
            ct = _words(text)
            out["usage"] = {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct}
        return out


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as real servers do
    disable_nagle_algorithm = True  # headers and body go out in separate writes: avoid 40 ms delayed-ACK stalls
    fake: FakeOpenAIServer

    def log_message(self, format: str, *args: Any) -> None:  # silence
        pass

    def _send(self, status: int, payload: bytes, headers: dict[str, str] | None = None,
              content_type: str = "application/json") -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
            self.close_connection = True

    def _json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(obj).encode(), headers)

    def do_GET(self) -> None:
        with self.fake._lock:
            self.fake.other_requests += 1
        if self.path.rstrip("/") == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": self.fake.model, "object": "model"}]})
        else:
            self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if self.path.rstrip("/") != "/v1/chat/completions":
            with self.fake._lock:
                self.fake.other_requests += 1
            self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
            return
        try:
            body = json.loads(raw)
        except ValueError:
            body = {"_unparseable": raw.decode("utf-8", "replace")}
        b, n = self.fake._next(body, dict(self.headers.items()))
        try:
            if b.delay_s > 0 and self.fake._stop.wait(b.delay_s):
                self.close_connection = True
                return
            if b.kind == "drop":
                self.close_connection = True
                return
            if b.kind == "error":
                headers = {"Retry-After": b.retry_after} if b.retry_after is not None else None
                self._json(b.status, {"error": {"message": b.message, "type": "fake_error", "code": b.status}},
                           headers)
            elif b.kind == "raw":
                self._send(b.status, b.body_json.encode())
            elif b.kind == "garbled":
                self._send(200, b'{"choices": [{"message": {"content": "trunc', content_type="application/json")
            elif b.kind == "no_choices":
                self._json(200, {"id": f"chatcmpl-fake-{n}", "object": "chat.completion", "model": self.fake.model})
            elif b.kind == "no_usage":
                self._json(200, self.fake._completion(body, n, with_usage=False))
            else:
                self._json(200, self.fake._completion(body, n))
        finally:
            self.fake._done()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--model", default="fake-model")
    ap.add_argument("--delay", type=float, default=0.0, help="every chat reply takes this many seconds")
    ap.add_argument("--log", default=None, help="append one JSON line per chat request received to this file")
    ap.add_argument("--die-after", type=int, default=None,
                    help="exit at once (no reply) when chat request N + 1 arrives")
    args = ap.parse_args(argv)
    log = open(args.log, "a", encoding="utf-8") if args.log else None  # noqa: SIM115 (lives as long as the server)
    log_lock = threading.Lock()

    def on_request(body: dict[str, Any], n: int, headers: dict[str, str]) -> None:
        if args.die_after is not None and n > args.die_after:
            os._exit(3)  # the endpoint dies mid-call: the client sees its connection dropped
        if log is not None:
            key = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
            with log_lock:
                log.write(json.dumps({"n": n, "key": key, "ua": headers.get("User-Agent", "")}) + "\n")
                log.flush()

    srv = FakeOpenAIServer(model=args.model, port=args.port, default=ok(args.delay), on_request=on_request).start()
    print(f"PORT {srv.port}", flush=True)
    try:
        # Serve until stdin closes or we are interrupted (the parent kills us or closes the pipe).
        sys.stdin.read()
    except KeyboardInterrupt:
        pass
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
