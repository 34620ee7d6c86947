"""The queries of a benchmark's splits, as the pipeline and the CLI ask for them: one query by id, the split
sizes of a benchmark, and the first queries of its test or validation split (with a record of the split for
report metadata). The splits themselves are made in `splits.py`."""

from __future__ import annotations

from typing import Any

from spogw_dagster.contracts import Problem

from .registry import get_spec, load_benchmark
from .splits import Splits, ids_sha256, load_split_problems, make_benchmark_splits

__all__ = ["get_problem", "default_split_sizes", "default_splits", "held_out_problems", "training_problems",
           "split_problems", "REPORT_SPLITS"]


def get_problem(benchmark: str, query_id: str, *, path: str | None = None) -> Problem:
    """One query by id, from the benchmark's file (or its train file, where it has one)."""
    spec = get_spec(benchmark)
    pools = [spec.name] + ([spec.train_dataset] if spec.train_dataset else [])
    for name in pools:
        for p in load_benchmark(name, path if name == spec.name else None):
            if p.id == query_id:
                return p
    sample = ", ".join(p.id for p in load_benchmark(spec.name, path)[:3])
    raise LookupError(f"no query {query_id!r} in {benchmark}; ids look like: {sample}")


def default_split_sizes(benchmark: str, *, path: str | None = None) -> tuple[int, int, int]:
    """(train, val, test): at most 100 train queries (the paper's d), 10% validation, the rest test."""
    spec = get_spec(benchmark)
    total = len(load_benchmark(spec.name, path))
    if spec.train_dataset:  # train comes from its own file
        n_val = min(50, total // 10)
        return 100, n_val, total - n_val
    n_train = min(100, int(total * 0.4))
    n_val = min(50, total // 10)
    return n_train, n_val, total - n_train - n_val


def default_splits(benchmark: str, *, seed: int = 0, path: str | None = None) -> Splits:
    """The benchmark's train / val / test splits at `default_split_sizes` (deterministic for a seed): the one
    split every command and asset draws its queries from."""
    return make_benchmark_splits(benchmark, seed, *default_split_sizes(benchmark, path=path), path=path)


def held_out_problems(benchmark: str, *, limit: int | None = None, seed: int = 0, path: str | None = None) -> list[Problem]:
    """The first `limit` queries of the benchmark's test split (deterministic for a seed)."""
    problems = load_split_problems(default_splits(benchmark, seed=seed, path=path), "test", path=path)
    if limit is not None:
        if limit < 1:
            raise ValueError("--limit must be >= 1")
        problems = problems[:limit]
    return problems


def training_problems(benchmark: str, *, limit: int | None = None, seed: int = 0,
                      path: str | None = None) -> list[Problem]:
    """The first `limit` queries of the benchmark's train split (deterministic for a seed): the queries an
    iteration samples workflows for (`benchmark.train_queries` of them)."""
    problems = load_split_problems(default_splits(benchmark, seed=seed, path=path), "train", path=path)
    if limit is not None:
        if not 1 <= limit <= len(problems):
            raise ValueError(f"{limit} training queries asked for, but the train split of {benchmark} has "
                             f"{len(problems)}; choose 1 to {len(problems)}")
        problems = problems[:limit]
    return problems


REPORT_SPLITS = {"test": "test", "validation": "val"}


def split_problems(benchmark: str, split: str, *, limit: int | None = None, seed: int = 0,
                   path: str | None = None, reserve: int = 0) -> tuple[list[Problem], dict[str, Any]]:
    """The first `limit` queries (None: all) of the `test` or `validation` split, and a record of the split
    (name, seed, sizes, the splits' content hash and a hash of the chosen ids) for report metadata. `reserve`
    leaves the split's last queries out (W4S's feedback queries: a method never scored where it was tuned).

    Settings are chosen on `validation`; `test` is held out (the report's default)."""
    if split not in REPORT_SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {sorted(REPORT_SPLITS)}")
    splits = default_splits(benchmark, seed=seed, path=path)
    problems = load_split_problems(splits, REPORT_SPLITS[split], path=path)
    if reserve:
        problems = problems[:max(0, len(problems) - reserve)]
    if limit is not None:
        if limit > len(problems):
            kept = f" ({reserve} more are W4S's feedback queries)" if reserve else ""
            raise ValueError(f"{limit} {split} queries asked for, but the {split} split of {benchmark} has "
                             f"{len(problems)}{kept}; lower the number")
        problems = problems[:limit]
    if not problems:
        raise ValueError(f"the {split} split of {benchmark} is empty")
    ids = [p.id for p in problems]
    return problems, {"split": split, "benchmark": benchmark, "split_seed": seed, "queries": len(ids),
                      "split_sizes": splits.sizes, "splits_content_hash": splits.content_hash,
                      "ids_sha256": ids_sha256(ids), "first_ids": ids[:5]}
