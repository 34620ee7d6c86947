"""W4S (Nie et al. 2025, "Weak-for-Strong"): the history-relative reward and the state advance of its multi-turn
optimisation, as pure functions (no Dagster, no model). The sampling loop that uses them is
`pipeline/domain/refinement.py`.

W4S's rule (its `reward_type="discrete"`): a candidate whose accuracy beats the best accuracy so far gets 1,
one that beats the previous turn's state gets 0.5, any other 0; and 0.1 less when its accuracy is below 0.3.

W4S optimises one workflow per task, scored on a validation set; our workflows are per training query. The
adaptation (per query q):

* a candidate's accuracy is its answer score on q (`execution_scores.answer_score`: pass@1 / exact answer);
* "best so far" at turn t is the best accuracy of q's *states* of turns < t (the candidates that advanced,
  each the `parent_sample_idx` of the next turn's rows), as W4S compares with the systems it kept (its
  examples and the last generated system), not with every candidate it tried; "previous" is the accuracy of
  the turn-(t−1) state;
* turn 0 has no history (W4S starts from its example workflows, which our prompt shows but never runs on q):
  best so far and previous are taken as 0, so a turn-0 candidate earns 1 when it answers at all correctly.

The state advances with the turn's best candidate by validation accuracy (`pick_state`), as W4S's does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

LOW_ACCURACY = 0.3  # below it W4S subtracts LOW_PENALTY
LOW_PENALTY = 0.1
BEATS_BEST = 1.0
BEATS_PREVIOUS = 0.5


def w4s_reward(accuracy: float, best_so_far: float, previous: float) -> float:
    """1 if accuracy > best_so_far, else 0.5 if accuracy > previous, else 0; minus 0.1 when accuracy < 0.3."""
    r = BEATS_BEST if accuracy > best_so_far else BEATS_PREVIOUS if accuracy > previous else 0.0
    return r - LOW_PENALTY if accuracy < LOW_ACCURACY else r


@dataclass(frozen=True)
class Candidate:
    """One candidate of one query's history: its turn, its sample_idx, the state it was sampled from
    (`parent`, the sample_idx of the turn-(t−1) state; None at turn 0) and its accuracy."""

    query_id: str
    turn: int
    sample_idx: int
    parent: int | None
    accuracy: float | None  # None: not scored (an executor error), left out of the history


@dataclass(frozen=True)
class Rewarded:
    candidate: Candidate
    best_so_far: float
    previous: float
    reward: float


def history_rewards(candidates: Iterable[Candidate]) -> list[Rewarded]:
    """`w4s_reward` of every scored candidate against its query's states so far (module docstring), in (query,
    turn, sample_idx) order. A turn-t candidate (t > 0) whose parent is not a candidate of turn t−1 is an error; a
    parent that was not scored counts as accuracy 0 (no state to beat). Unscored candidates get no reward."""
    by_query: dict[str, list[Candidate]] = {}
    for c in candidates:
        by_query.setdefault(c.query_id, []).append(c)
    out: list[Rewarded] = []
    for q in sorted(by_query):
        rows = sorted(by_query[q], key=lambda c: (c.turn, c.sample_idx))
        acc = {(c.turn, c.sample_idx): c.accuracy for c in rows}
        state_of = {c.turn - 1: c.parent for c in rows if c.turn > 0}  # turn s -> the sample that advanced
        for c in rows:
            if c.turn > 0 and (c.turn - 1, c.parent) not in acc:
                raise ValueError(f"query {q!r}: turn-{c.turn} candidate {c.sample_idx} names parent {c.parent}, "
                                 f"which is not a turn-{c.turn - 1} candidate")
            if c.accuracy is None:
                continue
            if c.turn == 0:
                best = prev = 0.0
            else:
                best = max((acc.get((s, state_of[s])) or 0.0 for s in range(c.turn) if s in state_of),
                           default=0.0)
                prev = acc[(c.turn - 1, c.parent)] or 0.0
            out.append(Rewarded(c, best, prev, w4s_reward(c.accuracy, best, prev)))
    return out


def pick_state(candidates: Sequence[tuple[int, float]]) -> int:
    """The sample_idx that advances the state: the highest validation accuracy, the lowest sample_idx on a tie
    (the first sampled). `candidates`: (sample_idx, accuracy)."""
    if not candidates:
        raise ValueError("no candidate to advance the state with")
    return min(candidates, key=lambda c: (-c[1], c[0]))[0]
