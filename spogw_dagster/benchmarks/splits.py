"""Deterministic, disjoint train / validation / test splits, written down as JSON.

How ids are drawn: every problem gets the key sha256(f"{seed}:{id}"); problems are taken in key order.
So a split depends only on the seed and the set of ids: not on the input order, the Python version or
the machine, and adding problems to a dataset does not reshuffle the others.

Where the splits come from (`make_splits`):
- one pool (humaneval, mbpp, drop, hotpotqa): train, then val, then test are consecutive runs of the
  key order, so they are disjoint by construction;
- with `train_pool` (`make_benchmark_splits` does this for datasets with a natural train file: gsm8k ->
  gsm8k_train, math / math_full -> math_train): val and test come from `problems` (the benchmark's test
  file) and train from `train_pool` (its train file). Training queries then never come from the test
  file; a train-pool problem whose question text equals a val/test question is skipped as well.

A Splits records the datasets, seed, ids, sizes and a content hash over every chosen problem's id,
question and answer; `Splits.resolve` checks that hash, so data that changed since the splits were
written is detected instead of silently used.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ..contracts import Problem
from ..fsutil import write_text_atomic
from .registry import get_spec, load_benchmark

SPLITS_FORMAT = "spogw-splits/1"
SPLIT_NAMES = ("train", "val", "test")


class SplitError(ValueError):
    pass


@dataclass
class Splits:
    benchmark: str  # dataset val/test come from (a load_benchmark name)
    train_benchmark: str  # dataset train comes from (== benchmark when there is one pool)
    seed: int
    train: list[str]
    val: list[str]
    test: list[str]
    content_hash: str
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def sizes(self) -> dict[str, int]:
        return {"train": len(self.train), "val": len(self.val), "test": len(self.test)}

    def ids(self, split: str) -> list[str]:
        if split not in SPLIT_NAMES:
            raise ValueError(f"unknown split {split!r}; expected one of {SPLIT_NAMES}")
        return list(getattr(self, split))

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": SPLITS_FORMAT,
            "benchmark": self.benchmark,
            "train_benchmark": self.train_benchmark,
            "seed": self.seed,
            "sizes": self.sizes,
            "ids": {"train": self.train, "val": self.val, "test": self.test},
            "content_hash": self.content_hash,
            "meta": self.meta,
        }

    def resolve(self, problems: Iterable[Problem], split: str) -> list[Problem]:
        """The problems of `split`, in split order, from `problems` (any superset, e.g. both pools).

        Raises SplitError if an id is missing or the data changed since the splits were made."""
        if split not in SPLIT_NAMES:
            raise ValueError(f"unknown split {split!r}; expected one of {SPLIT_NAMES}")
        by_id = {p.id: p for p in problems}
        missing = [i for s in SPLIT_NAMES for i in getattr(self, s) if i not in by_id]
        if missing:
            raise SplitError(
                f"{len(missing)} split id(s) are not among the given problems (first: {missing[:3]}); "
                f"load {self.benchmark!r}" + (f" and {self.train_benchmark!r}" if self.train_benchmark != self.benchmark else "")
            )
        chosen = {s: [by_id[i] for i in getattr(self, s)] for s in SPLIT_NAMES}
        h = _content_hash(self.benchmark, self.train_benchmark, self.seed, chosen)
        if h != self.content_hash:
            raise SplitError(
                f"the problems of {self.benchmark!r} differ from those the splits were made from "
                f"(content hash {h[:12]} != {self.content_hash[:12]}): the data changed; make new splits"
            )
        return chosen[split]


def ids_sha256(ids: Iterable[str]) -> str:
    """A short record of which queries were used: sha256 over the ids in order, newline-joined."""
    return hashlib.sha256("\n".join(ids).encode()).hexdigest()


def _key(seed: int, pid: str) -> str:
    return hashlib.sha256(f"{seed}:{pid}".encode()).hexdigest()


def _problem_fingerprint(p: Problem) -> str:
    return hashlib.sha256(json.dumps([p.id, p.question, p.answer], ensure_ascii=False).encode()).hexdigest()


def _content_hash(benchmark: str, train_benchmark: str, seed: int, chosen: dict[str, list[Problem]]) -> str:
    doc = {
        "benchmark": benchmark,
        "train_benchmark": train_benchmark,
        "seed": seed,
        "splits": {s: [_problem_fingerprint(p) for p in chosen[s]] for s in SPLIT_NAMES},
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def _dataset_of(problems: list[Problem], what: str) -> str:
    names = {str(p.meta.get("dataset") or p.benchmark) for p in problems}
    if len(names) != 1:
        raise SplitError(f"{what} mixes datasets {sorted(names)}; split one dataset at a time")
    return names.pop()


def _check_ids(problems: list[Problem], what: str) -> None:
    seen: set[str] = set()
    for p in problems:
        if p.id in seen:
            raise SplitError(f"{what} has duplicate id {p.id!r}")
        seen.add(p.id)


def _norm_q(q: str) -> str:
    return " ".join(q.lower().split())


def make_splits(
    problems: list[Problem],
    seed: int,
    n_train: int,
    n_val: int,
    n_test: int,
    *,
    train_pool: list[Problem] | None = None,
) -> Splits:
    """Draw disjoint train/val/test ids (see the module docstring for how).

    Raises SplitError when a size is negative, ids repeat, the problems mix datasets, or there are too
    few problems (the message says how many are available and how many were asked for).
    """
    for name, n in (("n_train", n_train), ("n_val", n_val), ("n_test", n_test)):
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise SplitError(f"{name} must be a non-negative integer, got {n!r}")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise SplitError(f"seed must be an integer, got {seed!r}")
    problems = list(problems)
    if not problems:
        raise SplitError("no problems to split")
    _check_ids(problems, "the benchmark")
    bench = _dataset_of(problems, "the benchmark")
    ordered = sorted(problems, key=lambda p: (_key(seed, p.id), p.id))

    meta: dict[str, Any] = {}
    if train_pool is None:
        need = n_train + n_val + n_test
        if need > len(ordered):
            raise SplitError(
                f"benchmark {bench!r} has {len(ordered)} problems, too few for "
                f"train {n_train} + val {n_val} + test {n_test} = {need}"
            )
        train = ordered[:n_train]
        val = ordered[n_train : n_train + n_val]
        test = ordered[n_train + n_val : need]
        train_bench = bench
    else:
        train_pool = list(train_pool)
        if n_train and not train_pool:
            raise SplitError("train_pool is empty")
        if n_val + n_test > len(ordered):
            raise SplitError(
                f"benchmark {bench!r} has {len(ordered)} problems, too few for val {n_val} + test {n_test} "
                f"= {n_val + n_test}"
            )
        val = ordered[:n_val]
        test = ordered[n_val : n_val + n_test]
        if train_pool:
            _check_ids(train_pool, "train_pool")
            train_bench = _dataset_of(train_pool, "train_pool")
        else:
            train_bench = bench
        held_ids = {p.id for p in val + test}
        held_q = {_norm_q(p.question) for p in val + test}
        t_ordered = sorted(train_pool, key=lambda p: (_key(seed, p.id), p.id))
        eligible = [p for p in t_ordered if p.id not in held_ids and _norm_q(p.question) not in held_q]
        meta["train_pool_overlap_skipped"] = len(t_ordered) - len(eligible)
        if n_train > len(eligible):
            raise SplitError(
                f"train pool {train_bench!r} has {len(eligible)} usable problems, too few for train {n_train}"
            )
        train = eligible[:n_train]
    chosen = {"train": train, "val": val, "test": test}
    return Splits(
        benchmark=bench,
        train_benchmark=train_bench,
        seed=seed,
        train=[p.id for p in train],
        val=[p.id for p in val],
        test=[p.id for p in test],
        content_hash=_content_hash(bench, train_bench, seed, chosen),
        meta=meta,
    )


def make_benchmark_splits(
    name: str,
    seed: int,
    n_train: int,
    n_val: int,
    n_test: int,
    *,
    path: str | Path | None = None,
    use_train_file: bool = True,
) -> Splits:
    """Load dataset `name` and split it; train comes from its natural train file when it has one
    (gsm8k, math, math_full) and `use_train_file` is true, else from the same pool as val/test."""
    spec = get_spec(name)
    problems = load_benchmark(spec.name, path)
    pool = load_benchmark(spec.train_dataset) if (use_train_file and spec.train_dataset) else None
    return make_splits(problems, seed, n_train, n_val, n_test, train_pool=pool)


def load_split_problems(splits: Splits, split: str, *, path: str | Path | None = None) -> list[Problem]:
    """Load the datasets a Splits was made from and return the problems of `split` (hash-checked)."""
    problems = load_benchmark(splits.benchmark, path)
    if splits.train_benchmark != splits.benchmark:
        problems = problems + load_benchmark(splits.train_benchmark)
    return splits.resolve(problems, split)


def save_splits(splits: Splits, path: str | Path) -> Path:
    """Write `splits` as JSON atomically (temp file in the same directory, fsync, os.replace)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(splits.to_dict(), indent=2, ensure_ascii=False) + "\n"
    return write_text_atomic(data, p)


