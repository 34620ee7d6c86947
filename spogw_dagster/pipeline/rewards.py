"""The reward a sampled workflow earns (pure).

FloWright's ladder, r = w_f·format + w_v·valid + w_e·executes + w_a·answer, with

    format    1 when workflow code was found in the generator's text (parse status is not format_error)
    valid     1 when the code passed the validator (parse status ok)
    executes  the fraction of runs that finished with a result (status ok)
    answer    the benchmark metric, mean over runs (0/1 pass@1 for code and math, token F1 for QA)

With the default weights (0, 0, 0, 1) r is the plain benchmark score. Rows whose runs hit an executor error
keep their reward but curation drops them (our infrastructure failed, not the workflow).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from spogw_dagster.types import Status


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


def ladder_reward(ladder: Ladder, parse_status: str, run_statuses: Sequence[str], answer_score: float) -> float:
    """The ladder reward of one workflow in [0, 1]."""
    fmt = 0.0 if parse_status == Status.FORMAT_ERROR.value else 1.0
    valid = 1.0 if parse_status == Status.OK.value else 0.0
    runs = list(run_statuses)
    executes = (sum(s == Status.OK.value for s in runs) / len(runs)) if runs and valid else 0.0
    answer = float(answer_score) if valid else 0.0
    r = ladder.format * fmt + ladder.valid * valid + ladder.executes * executes + ladder.answer * answer
    return min(1.0, max(0.0, r))
