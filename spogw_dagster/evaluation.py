"""Execute a workflow on queries and score it: the bridge from workflow runs to benchmark scores.

Pure of Dagster. Used by the CLI (`exec-workflow`, `baseline`) and by the pipeline's assets.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable

from .benchmarks import CodeSandbox
from .benchmarks import score as score_answer
from .contracts import Problem, Status, Usage
from .sandboxing import Isolation, Limits
from .seeds import derive_seed
from .static_methods import (  # noqa: F401 (BASELINE_METHODS: API)
    ADAPTIVE_STRUCTURES,
    BASELINE_METHODS,
    CODE_STRUCTURES,
    STATIC_METHODS,
    STRUCTURES,
)
from .workflow.operators import OperatorConfig
from .workflow.parser import WorkflowRejected, parse_workflow
from .workflow.provenance import WORKFLOW
from .workflow.runtime import DEFAULT_LIMITS, execute_workflow

# Hidden tests of one HumanEval/MBPP problem run in well under a second; generous but bounded.
SCORING_LIMITS = Limits(wall_s=20, cpu_s=10, memory_mb=1024, nproc=8)

BASELINE_INSTRUCTIONS = {
    "io": "",
    "cot": "Let's think step by step.",
}
SC_SAMPLES = 3

# Self-Refine (Madaan et al. 2023): a draft, then rounds of feedback on it and a revision that uses the
# feedback. Two rounds: the paper allows up to four and its gains shrink after the first ones, and every round
# costs executor calls per query (math/qa: a feedback call and a revision call; code: one call that writes the
# feedback and the revised function, see `_self_refine`), so 2 keeps a run at 5 (3 for code) calls.
SELF_REFINE_ROUNDS = 2
# MultiPersona debate (Wang et al. 2024, "Unleashing cognitive synergy ..."; AFlow's MultiPersona baseline):
# each persona answers on its own, then, for MULTIPERSONA_ROUNDS rounds, each sees the others' answers and
# revises its own; `sc_ensemble` then picks the majority answer (one more executor call only when no two
# agree). Three personas so that a majority can exist; one round keeps a run at 6-7 executor calls.
MULTIPERSONA_ROUNDS = 1
PERSONAS: dict[str, tuple[str, ...]] = {
    "code": ("an experienced Python engineer who writes simple, readable code",
             "a software tester who first works through the examples and the edge cases",
             "an algorithms expert who checks that the logic is correct for every input"),
    "math": ("a mathematician who reasons rigorously",
             "a teacher who solves problems with simple, careful arithmetic",
             "a skeptical checker who verifies every step and every number"),
    "qa": ("an expert on the topic of the question",
           "a careful reader who finds the exact evidence in the text",
           "a fact-checker who double-checks names, dates and numbers"),
}


def baseline_workflow(family: str, method: str) -> str:
    """Static baselines (AFlow's IO, CoT, CoT-SC, Self-Refine, MultiPersona) written in the workflow language
    itself, so they run, are validated and are counted exactly like generated workflows."""
    op = {"code": "code_generate", "math": "custom", "qa": "custom"}[family]
    if method in BASELINE_INSTRUCTIONS:
        instr = BASELINE_INSTRUCTIONS[method]
        return ("class Workflow:\n    async def run(self):\n"
                f"        return await self.{op}(instruction={instr!r})\n")
    if method == "cot_sc":
        instr = BASELINE_INSTRUCTIONS["cot"]
        return ("class Workflow:\n    async def run(self):\n        solutions = []\n"
                f"        for i in range({SC_SAMPLES}):\n"
                f"            solutions.append(await self.{op}(instruction={instr!r}))\n"
                "        return await self.sc_ensemble(solutions=solutions)\n")
    if method in CODE_STRUCTURES:
        return _structure(family, method)
    if method == "self_refine":
        return _self_refine(family, op)
    if method == "multipersona":
        return _multipersona(family, op)
    raise ValueError(f"unknown baseline method {method!r}; expected one of {', '.join(STATIC_METHODS)}")


def _structure(family: str, method: str) -> str:
    """The static structures (code only, `static_methods.STRUCTURES`): k solutions, through `sc_ensemble` (which
    prefers those that pass the public tests) when k > 1, then through `test` when the structure says so."""
    if family != "code":
        raise ValueError(f"the static structure {method!r} is defined for code benchmarks only")
    gen = "await self.code_generate(instruction='')"
    if method in ADAPTIVE_STRUCTURES:
        return ("class Workflow:\n    async def run(self):\n"
                f"        first = {gen}\n"
                "        if await self.check(solution=first) == 'pass':\n"
                "            return first\n"
                "        solutions = [first]\n"
                f"        for i in range({ADAPTIVE_STRUCTURES[method] - 1}):\n"
                f"            solutions.append({gen})\n"
                "        best = await self.sc_ensemble(solutions=solutions)\n"
                "        return await self.test(solution=best)\n")
    k, tested = STRUCTURES[method]
    if k == 1:
        out, body = "s", f"        s = {gen}\n"
    else:
        out, body = "best", ("        solutions = []\n"
                             f"        for i in range({k}):\n"
                             f"            solutions.append({gen})\n"
                             "        best = await self.sc_ensemble(solutions=solutions)\n")
    tail = f"        return await self.test(solution={out})\n" if tested else f"        return {out}\n"
    return "class Workflow:\n    async def run(self):\n" + body + tail


# The workflow never sees the query: the operator puts the query after the instruction (and, for code, asks
# for one fenced function). So these instructions carry the earlier answers and say "the problem below".
# No ``` inside them: the generator-side extractor (`parse_workflow`) ends a fenced workflow at the first
# ```, so a workflow quoting one could not round-trip through generator output.
# They are built by string concatenation, the plainest construct the validator allows (f-strings pass too;
# `str.format` is refused).
def _self_refine(family: str, op: str) -> str:
    cot = BASELINE_INSTRUCTIONS["cot"]
    if family == "code":
        # code_generate keeps only the code of its reply, so feedback and revision share one call (the
        # feedback is written, then the function is rewritten in the same reply). A reply without a function
        # does not replace the draft: the workflow's answer stays a solution the code scorer can run.
        head = "Here is a draft solution to the task below:\n\n"
        tail = ("\n\nFirst give feedback on the draft: name every bug, wrong assumption or unhandled edge "
                "case (or say that it is correct). Then write the corrected function.")
        return ("class Workflow:\n    async def run(self):\n"
                f"        draft = await self.code_generate(instruction={cot!r})\n"
                f"        for i in range({SELF_REFINE_ROUNDS}):\n"
                f"            revised = await self.code_generate(instruction={head!r} + draft + {tail!r})\n"
                "            if 'def ' in revised:\n"
                "                draft = revised\n"
                "        return draft\n")
    fb_head = "A draft answer to the problem below:\n"
    fb_tail = ("\n\nGive feedback on this draft: check each step against the problem and name every mistake "
               "or unsupported step, and how to fix it. If the draft is correct, say so.")
    rf_head = "A draft answer to the problem below:\n"
    rf_mid = "\n\nFeedback on the draft:\n"
    rf_tail = ("\n\nWrite an improved, complete answer to the problem that fixes what the feedback points out. "
               "Think step by step.")
    return ("class Workflow:\n    async def run(self):\n"
            f"        draft = await self.{op}(instruction={cot!r})\n"
            f"        for i in range({SELF_REFINE_ROUNDS}):\n"
            f"            feedback = await self.{op}(instruction={fb_head!r} + draft + {fb_tail!r})\n"
            f"            draft = await self.{op}(instruction={rf_head!r} + draft + {rf_mid!r} + feedback\n"
            f"                                    + {rf_tail!r})\n"
            "        return draft\n")


def _multipersona(family: str, op: str) -> str:
    personas = list(PERSONAS[family])
    first = ". Solve the task below from your point of view. Let's think step by step."
    mine = ". Your earlier answer to the task below:\n"
    theirs = "\n\nThe other experts answered:"
    sep = "\n\n---\n"
    revise = ("\n\nCompare their reasoning with yours step by step, say where any of you went wrong, and give "
              "your final " + ("corrected function." if family == "code" else "answer."))
    return ("class Workflow:\n    async def run(self):\n"
            f"        personas = {personas!r}\n"
            "        answers = []\n"
            "        for persona in personas:\n"
            f"            answers.append(await self.{op}(instruction='You are ' + persona + {first!r}))\n"
            f"        for r in range({MULTIPERSONA_ROUNDS}):\n"
            "            revised = []\n"
            "            for i in range(len(personas)):\n"
            "                others = ''\n"
            "                for j in range(len(answers)):\n"
            "                    if j != i:\n"
            f"                        others = others + {sep!r} + answers[j]\n"
            f"                new = await self.{op}(instruction='You are ' + personas[i] + {mine!r} + answers[i]\n"
            f"                                      + {theirs!r} + others + {revise!r})\n"
            + ("                if 'def ' not in new:\n"  # a reply without a function keeps the persona's code
               "                    new = answers[i]\n" if family == "code" else "")
            + "                revised.append(new)\n"
            "            answers = revised\n"
            "        return await self.sc_ensemble(solutions=answers)\n")


@dataclass
class EvalResult:
    benchmark: str
    query_id: str
    status: Status
    score: float
    answer: str = ""
    error: str = ""
    usage: Usage = field(default_factory=Usage)
    isolation: str = ""
    wall_s: float = 0.0
    run_statuses: list[str] = field(default_factory=list)
    run_scores: list[float] = field(default_factory=list)
    detail: str = ""
    run_produced: list[bool] = field(default_factory=list)  # per run: a solution-writing operator was called
    # per run: whose the answer was (`workflow.provenance`: executor | workflow | none; "" when the run failed)
    run_origins: list[str] = field(default_factory=list)
    run_shares: list[float | None] = field(default_factory=list)  # per run: the executor-credited share

    @property
    def answer_origin(self) -> str | None:
        """The row's origin: "workflow" when any run's answer was the workflow's own, else "executor" when any
        was the executor's, else "none" when runs answered with nothing scorable; None when no run answered."""
        found = [o for o in self.run_origins if o]
        for o in ("workflow", "executor", "none"):
            if o in found:
                return o
        return None

    @property
    def executor_share(self) -> float | None:
        """The lowest executor-credited share over the runs that answered (None when none did)."""
        shares = [x for x in self.run_shares if x is not None]
        return min(shares) if shares else None

    def to_json(self) -> dict[str, Any]:
        return {
            "benchmark": self.benchmark, "query": self.query_id, "status": self.status.value,
            "score": self.score, "answer": self.answer, "error": self.error,
            "llm_calls": self.usage.llm_calls, "cached_calls": self.usage.cached_calls,
            "prompt_tokens": self.usage.prompt_tokens, "completion_tokens": self.usage.completion_tokens,
            "isolation": self.isolation, "wall_s": round(self.wall_s, 3), "runs": len(self.run_statuses),
            "run_statuses": self.run_statuses, "run_scores": self.run_scores, "detail": self.detail,
            "answer_origin": self.answer_origin, "run_origins": self.run_origins,
            "executor_share": self.executor_share,
        }


def aggregate_status(statuses: list[Status]) -> Status:
    """executor_error if any run hit it (the score is then not the workflow's); ok if any run finished;
    otherwise the first run's failure."""
    if Status.EXECUTOR_ERROR in statuses:
        return Status.EXECUTOR_ERROR
    if Status.OK in statuses:
        return Status.OK
    return statuses[0]


async def evaluate_workflow(
    code: str, problem: Problem, executor, iso: Isolation, *, runs: int = 1, seed: int = 0,
    op_cfg: OperatorConfig = OperatorConfig(), limits: Limits = DEFAULT_LIMITS,
) -> EvalResult:
    """Run `code` R times on `problem`; score = mean over runs of the benchmark metric (0 for failed runs, and
    for runs whose answer is not the executor's: `workflow.provenance`; their detail says so)."""

    if runs < 1:
        raise ValueError("runs must be >= 1")
    t0 = time.monotonic()
    usage = Usage()
    statuses: list[Status] = []
    scores: list[float] = []
    produced: list[bool] = []
    origins: list[str] = []
    shares: list[float | None] = []
    answer, error, detail = "", "", ""

    for r in range(runs):
        res = await execute_workflow(code, problem, executor, iso, seed=derive_seed(seed, r), op_cfg=op_cfg,
                                     limits=limits)
        usage.merge(res.usage)
        statuses.append(res.status)
        own = res.answer_origin == WORKFLOW
        # an answer the workflow wrote itself is no attempt by its executor calls: no executes credit either
        produced.append(res.produced and not own)
        origins.append(res.answer_origin)
        shares.append(res.executor_share)
        s = 0.0
        if res.status == Status.OK:
            sd = await score_answer(problem, res.answer, sandbox=CodeSandbox(iso, SCORING_LIMITS))
            s = 0.0 if own else float(sd.score)
            why = (f"no credit: the answer is the workflow's own, not the executor's (executor share "
                   f"{res.executor_share:.2f}); it would have scored {sd.score:g}: {sd.detail}") if own else sd.detail
            detail = detail or why
            answer = answer or res.answer
        else:
            error = error or res.error
        scores.append(s)
    status = aggregate_status(statuses)
    return EvalResult(problem.benchmark, problem.id, status, sum(scores) / runs, answer, error, usage, iso.name,
                      time.monotonic() - t0, [s.value for s in statuses], scores, detail, produced, origins, shares)


def rejected_result(problem: Problem, e: WorkflowRejected, iso: Isolation) -> EvalResult:
    return EvalResult(problem.benchmark, problem.id, e.status, 0.0, error=e.reason, isolation=iso.name)


async def evaluate_text(text: str, problem: Problem, executor, iso: Isolation, **kw) -> EvalResult:
    """Like evaluate_workflow, from raw generator output (extract and validate first)."""
    try:
        parsed = parse_workflow(text, problem.family)
    except WorkflowRejected as e:
        return rejected_result(problem, e, iso)
    return await evaluate_workflow(parsed.code, problem, executor, iso, **kw)


async def evaluate_many(code: str, problems: Iterable[Problem], executor, iso: Isolation, *,
                        concurrency: int = 4, **kw) -> list[EvalResult]:
    sem = asyncio.Semaphore(concurrency)

    async def one(p: Problem) -> EvalResult:
        async with sem:
            return await evaluate_workflow(code, p, executor, iso, **kw)

    return list(await asyncio.gather(*(one(p) for p in problems)))


def wilson_interval(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval for a solve rate (see `core.stats.wilson`)."""
    # lazy: numpy stays out of the CLI's start-up (this module is imported by every `spogw`)
    from .core.stats import wilson

    return wilson(successes, n, z)


def summarize(results: list[EvalResult]) -> dict[str, Any]:
    """Solve rate over scored queries (executor_error rows are excluded and counted separately)."""
    scored = [r for r in results if r.status != Status.EXECUTOR_ERROR]
    total = sum(r.score for r in scored)
    lo, hi = wilson_interval(total, len(scored))
    usage = Usage()
    for r in results:
        usage.merge(r.usage)
    return {
        "n": len(results), "scored": len(scored), "solve_rate": (total / len(scored)) if scored else 0.0,
        "ci95": [round(lo, 4), round(hi, 4)], "statuses": dict(Counter(r.status.value for r in results)),
        "executor_errors": len(results) - len(scored), "llm_calls": usage.llm_calls,
        "cached_calls": usage.cached_calls, "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
    }
