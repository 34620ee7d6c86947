"""The embedded executor: a local GGUF (default: the bundled SmolLM2-135M-Instruct) served by a supervised
llama.cpp server child process on 127.0.0.1.

Out of process, so that a native crash in llama.cpp (a build for another CPU, a bug) never takes the Dagster
step or `spogw run` down with it: the crash is an `ExecutorError` (kind "crash") whose message names the cause
and the fix, the child is restarted for the next calls, and the outage rules of the callers apply as for any
endpoint. The calls go through the same OpenAI-compatible client as a served executor (`openai_compat.py`).
At start, the child answers one multi-token prompt (the self-check: the crashing AMX builds failed exactly
there) before any workflow call, so a broken runtime fails fast with that message.

Parallel, and reproducible: `workers` single-thread servers (default: one per core), each decoding one call at
a time, behind a least-loaded router. Concurrent calls of concurrently running workflows are answered side by
side instead of one after another behind a lock, and every call is computed alone on one thread, whichever
worker takes it and whatever else is in flight, so a seeded call gives the same text in every run: the call
cache and per-call seeds keep their meaning, and a rerun after a crash reproduces the calls it had not made yet.
(Continuous batching of several calls in one server was measured too, `bench/executor_throughput.py`: it is no
faster for the bundled model on 2 cores, and batching changes the float rounding, so 6 of 8 seeded calls gave
another text when co-scheduled than alone.)

The model id (`<file stem>@<sha256[:12]>` of the GGUF's content) and the empty cache namespace do not change
with the port, the workers or the process, so the cache entries of earlier runs still match.

One server per (model file, settings) per process, shared by every executor session of that process (the
pipeline opens one per asyncio.run); it ends with the process (atexit, and PR_SET_PDEATHSIG if the process is
killed).
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from ..bundled_models import gguf_path as bundled_gguf
from ..bundled_models import verified_sha256
from ..children import die_with_parent
from ..contracts import ChatResult, SamplingParams
from ..fsutil import file_sha256
from .base import ExecutorError, RequestFaultError
from .llama_runtime import INSTALL_HINT, Runtime, cpu_features, find_runtime, host_cpu_flags
from .openai_compat import OpenAICompatExecutor

log = logging.getLogger(__name__)

DEFAULT_WORKERS = max(1, len(os.sched_getaffinity(0)))  # the cores this process may use, not the machine's
# The faster, non-reproducible mode's server flags: prompt-lookup (n-gram) speculation drafts tokens from the text
# so far (the prompt included), which a reply that copies its input (a repair, a function's docstring) accepts.
# Verifying a draft in one batch rounds differently from one token at a time, so texts may differ.
FAST_SERVER_ARGS: tuple[str, ...] = ("--spec-type", "ngram-simple")
SELF_CHECK_PROMPT = ("Write one short Python function that returns the sum of a list of integers, "
                     "and explain it in a sentence.")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_die_with_parent = die_with_parent(signal.SIGKILL)


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "is running"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"died of {name}"
    return f"exited with status {returncode}"


class RuntimeCrashError(ExecutorError):
    """The llama.cpp child died (a native crash, or killed): our infrastructure, never the workflow's fault."""


