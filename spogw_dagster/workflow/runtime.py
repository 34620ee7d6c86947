"""Run one workflow on one query: validate, start the sandboxed runner, serve its operator calls.

The child process speaks JSON lines (see sandbox/runner.py). Everything that decides a status happens
here, in the parent: the child's own report is believed only for what it can know (its exception), and
an executor failure seen by the parent makes the run `executor_error` even if the workflow caught it.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..executors.base import ExecutorError, MeteredExecutor
from ..isolation import Isolation, Limits, runner_path, signal_status, spawn
from ..types import Problem, Status, Usage
from .operators import BudgetExceeded, OperatorCallError, OperatorConfig, Operators, derive_seed
from .parser import ALLOWED_IMPORTS, SAFE_BUILTINS, ValidationLimits, WorkflowRejected, validate
from .template import operator_names

RUNNER_IN_SANDBOX = "/sandbox/runner.py"
DEFAULT_LIMITS = Limits(wall_s=180, cpu_s=30, memory_mb=1024, nproc=16, max_output_bytes=4_000_000)


@dataclass
class WorkflowRunResult:
    status: Status
    answer: str = ""
    error: str = ""
    usage: Usage = field(default_factory=Usage)
    operator_calls: int = 0
    isolation: str = ""
    wall_s: float = 0.0
    trace: list[dict[str, Any]] = field(default_factory=list)


class _Stop(Exception):
    def __init__(self, status: Status, error: str):
        self.status, self.error = status, error


async def execute_workflow(
    code: str,
    problem: Problem,
    executor,
    iso: Isolation,
    *,
    seed: int = 0,
    op_cfg: OperatorConfig = OperatorConfig(),
    limits: Limits = DEFAULT_LIMITS,
    validation: ValidationLimits = ValidationLimits(),
    validate_code: bool = True,
    runner: Path | None = None,
) -> WorkflowRunResult:
    """Execute `code` (workflow source) on `problem` in the sandbox. Never raises for workflow faults.

    validate_code=False skips the AST allow-list so that tests can show the sandbox holds on its own
    (the second wall); the pipeline always validates. `runner` replaces the child-side runner script
    (tests use it to play a misbehaving child).
    """
    t0 = time.monotonic()
    if validate_code:
        try:
            validate(code, problem.family, validation)
        except WorkflowRejected as e:
            return WorkflowRunResult(e.status, error=e.reason, isolation=iso.kind, wall_s=time.monotonic() - t0)

    metered = MeteredExecutor(executor)
    ops = Operators(problem, metered, iso, op_cfg, derive_seed(seed, problem.benchmark, problem.id, code),
                    operator_names(problem.family))
    script = str(runner or runner_path())
    argv = [sys.executable, "-I", "-S", RUNNER_IN_SANDBOX if iso.kind != "none" else script]
    sp = await spawn(iso, argv, limits, [(script, RUNNER_IN_SANDBOX)] if iso.kind == "bwrap" else [])
    stderr = bytearray()
    status, answer, error = Status.RUNTIME_ERROR, "", ""
    executor_failed: str | None = None
    tasks: set[asyncio.Task] = set()

    async def drain_stderr() -> None:
        while chunk := await sp.proc.stderr.read(65536):
            if len(stderr) < 65536:
                stderr.extend(chunk[: 65536 - len(stderr)])

    def send(obj: dict) -> None:
        if sp.proc.stdin.is_closing():
            return
        try:
            sp.proc.stdin.write((json.dumps(obj) + "\n").encode())
        except (BrokenPipeError, ConnectionResetError):
            pass

    async def serve(msg: dict) -> None:
        nonlocal executor_failed
        call_id = msg.get("id")
        try:
            value = await ops.call(str(msg.get("op")), list(msg.get("args") or []), dict(msg.get("kwargs") or {}))
            send({"type": "reply", "id": call_id, "ok": True, "value": value})
        except ExecutorError as e:
            executor_failed = str(e)
            raise _Stop(Status.EXECUTOR_ERROR, f"executor failed: {e}") from None
        except BudgetExceeded as e:
            raise _Stop(Status.RUNTIME_ERROR, str(e)) from None
        except OperatorCallError as e:
            send({"type": "reply", "id": call_id, "ok": False, "error": str(e)})

    async def converse() -> tuple[Status, str, str]:
        init = {"type": "init", "code": code, "operators": list(operator_names(problem.family)),
                "builtins": sorted(SAFE_BUILTINS), "imports": sorted(ALLOWED_IMPORTS), "max_print_bytes": 65536}
        send(init)
        received = 0
        while True:
            try:
                line = await sp.proc.stdout.readline()
            except (asyncio.LimitOverrunError, ValueError):
                return Status.SANDBOX_VIOLATION, "", "protocol line too long"
            if not line:
                await sp.proc.wait()
                by_signal = signal_status(sp.proc.returncode)
                tail = stderr.decode(errors="replace").strip()[-300:]
                if by_signal == Status.TIMEOUT:
                    return Status.TIMEOUT, "", "CPU-time limit exceeded"
                return Status.RUNTIME_ERROR, "", f"workflow process exited without a result (rc={sp.proc.returncode}) {tail}".strip()
            received += len(line)
            if received > limits.max_output_bytes:
                return Status.SANDBOX_VIOLATION, "", "protocol output limit exceeded"
            try:
                msg = json.loads(line)
                kind = msg["type"]
            except (ValueError, KeyError, TypeError):
                return Status.SANDBOX_VIOLATION, "", "malformed message on the protocol channel"
            if kind == "call":
                task = asyncio.create_task(serve(msg))
                tasks.add(task)
                task.add_done_callback(_check_task)
            elif kind == "result":
                ans = msg.get("answer")
                if not isinstance(ans, str):
                    return Status.SANDBOX_VIOLATION, "", "result is not a string"
                return Status.OK, ans, ""
            elif kind == "error":
                return Status.RUNTIME_ERROR, "", str(msg.get("message", ""))[:2000]
            else:
                return Status.SANDBOX_VIOLATION, "", f"unknown message type {kind!r}"

    stop: asyncio.Future = asyncio.get_running_loop().create_future()

    def _check_task(task: asyncio.Task) -> None:
        tasks.discard(task)
        if not task.cancelled() and isinstance(task.exception(), _Stop) and not stop.done():
            stop.set_result(task.exception())

    drain = asyncio.create_task(drain_stderr())
    conv = asyncio.create_task(converse())
    try:
        done, _ = await asyncio.wait({conv, stop}, timeout=limits.wall_s, return_when=asyncio.FIRST_COMPLETED)
        if stop in done:
            s: _Stop = stop.result()
            status, error = s.status, s.error
        elif conv in done:
            status, answer, error = conv.result()
        else:
            status, error = Status.TIMEOUT, f"wall-clock limit of {limits.wall_s}s exceeded"
    finally:
        for t in [conv, *tasks]:
            t.cancel()
        await sp.close()
        drain.cancel()
        await asyncio.gather(conv, drain, *tasks, return_exceptions=True)
    if executor_failed is not None:  # even if the workflow caught the failed call: not the workflow's fault
        status, answer, error = Status.EXECUTOR_ERROR, "", f"executor failed: {executor_failed}"
    return WorkflowRunResult(status, answer, error, metered.usage, ops.operator_calls, iso.kind,
                             time.monotonic() - t0, ops.trace)
