"""Parent-side operators: what `await self.<op>(...)` in a workflow actually does.

They run in the trusted parent: they build prompts from the query (which the workflow never sees), call the
executor LLM (through the cache and the per-run meter), and run generated code in the sandbox. The
workflow only ever gets strings back. The `test` operator sees only the query's public tests, and repairs only
code the executor wrote.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from ..benchmarks import (
    CodeSandbox,
    extract_code,
    extract_math_answer,
    extract_qa_answer,
    normalize_answer,
    run_public_tests,
    solution_code,
)
from ..contracts import Problem, SamplingParams
from ..sandboxing import Isolation, Limits, run_code
from ..seeds import derive_seed
from .provenance import EXECUTOR, K, Provenance, tokens
from .template import OPERATORS, VERDICT_OPERATORS

SYSTEM = "You are a helpful assistant."
ANSWER_HINT = {
    "math": "Give the final answer at the end as \\boxed{answer}.",
    "qa": "End with one line of the form `Answer: <short answer>`.",
    "code": "Reply with the complete Python function in one ```python code block.",
}

# The end of a reply's fenced code block: the closing fence and its line break. The opening fence the hint asks
# for ("```python") never matches, so a reply stops where its first block closes.
CODE_STOP = ("\n```\n",)


@dataclass(frozen=True)
class OperatorConfig:
    temperature: float = 0.7
    top_p: float = 0.95
    max_tokens: int = 384
    max_operator_calls: int = 16  # per workflow run: a loop of operator calls cannot run up a bill
    max_llm_calls: int = 32
    # stop strings for the calls that ask for code in one fenced block (ANSWER_HINT["code"]): the text after
    # the block's closing fence is prose the scorer never reads (`executor.stop_after_code`)
    code_stop: tuple[str, ...] = ()
    max_arg_chars: int = 20_000
    max_solutions: int = 8
    programmer_attempts: int = 2
    test_fix_rounds: int = 2
    # per run: seconds its operator calls may be served (executor replies, code runs), queueing excluded
    max_operator_wall_s: float = 1800.0
    code_limits: Limits = Limits(wall_s=10, cpu_s=5, memory_mb=512, nproc=8)


class OperatorCallError(Exception):
    """The workflow called an operator wrongly (bad arguments). Its run becomes a runtime_error."""


class BudgetExceeded(OperatorCallError):
    pass


def vote_key(family: str, text: str) -> str:
    """What two solutions must share to count as the same answer in self-consistency voting."""
    if family == "math":
        ans, _ = extract_math_answer(text)
        return (ans or text.strip()).replace(" ", "")
    if family == "qa":
        return normalize_answer(extract_qa_answer(text))
    return " ".join((extract_code(text) or text).split())


class Operators:
    """The operator set bound to one query and one workflow run."""

    def __init__(self, problem: Problem, executor, iso: Isolation, cfg: OperatorConfig, run_seed: int,
                 offered: tuple[str, ...], provenance: Provenance | None = None):
        self.problem = problem
        self.executor = executor
        self.iso = iso
        self.cfg = cfg
        self.run_seed = run_seed
        self.offered = offered
        self.operator_calls = 0
        self.llm_calls = 0
        self.code_s = 0.0  # seconds spent running code in the sandbox for this run (the operator-time budget)
        self.trace: list[dict[str, Any]] = []
        # what the executor wrote and what the workflow carried in this run (whose is the answer?)
        self.provenance = provenance if provenance is not None else Provenance()

    # --- plumbing -------------------------------------------------------------------------------------
    async def call(self, op: str, args: list, kwargs: dict) -> str:
        if op not in self.offered:
            raise OperatorCallError(f"operator {op!r} is not offered")
        self.operator_calls += 1
        if self.operator_calls > self.cfg.max_operator_calls:
            raise BudgetExceeded(f"more than {self.cfg.max_operator_calls} operator calls in one run")
        spec = OPERATORS[op]
        if len(args) > len(spec.params) or any(k not in spec.params for k in kwargs):
            raise OperatorCallError(f"bad arguments for {spec.signature}")
        bound = dict(zip(spec.params, args))
        for k, v in kwargs.items():
            if k in bound:
                raise OperatorCallError(f"{op}() got multiple values for {k!r}")
            bound[k] = v
        if len(bound) < spec.required:
            raise OperatorCallError(f"{op}() is missing a required argument: {spec.signature}")
        for k, v in bound.items():
            if k == "solutions":
                if not isinstance(v, list) or not v or not all(isinstance(s, str) for s in v):
                    raise OperatorCallError(f"{op}(solutions=...) needs a non-empty list of strings")
                if len(v) > self.cfg.max_solutions:
                    raise OperatorCallError(f"{op}() takes at most {self.cfg.max_solutions} solutions")
                if any(len(s) > self.cfg.max_arg_chars for s in v):
                    raise OperatorCallError(f"a solution passed to {op}() is too long")
            elif not isinstance(v, str):
                bound[k] = "" if v is None else str(v)
                self.provenance.carried(bound[k])  # `test(solution=False)`: the workflow's, whatever a draft holds
            if isinstance(bound[k], str) and len(bound[k]) > self.cfg.max_arg_chars:
                raise OperatorCallError(f"argument {k!r} of {op}() is longer than {self.cfg.max_arg_chars} chars")
        for v in bound.values():
            self.provenance.sent(v)
        result = await getattr(self, f"op_{op}")(**bound)
        self.trace.append({"op": op, "chars": len(result), "source": self._source(op, result, bound)})
        return result

    @staticmethod
    def _source(op: str, result: str, bound: dict) -> str:
        """What produced an operator's output: passed one of its inputs on unchanged (`test` whose tests pass,
        an ensemble's pick), ran a program, or is an executor reply."""
        inputs = [x for v in bound.values() for x in (v if isinstance(v, list) else [v])]
        if op in VERDICT_OPERATORS:
            return "verdict"
        if any(isinstance(x, str) and x == result for x in inputs):
            return "passthrough"
        return "code_run" if op == "programmer" else "executor"

    async def _chat(self, user: str, *, temperature: float | None = None, max_tokens: int | None = None) -> str:
        self.llm_calls += 1
        if self.llm_calls > self.cfg.max_llm_calls:
            raise BudgetExceeded(f"more than {self.cfg.max_llm_calls} executor calls in one run")
        # One seed per call position: reruns hit the cache, repeated identical sampled calls still differ (a greedy
        # call, T = 0, is keyed without its seed: the same prompt gives the same text)
        params = SamplingParams(
            temperature=self.cfg.temperature if temperature is None else temperature,
            top_p=self.cfg.top_p,
            max_tokens=max_tokens or self.cfg.max_tokens,
            seed=derive_seed(self.run_seed, self.llm_calls),
            stop=self.cfg.code_stop if user.endswith(ANSWER_HINT["code"]) else (),
        )
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]
        res = await self.executor.chat(messages, params)
        self.provenance.replied(res.text)
        return res.text

    @property
    def family(self) -> str:
        return self.problem.family

    # --- operators ------------------------------------------------------------------------------------
    async def op_custom(self, instruction: str) -> str:
        return await self._chat(f"{instruction}\n\n{self.problem.question}\n\n{ANSWER_HINT[self.family]}")

    async def op_answer_generate(self) -> str:
        return await self._chat(
            f"{self.problem.question}\n\nThink step by step, then answer briefly. {ANSWER_HINT['qa']}")

    async def op_code_generate(self, instruction: str) -> str:
        text = await self._chat(
            f"{instruction}\n\nComplete this Python function:\n\n```python\n{self.problem.question}\n```\n\n"
            f"{ANSWER_HINT['code']}")
        code = solution_code(self.problem, text)
        if code:
            self.provenance.derived(code)
        return code or text

    async def op_programmer(self, analysis: str = "") -> str:
        feedback = ""
        code, out = "", ""
        for attempt in range(self.cfg.programmer_attempts):
            text = await self._chat(
                f"Write a Python program that computes and prints the final answer to this problem.\n\n"
                f"Problem: {self.problem.question}\n\nAnalysis: {analysis or 'None'}\n{feedback}\n"
                f"Reply with the program in one ```python code block; it must print the answer.")
            code = extract_code(text) or text  # the whole program: its prints and __main__ block run
            res = await run_code(code, self.iso, self.cfg.code_limits)
            self.code_s += res.wall_s
            out = res.stdout.strip()[-2000:]
            if res.status.value == "ok" and res.returncode == 0 and out:
                self.provenance.code_ran(code, out)  # its output is the executor's only if the program is
                return f"{code}\nOutput: {out}"
            feedback = f"\nYour previous program failed: {res.error or 'it printed nothing'}. Fix it."
        return f"{code}\nOutput: {out or 'error'}"

    async def op_sc_ensemble(self, solutions: list[str]) -> str:
        if len(solutions) == 1:
            return solutions[0]
        if self.family == "code" and self.problem.public_tests:
            # select by the public tests first (CodeT-style): the candidates that pass them, when any do, are
            # the ones voted on; a small coder's samples rarely agree verbatim, but a passing one is likely right
            passing = [s for s in solutions if (await self._public_tests(s)).passed]
            if len(passing) == 1:
                return passing[0]
            solutions = passing or solutions
        keys = [vote_key(self.family, s) for s in solutions]
        counts = Counter(keys)
        best, n = counts.most_common(1)[0]
        if n > 1:
            return solutions[keys.index(best)]
        # No two agree: let the executor pick, as ScoreFlow/AFlow do; an unusable reply picks the first.
        letters = "ABCDEFGH"[: len(solutions)]
        listing = "\n\n".join(f"{letters[i]}:\n{s[:3000]}" for i, s in enumerate(solutions))
        text = await self._chat(
            f"Problem:\n{self.problem.question}\n\nCandidate solutions:\n\n{listing}\n\n"
            f"Which solution is most likely correct? Reply with one letter from {', '.join(letters)}.",
            temperature=0.0, max_tokens=16)
        m = re.search(rf"\b([{letters}])\b", text)
        return solutions[letters.index(m.group(1))] if m else solutions[0]

    async def op_review(self, solution: str) -> str:
        return await self._chat(
            f"Problem:\n{self.problem.question}\n\nProposed solution:\n{solution}\n\n"
            f"Check the solution for mistakes, then write the corrected complete solution. "
            f"{ANSWER_HINT[self.family]}")

    async def _public_tests(self, solution: str):
        """The verdict of the query's public tests on `solution` (run in the sandbox; counted as code time)."""
        sandbox = CodeSandbox(self.iso, self.cfg.code_limits, call_timeout_s=self.cfg.code_limits.wall_s)
        t0 = time.monotonic()
        try:
            return await run_public_tests(self.problem, solution_code(self.problem, solution), sandbox)
        finally:
            self.code_s += time.monotonic() - t0

    async def op_check(self, solution: str) -> str:
        """The public tests' verdict, no executor call: "pass" when every one passes, else "fail" (also when the
        task has none or the text holds no code: a workflow that branches on it then spends, never skips)."""
        if not self.problem.public_tests:
            return "fail"
        return "pass" if (await self._public_tests(solution)).passed else "fail"

    async def op_test(self, solution: str) -> str:
        tests = self.problem.public_tests
        if not tests:
            return solution
        scored = solution_code(self.problem, solution) or solution
        if self.provenance.origin_of(scored).origin != EXECUTOR or len(tokens(scored)) < K:
            # A repair of code the executor did not write (a literal, a placeholder, a few tokens cut from a
            # draft) is a generation hidden in a repair: trained policies learned `test(solution="Write the
            # function.")` while it paid. Handed back unrepaired (no call), its answer stays the workflow's.
            return solution
        current = solution
        for round_ in range(self.cfg.test_fix_rounds + 1):
            verdict = await self._public_tests(current)
            if verdict.passed:
                return current
            if round_ == self.cfg.test_fix_rounds:
                break
            failed = [r for r in verdict.records if not r["passed"]]
            failure = "; ".join(f"{r['test']} -> {r['error']}" for r in failed[:3]) or verdict.detail
            failure = failure[-800:]
            # the task itself, as AFlow's Test operator shows it: a fix that cannot see the spec guesses at it
            text = await self._chat(
                f"The task:\n\n```python\n{self.problem.question.strip()}\n```\n\n"
                f"This Python solution fails a test.\n\n```python\n{current}\n```\n\nTests:\n" + "\n".join(tests)
                + f"\n\nError: {failure}\n\nFix the function so that it does the task. {ANSWER_HINT['code']}")
            fixed = solution_code(self.problem, text)
            if fixed:
                self.provenance.derived(fixed)
            current = fixed or current
        return solution  # nothing passed: the fixes are no better than what we were given