def load_splits(path: str | Path) -> Splits:
    """Read a splits file written by save_splits; a bad file raises SplitError naming it."""
    p = Path(path)
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SplitError(f"splits file {p} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SplitError(f"splits file {p} is not valid JSON: {e}") from None
    if not isinstance(d, dict) or d.get("format") != SPLITS_FORMAT:
        raise SplitError(f"splits file {p} is not a {SPLITS_FORMAT} document")
    try:
        ids = d["ids"]
        lists = {s: ids[s] for s in SPLIT_NAMES}
        s = Splits(
            benchmark=d["benchmark"],
            train_benchmark=d.get("train_benchmark") or d["benchmark"],
            seed=d["seed"],
            train=lists["train"],
            val=lists["val"],
            test=lists["test"],
            content_hash=d["content_hash"],
            meta=d.get("meta") or {},
        )
    except (KeyError, TypeError) as e:
        raise SplitError(f"splits file {p} lacks field {e}") from None
    for name, lst in lists.items():
        if not isinstance(lst, list) or not all(isinstance(i, str) for i in lst):
            raise SplitError(f"splits file {p}: ids.{name} is not a list of strings")
    if d.get("sizes") not in (None, s.sizes):
        raise SplitError(f"splits file {p}: sizes {d.get('sizes')} do not match the id lists {s.sizes}")
    all_ids = s.train + s.val + s.test
    if len(set(all_ids)) != len(all_ids):
        raise SplitError(f"splits file {p}: an id appears twice (splits must be disjoint)")
    return s
