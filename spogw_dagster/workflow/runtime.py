"""Run one workflow on one query: validate, start the sandboxed runner, serve its operator calls.

The child process speaks JSON lines (see sandbox/runner.py). Everything that decides a status happens
here, in the parent: the child's own report is believed only for what it can know (its exception), and
an executor failure seen by the parent makes the run `executor_error` even if the workflow caught it.

This is the one place that sets `executor_error`, the status that removes a row from training groups and
metrics (see `contracts.Status`), and only for causes outside the workflow and its answer:

- the executor failed on a request whose content is not the cause (`ExecutorError` but not
  `RequestFaultError`: the attributing executor sent a control request, and it failed too);
- our sandbox did not start (it could not be spawned; the runner never said it was ready; a code sandbox
  never came up).

Operator calls in flight for 10x the operator-time budget while served for less (an overloaded executor, or
our own operator code stalling on some input) end as an internal `runtime_error`, not `executor_error`: a
policy might find an input that stalls our code, and a stall must never be free.

Everything the child sends is made valid text first (`contracts.clean_json`), so nothing a workflow passes
or returns can fail an encoder further on. A request fault is replied to the workflow as an operator error
(it may catch it; uncaught, the run is a `runtime_error`), and a bug of ours that a workflow's input trips
ends the run as a `runtime_error` whose error starts with INTERNAL_ERROR (logged and counted, not excluded).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..benchmarks import scored_text, tested_names
from ..contracts import Problem, Status, Usage, clean_json
from ..executors.base import ExecutorError, MeteredExecutor, PromptTooLongError, RequestFaultError
from ..sandboxing import Isolation, Limits, SandboxStartError, runner_path, signal_status, spawn
from ..seeds import derive_seed
from .operators import BudgetExceeded, OperatorCallError, OperatorConfig, Operators
from .parser import ALLOWED_IMPORTS, SAFE_BUILTINS, ValidationLimits, WorkflowRejected, validate
from .provenance import Origin, Provenance, workflow_literals
from .template import PRODUCING_OPERATORS, operator_names

log = logging.getLogger(__name__)

INTERNAL_ERROR = "internal error"  # prefix of the error of a run that tripped a bug of ours (runtime_error)
# Operator calls may be in flight unserved (waiting for a free executor, or our own code working) this many
# times the operator-time budget before the run is abandoned as an internal error.
WAIT_BACKSTOP_FACTOR = 10
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
    # whose the final answer is (`workflow.provenance`): executor | workflow | none ("" when no answer)
    answer_origin: str = ""
    executor_share: float | None = None  # the executor-credited share of the answer's substance tokens
    # the origin by the rule that counted every token of a code answer, dead code included: for comparisons only
    whole_text_origin: Origin | None = None

    @property
    def produced(self) -> bool:
        """Whether the run called an operator that writes a solution (and got its output)."""
        return any(t["op"] in PRODUCING_OPERATORS for t in self.trace)


class _FaultTimer(MeteredExecutor):
    """The run's meter, plus the time of calls that failed on their own content (`fault_s`): they count
    toward the workflow's operator-time budget like served calls (else a workflow could spend unbounded
    executor time on requests that time out)."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.fault_s = 0.0

    async def chat(self, messages, params):
        t0 = time.monotonic()
        try:
            return await super().chat(messages, params)
        except RequestFaultError:
            self.fault_s += time.monotonic() - t0
            raise


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
            return WorkflowRunResult(e.status, error=e.reason, isolation=iso.name, wall_s=time.monotonic() - t0)

    metered = _FaultTimer(executor)
    code_family = problem.family == "code"
    prov = Provenance(workflow_literals(code), problem.question if code_family else None,
                      roots=tuple(sorted(tested_names(problem))) if code_family else (),
                      extract=None if code_family else functools.partial(scored_text, problem))
    # The run seed leaves the workflow out (common random numbers): the k-th executor call of any workflow on this
    # query and seed draws with the same seed, so two workflows that send the same prompt get the same reply, a
    # group's scores differ by structure rather than by the executor's luck, and a re-indented copy pairs exactly.
    ops = Operators(problem, metered, iso, op_cfg, derive_seed(seed, problem.benchmark, problem.id),
                    operator_names(problem.family), prov)
    script = str(runner or runner_path())
    inside, binds = iso.runner(script)
    try:
        sp = await spawn(iso, [sys.executable, "-I", "-S", inside], limits, binds)
    except SandboxStartError as e:  # EAGAIN, EMFILE, a missing binary: ours, before any workflow code ran
        return WorkflowRunResult(Status.EXECUTOR_ERROR, error=f"sandbox failed to start: {e}", isolation=iso.name,
                                 wall_s=time.monotonic() - t0)
    status, answer, error = await _Conversation(code, problem, sp, ops, metered, op_cfg, limits).run()
    result = WorkflowRunResult(status, answer, error, metered.usage, ops.operator_calls, iso.name,
                               time.monotonic() - t0, ops.trace)
    if status == Status.OK:
        scored = scored_text(problem, answer)
        origin = prov.origin_of(scored)
        result.answer_origin, result.executor_share = origin.origin, origin.share
        result.whole_text_origin = prov.whole_text_origin(scored)
    return result