class LlamaServer:
    """One supervised `llama-server` child: start (with the self-check), crash detection, restart, stop.

    Thread-safe; processes are spawned from one long-lived thread of its own, because PR_SET_PDEATHSIG fires
    when the *thread* that forked ends (an asyncio.to_thread worker ends with its event loop)."""

    def __init__(self, gguf: Path, *, n_ctx: int = 8192, slots: int = 1, threads: int | None = None,
                 runtime: Runtime | None = None, max_restarts: int = 5, ready_timeout_s: float = 120.0,
                 extra_args: tuple[str, ...] = ()) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.gguf = gguf
        self.n_ctx = int(n_ctx)
        self.slots = int(slots)
        self.threads = int(threads or max(1, os.cpu_count() or 1))
        self.runtime = runtime or find_runtime()
        self.max_restarts = max_restarts
        self.ready_timeout_s = ready_timeout_s
        self.extra_args = tuple(extra_args)
        self.generation = 0          # bumps at every (re)start; a call remembers the one it was sent to
        self.crashes: list[str] = []  # why each earlier child ended
        self.system_info = ""
        self.url = ""
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._spawner = ThreadPoolExecutor(1, thread_name_prefix="llama-server")
        self._logdir = Path(tempfile.mkdtemp(prefix="spogw-llama-"))
        self._log_path = self._logdir / "server.log"
        self._given_up: str | None = None

    # ------------------------------------------------------------------ facts

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def features(self) -> list[str]:
        return cpu_features(self.system_info)

    def info(self) -> dict[str, Any]:
        return {"runtime": self.runtime.describe(), "model_file": str(self.gguf), "slots": self.slots,
                "threads": self.threads, "n_ctx_per_slot": self.n_ctx, "cpu_features_used": self.features(),
                "system_info": self.system_info.strip(), "restarts": len(self.crashes),
                "crashes": list(self.crashes)}

    def _log_tail(self, n: int = 12) -> str:
        try:
            lines = self._log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return " | ".join(ln.strip() for ln in lines[-n:] if ln.strip())

    def crash_message(self, what: str) -> str:
        feats = " ".join(self.features()) or "unknown"
        host = host_cpu_flags()
        amx = sorted(f for f in host if f.startswith("amx"))
        hint = (f"; the host CPU has {' '.join(amx)}: a build compiled with -march=native there crashes in the AMX "
                "buffer type" if amx and any(f.startswith("AMX") for f in self.features()) else "")
        if "SIGKILL" in what:
            cause = "it was killed (SIGKILL: the kernel's out-of-memory killer, or a user)"
        elif "exited with status" in what:
            cause = "it exited by itself (a flag this binary does not know, a port taken, a bad model file)"
        else:
            cause = "a native crash in llama.cpp"
        own = self.runtime.tag == "own"
        fix = (f"unset SPOGW_LLAMA_SERVER (your binary {self.runtime.binary}) to use the portable build from "
               f"`{INSTALL_HINT}`" if own else
               f"rebuild the portable runtime: `{INSTALL_HINT} --force`")
        tail = self._log_tail()
        return (f"the embedded executor's llama.cpp server ({self.runtime.binary}, build {self.runtime.tag}, CPU "
                f"features used: {feats}) {what}: {cause}, not the workflow's doing{hint}. "
                f"Fix: {fix}; if it persists, serve the model elsewhere and set executor.url."
                + (f" Last log lines: {tail}" if tail else ""))

    # ------------------------------------------------------------------ lifecycle

    def _spawn(self) -> subprocess.Popen:
        self._logdir.mkdir(parents=True, exist_ok=True)
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        cmd = [str(self.runtime.binary), "--model", str(self.gguf), "--host", "127.0.0.1", "--port", str(port),
               "--ctx-size", str(self.n_ctx * self.slots), "--parallel", str(self.slots), "--no-kv-unified",
               "--threads", str(self.threads), "--threads-batch", str(self.threads), "--cont-batching",
               "--no-webui", "--alias", self.gguf.stem,
               # no RAM cache of other prompts' states: its default (8 GiB per server) grew each worker to 1 GB in
               # 20 minutes of tiny; a slot still reuses its own previous prompt's prefix
               "--cache-ram", "0",
               "-lv", "4",  # verbosity 4 is the first that prints system_info (the CPU features in use)
               *self.extra_args]
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("LLAMA_", "OPENAI", "HF_")) and k != "OMP_WAIT_POLICY"}
        # libgomp's default (spin briefly, then sleep) for llama.cpp's threads, which sync at every op: PASSIVE (what
        # this package sets for torch) made decoding 3x slower (33 vs 89 tok/s), ACTIVE keeps a core busy while idle.
        with open(self._log_path, "ab") as fh:
            return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    preexec_fn=_die_with_parent, close_fds=True)

    def _wait_ready(self, proc: subprocess.Popen) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeCrashError(self.crash_message(f"{describe_exit(proc.returncode)} while loading the model"),
                                        kind="crash")
            try:
                r = httpx.get(f"{self.url}/health", timeout=2.0)
                if r.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise ExecutorError(f"the embedded llama.cpp server did not become ready in {self.ready_timeout_s:g}s; "
                                    f"last log lines: {self._log_tail()}", kind="timeout")
            time.sleep(0.1)

    def _self_check(self, proc: subprocess.Popen) -> None:
        body = {"messages": [{"role": "user", "content": SELF_CHECK_PROMPT}], "max_tokens": 4, "temperature": 0.0,
                "seed": 0}
        try:
            r = httpx.post(f"{self.url}/v1/chat/completions", json=body, timeout=120.0)
            ok = r.status_code == 200 and (r.json().get("usage") or {}).get("prompt_tokens", 0) > 1
        except (httpx.HTTPError, ValueError):
            ok = False
            r = None
        if ok:
            return
        try:
            proc.wait(2.0)
        except subprocess.TimeoutExpired:
            pass
        if proc.poll() is not None:
            raise RuntimeCrashError(self.crash_message(
                f"{describe_exit(proc.returncode)} on its self-check (one multi-token prompt)"), kind="crash")
        raise ExecutorError(f"the embedded llama.cpp server failed its self-check: "
                            f"{getattr(r, 'status_code', 'no reply')} {getattr(r, 'text', '')[:300]}")

    def _start_locked(self) -> None:
        try:
            proc = self._spawner.submit(self._spawn).result()
        except OSError as e:  # the binary vanished or cannot run: still only an ExecutorError leaves `chat`
            self._proc = None
            raise RuntimeCrashError(f"cannot start the embedded llama.cpp server {self.runtime.binary}: {e}; fix: "
                                    f"`{INSTALL_HINT}`", kind="crash") from None
        self._proc = proc
        self.generation += 1
        try:
            self._wait_ready(proc)
            self._self_check(proc)
        except BaseException:
            self._kill(proc)
            self._proc = None  # nothing live; the next ensure_running starts afresh
            raise
        try:
            text = self._log_path.read_text(errors="replace")
        except OSError:
            text = ""
        self.system_info = next((ln for ln in reversed(text.splitlines()) if "system_info" in ln), "")
        log.info("embedded llama.cpp server pid %s at %s (%s slots, %s threads; %s)", proc.pid, self.url,
                 self.slots, self.threads, " ".join(self.features()))

    def start(self) -> None:
        with self._lock:
            if self._proc is None:
                self._start_locked()

    @property
    def given_up(self) -> bool:
        return self._given_up is not None

    def running(self) -> bool:
        proc = self._proc
        return proc is not None and proc.poll() is None

    def dead(self, generation: int) -> str | None:
        """Why the child a call was sent to (its generation) ended, or None while it runs."""
        with self._lock:
            if generation != self.generation:
                return self.crashes[generation - 1] if 0 < generation <= len(self.crashes) else "was restarted"
            if self._proc is None or self._proc.poll() is None:
                return None
            return describe_exit(self._proc.returncode)

    def ensure_running(self) -> int:
        """Restart a dead child (at most `max_restarts` times in this process); returns the live generation."""
        with self._lock:
            if self._given_up:
                raise RuntimeCrashError(self._given_up, kind="crash")
            if self._proc is not None and self._proc.poll() is None:
                return self.generation
            if self._proc is not None:
                self.crashes.append(describe_exit(self._proc.returncode))
                log.warning("embedded llama.cpp server pid %s %s; restarting", self._proc.pid, self.crashes[-1])
                if len(self.crashes) > self.max_restarts:
                    self._given_up = self.crash_message(
                        f"ended {len(self.crashes)} times in this process ({', '.join(self.crashes)}); not restarted "
                        "again")
                    raise RuntimeCrashError(self._given_up, kind="crash")
            try:
                self._start_locked()
            except RuntimeCrashError as e:
                self.crashes.append("crashed while starting")
                if len(self.crashes) > self.max_restarts:
                    self._given_up = str(e)
                raise
            return self.generation

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def stop(self) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is not None:
            self._kill(proc)
        shutil.rmtree(self._logdir, ignore_errors=True)


