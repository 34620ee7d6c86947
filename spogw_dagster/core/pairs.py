"""ScoreFlow's preference pairs, declared once: which pairs are candidates, their weight, and the weighted draw.
The pipeline's pair data (`curation.sample_preference_pairs`, per query and prompt) and the pure loss's in-batch
draw (`objectives.sample_pairs`, per group id) both build on it."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import numpy as np


def ordered_pairs(scores: Sequence[float]) -> Iterator[tuple[int, int]]:
    """(chosen, rejected) positions of every pair i < j (in the given order) whose scores differ, the higher
    score chosen; ties give no pair."""
    for i, j in itertools.combinations(range(len(scores)), 2):
        if scores[i] != scores[j]:
            yield (i, j) if scores[i] > scores[j] else (j, i)


def pair_weight(chosen: float, rejected: float, power: float) -> float:
    """(s_w − s_l)^power: ScoreFlow's sampling weight, which favours pairs far apart."""
    if power < 0:
        raise ValueError(f"power={power} must be >= 0")
    return (chosen - rejected) ** power


def draw(weights: Sequence[float], k: int, seed: int) -> list[int]:
    """`k` indices drawn with replacement ∝ weights (numpy.random.default_rng(seed); ScoreFlow sets no seed)."""
    p = np.asarray(weights, dtype=np.float64)
    p = p / p.sum()  # exact normalisation for numpy's check
    return np.random.default_rng(seed).choice(len(p), size=k, replace=True, p=p).tolist()
