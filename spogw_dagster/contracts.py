"""Data contracts shared by every layer (executors, workflows, sandbox, benchmarks, curation).

Kept free of heavy imports so that any module, the CLI and the tests can use it cheaply.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any


class Status(str, enum.Enum):
    """Outcome of one workflow run. Used in every table and JSON we write.

    `executor_error` is a failure of our infrastructure (the LLM endpoint), never of the workflow:
    curation must keep such rows out of groups. All other non-ok statuses are real zero scores.
    """

    OK = "ok"
    FORMAT_ERROR = "format_error"  # no workflow code could be extracted from the generator's text
    INVALID = "invalid"  # code extracted but rejected by the validator (syntax, names, limits)
    RUNTIME_ERROR = "runtime_error"  # the workflow raised, or hit a resource limit other than time
    TIMEOUT = "timeout"  # wall-clock or CPU-time limit
    SANDBOX_VIOLATION = "sandbox_violation"  # tried to leave the sandbox or abuse the protocol
    EXECUTOR_ERROR = "executor_error"  # the executor LLM failed after retries (not the workflow's fault)


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
