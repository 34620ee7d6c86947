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

With the default weights (0, 0, 0, 1) r is the plain benchmark score. Rows whose runs hit an executor error
keep their reward but curation drops them (our infrastructure failed, not the workflow).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from spogw_dagster.contracts import Status
from spogw_dagster.workflow.dataflow import returns_operator_output


@dataclass(frozen=True)
class Ladder:
    format: float = 0.0
    valid: float = 0.0
    executes: float = 0.0
    answer: float = 1.0

    def __post_init__(self) -> None:
        ws = (self.format, self.valid, self.executes, self.answer)
        if any(w < 0 for w in ws) or sum(ws) > 1.0 + 1e-9:
            raise ValueError(f"reward weights must be >= 0 and sum to <= 1, got {ws}")


# Operators that write a solution from the query; a valid workflow calling none of them returns a constant
# or re-checks nothing: the reward trap.
PRODUCING_OPERATORS = frozenset({"custom", "answer_generate", "code_generate", "programmer"})


def is_trivial(code: str | None, valid: bool) -> bool:
    """True for a valid workflow whose returned value cannot depend on the output of an operator that
    produces a solution (`workflow.dataflow`: a call whose result is dropped or overwritten does not count)."""
    if not valid or not code:
        return False
    return returns_operator_output(code, PRODUCING_OPERATORS) is False  # None: not a workflow (never valid)


def ladder_reward(ladder: Ladder, parse_status: str, run_statuses: Sequence[str], answer_score: float,
                  trivial: bool = False) -> float:
    """The ladder reward of one workflow in [0, 1]; `trivial` (see `is_trivial`) forfeits the executes rung."""
    fmt = 0.0 if parse_status == Status.FORMAT_ERROR.value else 1.0
    valid = 1.0 if parse_status == Status.OK.value else 0.0
    runs = list(run_statuses)
    executes = (sum(s == Status.OK.value for s in runs) / len(runs)) if runs and valid and not trivial else 0.0
    answer = float(answer_score) if valid else 0.0
    r = ladder.format * fmt + ladder.valid * valid + ladder.executes * executes + ladder.answer * answer
    return min(1.0, max(0.0, r))