class _Conversation:
    """One run's exchange with its sandboxed child: the protocol (init, ready, calls, the result), the operator
    calls it asks for (served concurrently), and the two time budgets the parent enforces."""

    def __init__(self, code: str, problem: Problem, sp, ops: Operators, metered: _FaultTimer,
                 op_cfg: OperatorConfig, limits: Limits) -> None:
        self.code, self.problem, self.sp, self.ops, self.metered = code, problem, sp, ops, metered
        self.op_cfg, self.limits = op_cfg, limits
        self.stderr = bytearray()
        self.executor_failed: str | None = None
        self.tasks: set[asyncio.Task] = set()
        self.inflight = 0  # operator calls being served right now
        self.op_time = 0.0  # seconds during which at least one operator call was in flight
        self.op_since = 0.0
        self.stop: asyncio.Future = asyncio.get_running_loop().create_future()

    async def run(self) -> tuple[Status, str, str]:
        """(status, answer, error) of the run; the child and every call in flight are gone when it returns."""
        drain = asyncio.create_task(self._drain_stderr())
        conv = asyncio.create_task(self._converse())
        try:
            status, answer, error = await self._supervise(conv)
        finally:
            for t in [conv, *self.tasks]:
                t.cancel()
            await self.sp.close()
            drain.cancel()
            await asyncio.gather(conv, drain, *self.tasks, return_exceptions=True)
        if self.executor_failed is not None:  # even if the workflow caught the failed call: not its fault
            return Status.EXECUTOR_ERROR, "", f"executor failed: {self.executor_failed}"
        return status, answer, error

    async def _drain_stderr(self) -> None:
        while chunk := await self.sp.proc.stderr.read(65536):
            if len(self.stderr) < 65536:
                self.stderr.extend(chunk[: 65536 - len(self.stderr)])

    def _send(self, obj: dict) -> None:
        if self.sp.proc.stdin.is_closing():
            return
        try:
            self.sp.proc.stdin.write((json.dumps(obj) + "\n").encode())
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _served_s(self) -> float:
        """Seconds this run's operator calls were served: executor replies, request faults, code runs."""
        return self.metered.usage.latency_s + self.metered.fault_s + self.ops.code_s

    def _over_budget(self) -> str | None:
        """Why the operator-time budget is spent, or None."""
        served = self._served_s()
        if served <= self.op_cfg.max_operator_wall_s:
            return None
        return (f"operator calls took {served:.0f}s of executor and sandbox time, over the budget of "
                f"{self.op_cfg.max_operator_wall_s:g}s")

    async def _serve(self, msg: dict) -> None:
        call_id = msg.get("id")
        op = str(msg.get("op"))
        spent = self._over_budget()
        if spent:  # a call starts only while the operator-time budget lasts
            raise _Stop(Status.TIMEOUT, spent)
        if self.inflight == 0:
            self.op_since = time.monotonic()
        self.inflight += 1
        try:
            value = await self.ops.call(op, list(msg.get("args") or []), dict(msg.get("kwargs") or {}))
            self._send({"type": "reply", "id": call_id, "ok": True, "value": value})
        except PromptTooLongError as e:  # the workflow built a prompt the executor cannot take: its fault
            self._reply_error(call_id, f"{op}: prompt too long for the executor ({e})")
        except RequestFaultError as e:  # the executor fails on this request but serves others: its content's fault
            self._reply_error(call_id, f"{op}: the executor failed on this request ({e})")
        except ExecutorError as e:
            self.executor_failed = str(e)
            raise _Stop(Status.EXECUTOR_ERROR, f"executor failed: {e}") from None
        except SandboxStartError as e:  # our infrastructure, not the workflow
            raise _Stop(Status.EXECUTOR_ERROR, f"sandbox failed while serving {op}: {e}") from None
        except BudgetExceeded as e:
            raise _Stop(Status.RUNTIME_ERROR, str(e)) from None
        except OperatorCallError as e:
            self._reply_error(call_id, str(e))
        except (RecursionError, MemoryError) as e:  # our parsing choked on a pathological workflow-made string
            self._reply_error(call_id, f"{op} failed on its input ({type(e).__name__})")
        except Exception as e:  # a bug of ours, tripped by this run's input: the run fails, loudly (never excluded)
            log.exception("internal error serving operator %s for %s", op, self.problem.id)
            raise _Stop(Status.RUNTIME_ERROR, f"{INTERNAL_ERROR} serving {op}: {type(e).__name__}: {e}") from None
        finally:
            self.inflight -= 1
            if self.inflight == 0:
                self.op_time += time.monotonic() - self.op_since

    def _reply_error(self, call_id, error: str) -> None:
        self._send({"type": "reply", "id": call_id, "ok": False, "error": error})

    async def _converse(self) -> tuple[Status, str, str]:
        names = operator_names(self.problem.family)
        self._send({"type": "init", "code": self.code, "operators": list(names), "builtins": sorted(SAFE_BUILTINS),
                    "imports": sorted(ALLOWED_IMPORTS), "max_print_bytes": 65536})
        received = 0
        ready = False
        proc = self.sp.proc
        while True:
            try:
                line = await proc.stdout.readline()
            except (asyncio.LimitOverrunError, ValueError):
                return Status.SANDBOX_VIOLATION, "", "protocol line too long"
            if not line:
                return await self._ended(ready)
            received += len(line)
            if received > self.limits.max_output_bytes:
                return Status.SANDBOX_VIOLATION, "", "protocol output limit exceeded"
            try:
                msg = clean_json(json.loads(line))  # lone surrogates become '?': valid text from here on
                kind = msg["type"]
            except (ValueError, KeyError, TypeError, RecursionError):
                return Status.SANDBOX_VIOLATION, "", "malformed message on the protocol channel"
            if kind == "ready" and not ready:
                ready = True
            elif kind == "call" and ready:
                task = asyncio.create_task(self._serve(msg))
                self.tasks.add(task)
                task.add_done_callback(self._check_task)
            elif kind == "result":
                ans = msg.get("answer")
                if not isinstance(ans, str):
                    return Status.SANDBOX_VIOLATION, "", "result is not a string"
                return Status.OK, ans, ""
            elif kind == "error":
                st = Status.SANDBOX_VIOLATION if msg.get("status") == "sandbox_violation" else Status.RUNTIME_ERROR
                return st, "", str(msg.get("message", ""))[:2000]
            else:
                return Status.SANDBOX_VIOLATION, "", f"unknown message type {kind!r}"

    async def _ended(self, ready: bool) -> tuple[Status, str, str]:
        """The child closed its protocol channel without a result."""
        proc = self.sp.proc
        await proc.wait()
        by_signal = signal_status(proc.returncode)
        tail = self.stderr.decode(errors="replace").strip()[-300:]
        if not ready:  # the runner never came up: bwrap/setpriv/python failed, not the workflow
            raise _Stop(Status.EXECUTOR_ERROR, f"sandbox failed to start (rc={proc.returncode}): {tail}")
        if by_signal == Status.TIMEOUT:
            return Status.TIMEOUT, "", "CPU-time limit exceeded"
        return Status.RUNTIME_ERROR, "", f"workflow process exited without a result (rc={proc.returncode}) {tail}".strip()

    def _check_task(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and isinstance(task.exception(), _Stop) and not self.stop.done():
            self.stop.set_result(task.exception())

    async def _supervise(self, conv: asyncio.Task) -> tuple[Status, str, str]:
        """Wait for the conversation's end under both budgets. The workflow's wall budget counts only time when
        no operator call is in flight: a slow or retrying executor must not turn into the workflow's `timeout`
        (its CPU rlimit still applies). Its operator-time budget counts the time its calls were served
        (executor replies, code runs, calls that failed on their own content), not time spent waiting for a
        free executor."""
        t_start = time.monotonic()
        budget_s = self.op_cfg.max_operator_wall_s
        backstop = t_start + self.limits.wall_s + WAIT_BACKSTOP_FACTOR * budget_s
        while True:
            now = time.monotonic()
            busy = self.op_time + (now - self.op_since if self.inflight else 0.0)
            left = self.limits.wall_s - (now - t_start - busy)
            spent = self._over_budget()
            if spent:
                return Status.TIMEOUT, "", spent
            wait = min(5.0 if self.inflight else left, backstop - now)
            if wait <= 0:
                if now < backstop:
                    return Status.TIMEOUT, "", (f"wall-clock limit of {self.limits.wall_s}s exceeded (time in "
                                                "operator calls excluded)")
                # never an excluded status: our own operator code may be what stalled (a policy could find such
                # an input); loud instead (logged, counted by the no_internal_errors check)
                error = (f"{INTERNAL_ERROR}: operator calls were in flight for over {WAIT_BACKSTOP_FACTOR}x "
                         f"the operator-time budget of {budget_s:g}s but served for {self._served_s():.0f}s: the "
                         "executor is overloaded, or our operator code stalled")
                log.error("%s: %s", self.problem.id, error)
                return Status.RUNTIME_ERROR, "", error
            done, _ = await asyncio.wait({conv, self.stop}, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
            if self.stop in done:
                s: _Stop = self.stop.result()
                return s.status, "", s.error
            if conv in done:
                exc = conv.exception()
                if isinstance(exc, _Stop):
                    return exc.status, "", exc.error
                return conv.result()