_SERVERS: dict[tuple, list[LlamaServer]] = {}
_SERVERS_LOCK = threading.Lock()


def shared_workers(gguf: Path, *, n_ctx: int, workers: int, threads: int, runtime: Runtime | None = None,
                   extra_args: tuple[str, ...] = ()) -> list[LlamaServer]:
    """The process's single-slot workers for these settings, started (and self-checked) on first use."""
    runtime = runtime or find_runtime()
    key = (str(gguf.resolve()), n_ctx, workers, threads, runtime.tag, extra_args)
    with _SERVERS_LOCK:
        ws = _SERVERS.get(key)
        if ws is None:
            ws = [LlamaServer(gguf, n_ctx=n_ctx, slots=1, threads=threads, runtime=runtime, extra_args=extra_args)
                  for _ in range(workers)]
            _SERVERS[key] = ws
    for w in ws:
        w.start()
    return ws


def runtime_report() -> list[dict[str, Any]]:
    """What the embedded servers of this process run on (build, CPU features used, slots, restarts), for
    metadata; [] when no embedded model was used (an endpoint)."""
    with _SERVERS_LOCK:
        return [srv.info() for ws in _SERVERS.values() for srv in ws]


@atexit.register
def _stop_all() -> None:
    for srv in [srv for ws in list(_SERVERS.values()) for srv in ws]:
        try:
            srv.stop()
        except Exception:
            pass


