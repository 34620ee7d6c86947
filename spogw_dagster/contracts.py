"""Data contracts shared by every layer (executors, workflows, sandbox, benchmarks, curation).

Kept free of heavy imports so that any module, the CLI and the tests can use it cheaply.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any


class Status(str, enum.Enum):
    """Outcome of one workflow run. Used in every table and JSON we write.

    Every status but one is a real score of 0 for the workflow: it stays in training groups (with its low
    reward, so its advantage is negative) and in every held-out metric. The exception:

    | status           | training groups (curation)        | held-out metrics and solve rates       |
    |------------------|-----------------------------------|----------------------------------------|
    | `executor_error` | dropped (reason "executor_error") | left out, counted in `executor_errors` |
    | any other        | kept, with its reward             | counted as a failure                   |

    One opt-in exception in training only: `curation.valid_only` also drops `format_error` and `invalid`
    rows from groups (reason "not_valid"). Those a policy does bring about, so they are still failures in
    every held-out metric, and the option's doc says what it gives up (`core.hyperparams.CurationConfig`).

    Because a dropped row can neither lose nor be counted, `executor_error` must be reachable only from
    outside the sandboxed code: the executor endpoint or its transport failed (refused connection, timeout,
    5xx, a reply we cannot read) on a request whose content is not the cause, or our own sandbox did not
    start. What a workflow or an answer can bring about is its own failure: text that cannot be encoded is
    sanitised before it goes anywhere (`clean_text`), a request the executor rejects while it serves a
    control request is the request's fault (`executors.base.RequestFaultError`), too many or too long
    operator calls are a `timeout` or `runtime_error`, and a bug of ours that a workflow's input trips is a
    `runtime_error` whose error says "internal error" (counted, logged and flagged by an asset check, never
    silently excluded). `workflow/runtime.py` is the one place that sets `executor_error`.
    """

    OK = "ok"
    FORMAT_ERROR = "format_error"  # no workflow code could be extracted from the generator's text
    INVALID = "invalid"  # code extracted but rejected by the validator (syntax, names, limits)
    RUNTIME_ERROR = "runtime_error"  # the workflow raised, or hit a resource limit other than time
    TIMEOUT = "timeout"  # wall-clock or CPU-time limit, or the operator-time budget
    SANDBOX_VIOLATION = "sandbox_violation"  # tried to leave the sandbox or abuse the protocol
    EXECUTOR_ERROR = "executor_error"  # the executor LLM failed after retries (not the workflow's fault)


# Statuses whose rows are left out of training groups and of held-out metrics (see `Status`).
EXCLUDED_STATUSES: frozenset[Status] = frozenset({Status.EXECUTOR_ERROR})


def clean_text(text: str) -> str:
    """`text` as valid UTF-8: lone surrogates (which JSON's `\\ud800` escapes and Python string literals can
    carry, but no encoder, HTTP body, SQLite or Parquet file accepts) become `?`. Applied to everything the
    sandboxed code hands back, so a workflow cannot make a later step fail on its text."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")


def clean_json(value: Any) -> Any:
    """`clean_text` applied to every string (keys included) of a decoded JSON value."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, list):
        return [clean_json(v) for v in value]
    if isinstance(value, dict):
        return {clean_json(k) if isinstance(k, str) else k: clean_json(v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 512
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stop"] = list(self.stop)
        return d


@dataclass
class ChatResult:
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    cached: bool = False
    model: str = ""


@dataclass
class Usage:
    """Per-call accounting, summed over a workflow run (or any scope)."""

    llm_calls: int = 0
    cached_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0

    def add(self, r: ChatResult) -> None:
        self.llm_calls += 1
        self.cached_calls += int(r.cached)
        self.prompt_tokens += r.prompt_tokens
        self.completion_tokens += r.completion_tokens
        self.latency_s += r.latency_s

    def merge(self, other: "Usage") -> None:
        self.llm_calls += other.llm_calls
        self.cached_calls += other.cached_calls
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.latency_s += other.latency_s


@dataclass
class Problem:
    """One benchmark query.

    `public_tests` may be shown to the workflow (the `test` operator); `hidden_tests` are used only
    for scoring and never leave the parent process except into the scoring sandbox.
    """

    benchmark: str
    id: str
    question: str  # what the workflow and the generator see
    answer: str = ""  # gold answer (math/QA); canonical solution for code, never shown
    family: str = "math"  # "code" | "math" | "qa"
    entry_point: str = ""  # code only
    public_tests: list[str] = field(default_factory=list)  # code only: assert statements
    hidden_tests: str = ""  # code only: test program defining check(candidate) or asserts
    golds: list[str] = field(default_factory=list)  # QA: every acceptable answer
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
