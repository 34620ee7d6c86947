"""Benchmarks: loaders, deterministic splits, public-test extraction and scorers.

    from spogw_dagster.benchmarks import load_benchmark, make_benchmark_splits, score
    problems = load_benchmark("humaneval")            # list[Problem]
    splits = make_benchmark_splits("gsm8k", seed=0, n_train=100, n_val=50, n_test=200)
    detail = await score(problem, answer_text, sandbox=CodeSandbox(iso))  # ScoreDetail(score, detail)

See `registry` for the datasets, `splits` for how splits are drawn, `scoring` and `code_tests` for
how answers are scored.
"""

from .code_tests import (
    CodeSandbox,
    RunCode,
    ScoreDetail,
    ScoringInfrastructureError,
    build_test_program,
    extract_code,
    hidden_test_job,
    public_test_job,
    run_public_tests,
    score_code,
    solution_code,
    tested_names,
)
from .dataio import BenchmarkDataError, BenchmarkFileNotFoundError
from .fixtures import write_drop_fixture, write_fixtures, write_hotpotqa_fixture, write_mbpp_fixture
from .humaneval import extract_public_tests
from .registry import DATASETS, DatasetSpec, dataset_names, get_spec, load_benchmark
from .scoring import (
    extract_gsm8k_answer,
    extract_math_answer,
    extract_qa_answer,
    f1_score,
    math_equal,
    normalize_answer,
    score,
    score_answer,
    score_gsm8k,
    score_math,
    score_qa,
    scored_text,
    scorer_for,
)
from .splits import (
    SplitError,
    Splits,
    load_split_problems,
    load_splits,
    make_benchmark_splits,
    make_splits,
    save_splits,
)
from .textutil import last_boxed, last_number
from .verdict import TestJob, Verdict, judge

__all__ = [
    "BenchmarkDataError",
    "BenchmarkFileNotFoundError",
    "DATASETS",
    "DatasetSpec",
    "CodeSandbox",
    "RunCode",
    "ScoreDetail",
    "ScoringInfrastructureError",
    "SplitError",
    "Splits",
    "TestJob",
    "Verdict",
    "build_test_program",
    "dataset_names",
    "extract_code",
    "extract_gsm8k_answer",
    "extract_math_answer",
    "extract_public_tests",
    "extract_qa_answer",
    "f1_score",
    "get_spec",
    "hidden_test_job",
    "judge",
    "last_boxed",
    "last_number",
    "load_benchmark",
    "load_split_problems",
    "load_splits",
    "make_benchmark_splits",
    "make_splits",
    "math_equal",
    "normalize_answer",
    "public_test_job",
    "run_public_tests",
    "save_splits",
    "score",
    "score_answer",
    "score_code",
    "score_gsm8k",
    "score_math",
    "score_qa",
    "scored_text",
    "scorer_for",
    "solution_code",
    "tested_names",
    "write_drop_fixture",
    "write_fixtures",
    "write_hotpotqa_fixture",
    "write_mbpp_fixture",
]