class EmbeddedExecutor:
    """`Executor` on a local GGUF file (default: the bundled SmolLM2) served by supervised llama.cpp children:
    `workers` single-slot servers of `threads` threads each (default: one single-thread worker per core), or the
    given `servers`. `model` names the file's content, not the processes or ports.

    `reproducible` (the default): the portable build, each call computed alone, so a seeded call's text is the same
    on any x86-64 CPU. False: the best runtime variant built for this CPU and n-gram speculation; `numerics` then
    names them, and the call cache keys such calls apart from the reproducible mode's."""

    def __init__(self, gguf_path: str | os.PathLike | None = None, *, n_ctx: int = 8192, workers: int | None = None,
                 threads: int | None = None, timeout_s: float = 600.0, servers: list[LlamaServer] | None = None,
                 reproducible: bool = True):
        path = Path(gguf_path) if gguf_path else bundled_gguf("smollm2")
        if not path.is_file():
            raise FileNotFoundError(f"GGUF model file not found: {path}")
        self.path = path

        self.model = f"{path.stem}@{(verified_sha256(path) or file_sha256(path))[:12]}"
        self.numerics = ""  # the reproducible mode's: every earlier cache entry was made in it
        if servers:
            for srv in servers:
                srv.start()
            self.workers = list(servers)
        else:
            runtime = find_runtime(fastest=not reproducible)
            extra = () if reproducible else FAST_SERVER_ARGS
            if not reproducible:
                self.numerics = f"{runtime.variant}:{runtime.tag} {' '.join(extra)}"
            self.workers = shared_workers(path, n_ctx=n_ctx, workers=workers or DEFAULT_WORKERS, threads=threads or 1,
                                          runtime=runtime, extra_args=extra)
        self.timeout_s = timeout_s
        self.max_concurrency = sum(w.slots for w in self.workers)
        self._clients: dict[str, Any] = {}
        self._in_flight = [0] * len(self.workers)
        self._picks = [0] * len(self.workers)
        self.crash_errors = 0  # calls that failed because their child died under them

    @property
    def server(self) -> LlamaServer:  # the first worker (one-worker callers and tests)
        return self.workers[0]

    def runtime_info(self) -> dict[str, Any]:
        infos = [w.info() for w in self.workers]
        return {**infos[0], "workers": len(infos), "pids": [w.pid for w in self.workers],
                "restarts": sum(i["restarts"] for i in infos), "crashes": [c for i in infos for c in i["crashes"]],
                "served_per_worker": list(self._picks), "crash_errors": self.crash_errors}

    def _client(self, srv: LlamaServer):
        url = srv.url
        c = self._clients.get(url)
        if c is None:
            # Few retries: a dead local child is detected by us, not waited out; a live one does not flake.
            # cache_prompt false: every call computes its whole prompt, so its text cannot depend on which call
            # ran before it on this worker (a reused prefix is computed in another split of the batch)
            c = OpenAICompatExecutor(f"{url}/v1", self.path.stem, api_key_env=None, max_concurrency=srv.slots,
                                     timeout_s=self.timeout_s, max_retries=1, backoff_base_s=0.05, backoff_max_s=0.2,
                                     extra_body={"cache_prompt": False})
            self._clients[url] = c
        return c

    def _pick(self) -> int:
        # fewest calls in flight (queued on its slot included), ties to the least used: no await in between
        live = [j for j in range(len(self.workers)) if not self.workers[j].given_up] or list(range(len(self.workers)))
        i = min(live, key=lambda j: (self._in_flight[j], self._picks[j]))  # a given-up worker only when all are
        self._picks[i] += 1
        return i

    async def chat(self, messages: list[dict], params: SamplingParams) -> ChatResult:
        i = self._pick()
        srv = self.workers[i]
        self._in_flight[i] += 1
        try:
            if not srv.running():  # died since its last call: restart before sending, not after failing
                await asyncio.to_thread(srv.ensure_running)
            gen = srv.generation
            try:
                result = await self._client(srv).chat(messages, params)
            except RequestFaultError:
                raise
            except ExecutorError:
                why = await asyncio.to_thread(srv.dead, gen)
                if why is None:
                    raise
                self.crash_errors += 1
                msg = srv.crash_message(f"{why} during a call")
                try:  # restart now, so later calls find a live child; this call stays failed (not the workflow's)
                    await asyncio.to_thread(srv.ensure_running)
                except ExecutorError as restart_error:
                    msg += f" Restart failed: {restart_error}"
                raise RuntimeCrashError(msg, kind="crash") from None
        finally:
            self._in_flight[i] -= 1
        return dataclasses.replace(result, model=self.model)

    async def aclose(self) -> None:
        clients, self._clients = self._clients, {}
        for c in clients.values():
            await c.aclose()
