"""Test doubles for the executor LLM, used where a test checks our own logic around it (the RPC, the
sandbox, accounting) and the model's words do not matter. Tests of real behaviour use the bundled model."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import tempfile
import threading
from dataclasses import dataclass

from spogw_dagster.executors.base import ExecutorError
from spogw_dagster.contracts import ChatResult, SamplingParams, Status


class ScriptedExecutor:
    """Answers every call with `reply` (or replies[i] in turn); can fail from the `fail_from`-th call on."""

    def __init__(self, reply: str = "The answer is \\boxed{42}", replies: list[str] | None = None,
                 fail_from: int | None = None):
        self.model = "scripted"
        self.reply = reply
        self.replies = list(replies or [])
        self.fail_from = fail_from
        self.calls: list[tuple[list[dict], SamplingParams]] = []

    async def chat(self, messages, params):
        self.calls.append((messages, params))
        if self.fail_from is not None and len(self.calls) >= self.fail_from:
            raise ExecutorError("scripted failure (HTTP 503)", status_code=503, attempts=3, retryable=True)
        text = self.replies[(len(self.calls) - 1) % len(self.replies)] if self.replies else self.reply
        return ChatResult(text=text, prompt_tokens=7, completion_tokens=3, latency_s=0.001, model=self.model)

    async def aclose(self):
        pass


class SlowExecutor(ScriptedExecutor):
    """Answers after `delay` seconds (a slow or retrying endpoint)."""

    def __init__(self, delay: float, **kw):
        super().__init__(**kw)
        self.delay = delay

    async def chat(self, messages, params):
        import asyncio

        await asyncio.sleep(self.delay)
        return await super().chat(messages, params)


class BrokenExecutor(ScriptedExecutor):
    """Raises `exc` from every call (a bug or an unexpected failure inside an executor)."""

    def __init__(self, exc: BaseException, **kw):
        super().__init__(**kw)
        self.exc = exc

    async def chat(self, messages, params):
        self.calls.append((messages, params))
        raise self.exc


@dataclass
class RunResult:
    status: Status
    returncode: int | None
    stdout: str
    stderr: str


async def local_run(program: str, timeout: float = 30.0) -> RunResult:
    """Run trusted code in a fresh interpreter (stdlib only), like the sandbox would, minus isolation.

    For tests of the scorers' own logic (test programs, pass tokens); the real sandbox is tested elsewhere."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "prog.py")
        with open(path, "w") as f:
            f.write(program)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-S", path, cwd=d,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            return RunResult(Status.TIMEOUT, None, "", "wall-clock limit")
        status = Status.OK if proc.returncode == 0 else Status.RUNTIME_ERROR
        return RunResult(status, proc.returncode, out.decode(), err.decode())


@contextlib.contextmanager
def connection_recorder(backlog: int = 16):
    """A TCP server on 127.0.0.1 that records every connection: no sandboxed code may reach it.
    Yields (port, hits)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(backlog)
    srv.settimeout(0.2)
    hits: list[str] = []
    stop = threading.Event()

    def loop():
        while not stop.is_set():
            try:
                conn, addr = srv.accept()
                hits.append(str(addr))
                conn.close()
            except OSError:
                continue

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield srv.getsockname()[1], hits
    finally:
        stop.set()
        t.join(2)
        srv.close()
