"""The reward a sampled workflow earns (pure).

FloWright's ladder, r = w_f·format + w_v·valid + w_e·executes + w_a·answer, with

    format    1 when workflow code was found in the generator's text (parse status is not format_error)
    valid     1 when the code passed the validator (parse status ok)
    executes  the fraction of runs that finished with a result (status ok), counted only for a workflow whose
              answer comes from an operator that writes a solution (`is_trivial`, by data flow): a valid
              workflow that returns anything else (`return await self.test(solution=False)`, also after a
              dead `await self.code_generate(...)` whose result it drops) runs to the end without
              attempting the task, and crediting it would make it as good as a real attempt that fails (the
              reward trap; measured: with the credit, trivial greedy workflows went 0% -> 30% in two
              iterations)
    answer    the benchmark metric, mean over runs (0/1 pass@1 for code and math, token F1 for QA)

Optionally the ladder pays for what the workflow spends: `call_cost` λ subtracts λ × the executor calls of
one run (mean over runs) before r is clipped to [0, 1], so of two workflows that answer alike the one with fewer
calls scores higher (W4S's and AFlow's cost axis as a reward term; λ 0, the default, leaves r as it was).

With the default weights (0, 0, 0, 1) r is the plain benchmark score. Rows whose runs hit an executor error
keep their reward but curation drops them (our infrastructure failed, not the workflow).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from spogw_dagster.contracts import Status
from spogw_dagster.workflow.dataflow import returns_operator_output
from spogw_dagster.workflow.template import PRODUCING_OPERATORS


@dataclass(frozen=True)
class Ladder:
    """The reward's weights (the only declaration: the `reward:` section is derived from it). format: code was
    found; valid: it passed the validator; executes: it ran to a result (status ok); answer: the benchmark
    metric (mean over runs). Weights are >= 0, the answer's > 0, and they sum to at most 1 so r stays in
    [0, 1]; the default (answer only) is the plain benchmark score."""

    format: float = 0.0
    valid: float = 0.0
    executes: float = 0.0
    answer: float = 1.0
    call_cost: float = 0.0  # λ: subtracted per executor call of one run (mean over runs)

    def __post_init__(self) -> None:
        ws = (self.format, self.valid, self.executes, self.answer)
        if not all(isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w) for w in ws):
            raise ValueError(f"reward weights must be finite numbers, got {ws}")
        if any(w < 0 for w in ws):
            raise ValueError(f"reward weights must be >= 0, got (format, valid, executes, answer) = {ws}")
        if sum(ws) > 1.0 + 1e-9:
            raise ValueError(f"reward weights sum to {sum(ws):g} > 1; scores must stay in [0, 1]: lower them")
        if not (isinstance(self.call_cost, (int, float)) and not isinstance(self.call_cost, bool)
                and math.isfinite(self.call_cost) and 0.0 <= self.call_cost <= 1.0):
            raise ValueError(f"reward.call_cost must be a number in [0, 1] (λ per executor call), got "
                             f"{self.call_cost!r}")
        if self.answer <= 0:
            raise ValueError("reward.answer must be > 0: a reward without the benchmark's answer trains for "
                             "form alone")




def is_trivial(code: str | None, valid: bool) -> bool:
    """True for a valid workflow whose returned value cannot depend on the output of an operator that
    produces a solution (`workflow.dataflow`: a call whose result is dropped or overwritten does not count)."""
    if not valid or not code:
        return False
    return returns_operator_output(code, PRODUCING_OPERATORS) is False  # None: not a workflow (never valid)


def executes_share(run_statuses: Sequence[str], run_produced: Sequence[bool] = (), *, valid: bool = True,
                   trivial: bool = False) -> float:
    """The executes rung: the share of runs that finished with a result (status ok) *and* called an operator
    that writes a solution (`run_produced`, from the run's operator trace: a call the data flow cannot rule
    out statically, say under `if False:` or after a `return`, must also have happened). 0 for an invalid or a
    trivial workflow. An empty `run_produced` (rows from before it was recorded) counts every run."""
    runs = list(run_statuses)
    if not runs or not valid or trivial:
        return 0.0
    produced = list(run_produced) or [True] * len(runs)
    return sum(s == Status.OK.value and p for s, p in zip(runs, produced)) / len(runs)


def ladder_reward(ladder: Ladder, parse_status: str, run_statuses: Sequence[str], answer_score: float,
                  trivial: bool = False, run_produced: Sequence[bool] = (), llm_calls: int = 0) -> float:
    """The ladder reward of one workflow in [0, 1]; `trivial` (see `is_trivial`) forfeits the executes rung, and
    only runs that called a solution-writing operator earn it (`executes_share`). `llm_calls`: the executor
    calls of all its runs together, charged at `call_cost` per call of one run."""
    fmt = 0.0 if parse_status == Status.FORMAT_ERROR.value else 1.0
    valid = 1.0 if parse_status == Status.OK.value else 0.0
    executes = executes_share(run_statuses, run_produced, valid=bool(valid), trivial=trivial)
    answer = float(answer_score) if valid else 0.0
    r = ladder.format * fmt + ladder.valid * valid + ladder.executes * executes + ladder.answer * answer
    if ladder.call_cost and llm_calls:
        r -= ladder.call_cost * llm_calls / max(1, len(run_statuses))
    return min(1.0, max(0.0, r))
