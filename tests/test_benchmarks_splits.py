"""Splits: deterministic, order-independent, disjoint; train from the train file where there is one;
written atomically; bad input and changed data raise clear errors."""

from __future__ import annotations

import json
import os
import random

import pytest

from spogw_dagster.benchmarks import (
    SplitError,
    Splits,
    load_benchmark,
    load_split_problems,
    load_splits,
    make_benchmark_splits,
    make_splits,
    save_splits,
)
from spogw_dagster.contracts import Problem


def _probs(n, dataset="toy", prefix="toy"):
    return [
        Problem(benchmark=dataset, id=f"{prefix}/{i}", question=f"question {prefix} {i}", answer=str(i),
                meta={"dataset": dataset})
        for i in range(n)
    ]


def test_deterministic_and_order_independent():
    ps = _probs(50)
    a = make_splits(ps, 7, 10, 5, 20)
    shuffled = ps[:]
    random.Random(1).shuffle(shuffled)
    b = make_splits(shuffled, 7, 10, 5, 20)
    assert (a.train, a.val, a.test, a.content_hash) == (b.train, b.val, b.test, b.content_hash)
    c = make_splits(ps, 8, 10, 5, 20)
    assert c.train != a.train and c.content_hash != a.content_hash
    assert a.sizes == {"train": 10, "val": 5, "test": 20}
    assert a.benchmark == a.train_benchmark == "toy" and a.seed == 7


def test_disjoint_and_stable_when_pool_grows():
    a = make_splits(_probs(100), 0, 30, 30, 40)
    assert len(set(a.train) | set(a.val) | set(a.test)) == 100
    # adding problems never reorders the old ones: keys depend on (seed, id) only
    big = make_splits(_probs(200), 0, 0, 0, 200)
    old = set(p.id for p in _probs(100))
    assert [i for i in big.test if i in old] == a.train + a.val + a.test


def test_too_few_problems():
    with pytest.raises(SplitError, match=r"'toy' has 10 problems, too few for train 5 \+ val 3 \+ test 3 = 11"):
        make_splits(_probs(10), 0, 5, 3, 3)
    he = load_benchmark("humaneval")
    with pytest.raises(SplitError, match="'humaneval' has 164 problems"):
        make_splits(he, 0, 100, 33, 131)


@pytest.mark.parametrize("args", [(0, -1, 1, 1), (0, 1.5, 1, 1), ("0", 1, 1, 1), (0, True, 1, 1)])
def test_bad_sizes(args):
    with pytest.raises(SplitError):
        make_splits(_probs(10), *args)


def test_bad_problem_lists():
    with pytest.raises(SplitError, match="no problems"):
        make_splits([], 0, 0, 0, 0)
    with pytest.raises(SplitError, match="duplicate id 'toy/0'"):
        make_splits(_probs(3) + _probs(1), 0, 1, 1, 1)
    with pytest.raises(SplitError, match="mixes datasets"):
        make_splits(_probs(3) + _probs(3, "other", "o"), 0, 1, 1, 1)


def test_train_pool():
    test_file = _probs(20, "bench", "bench/test")
    train_file = _probs(30, "bench_train", "bench/train")
    s0 = make_splits(test_file, 1, 25, 5, 15, train_pool=train_file)
    assert s0.benchmark == "bench" and s0.train_benchmark == "bench_train"
    assert all(i.startswith("bench/train/") for i in s0.train)
    assert all(i.startswith("bench/test/") for i in s0.val + s0.test)
    assert s0.meta["train_pool_overlap_skipped"] == 0
    # a train-file problem repeating a held-out question (case and spaces aside) is never used for training
    held_q = next(p.question for p in test_file if p.id == s0.val[0])
    dup = Problem(benchmark="bench", id="bench/train/dup", question="  " + held_q.upper() + " ", answer="x",
                  meta={"dataset": "bench_train"})
    s = make_splits(test_file, 1, 30, 5, 15, train_pool=train_file + [dup])
    assert (s.val, s.test) == (s0.val, s0.test)
    assert "bench/train/dup" not in s.train and s.meta["train_pool_overlap_skipped"] == 1
    with pytest.raises(SplitError, match="train pool 'bench_train' has 30 usable problems, too few for train 31"):
        make_splits(test_file, 1, 31, 5, 15, train_pool=train_file + [dup])
    with pytest.raises(SplitError, match="too few for val 10 \\+ test 15"):
        make_splits(test_file, 1, 1, 10, 15, train_pool=train_file)


def test_benchmark_splits_use_the_train_file():
    s = make_benchmark_splits("gsm8k", 0, 100, 50, 200)
    assert s.train_benchmark == "gsm8k_train"
    assert all(i.startswith("gsm8k/train/") for i in s.train)
    assert all(i.startswith("gsm8k/test/") for i in s.val + s.test)
    assert s.to_dict()["ids"]["val"] == s.val
    again = make_benchmark_splits("gsm8k", 0, 100, 50, 200)
    assert again.content_hash == s.content_hash
    m = make_benchmark_splits("math", 0, 10, 10, 10)
    assert m.train_benchmark == "math_train" and m.train[0].startswith("math/train/")
    assert m.val[0].startswith("math500/")
    one_pool = make_benchmark_splits("gsm8k", 0, 10, 10, 10, use_train_file=False)
    assert all(i.startswith("gsm8k/test/") for i in one_pool.train)
    he = make_benchmark_splits("humaneval", 0, 20, 33, 111)
    assert he.train_benchmark == "humaneval"


def test_resolve_and_load_split_problems(tmp_path):
    s = make_benchmark_splits("gsm8k", 3, 5, 5, 5)
    train = load_split_problems(s, "train")
    assert [p.id for p in train] == s.train and all(p.meta["dataset"] == "gsm8k_train" for p in train)
    assert [p.id for p in load_split_problems(s, "test")] == s.test
    with pytest.raises(ValueError, match="unknown split"):
        s.resolve([], "dev")
    # data that changed since the splits were written is refused
    probs = load_benchmark("gsm8k") + load_benchmark("gsm8k_train")
    by_id = {p.id: p for p in probs}
    by_id[s.test[0]].answer = "999999"
    with pytest.raises(SplitError, match="data changed"):
        s.resolve(probs, "test")
    with pytest.raises(SplitError, match="not among the given problems"):
        s.resolve(load_benchmark("gsm8k"), "val")


def test_save_load_roundtrip(tmp_path):
    s = make_splits(_probs(30), 5, 10, 10, 10)
    path = save_splits(s, tmp_path / "sub" / "splits.json")
    assert path.is_file()
    assert os.listdir(path.parent) == ["splits.json"]  # no temp file left behind
    d = json.loads(path.read_text())
    assert d["sizes"] == {"train": 10, "val": 10, "test": 10} and d["content_hash"] == s.content_hash
    back = load_splits(path)
    assert isinstance(back, Splits)
    assert (back.train, back.val, back.test, back.seed, back.benchmark, back.content_hash) == (
        s.train, s.val, s.test, s.seed, s.benchmark, s.content_hash
    )
    assert [p.id for p in back.resolve(_probs(30), "val")] == s.val


def test_save_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "splits.json"
    first = make_splits(_probs(30), 1, 10, 10, 10)
    save_splits(first, path)
    before = path.read_bytes()

    def failing_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        save_splits(make_splits(_probs(30), 2, 10, 10, 10), path)
    assert path.read_bytes() == before  # the old file is intact
    assert os.listdir(tmp_path) == ["splits.json"]  # and the temp file is gone


def test_load_splits_errors(tmp_path):
    p = tmp_path / "s.json"
    with pytest.raises(SplitError, match="does not exist"):
        load_splits(p)
    p.write_text("{oops")
    with pytest.raises(SplitError, match="not valid JSON"):
        load_splits(p)
    p.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(SplitError, match="is not a spogw-splits/1 document"):
        load_splits(p)
    good = make_splits(_probs(10), 0, 3, 3, 3).to_dict()
    bad = json.loads(json.dumps(good))
    del bad["content_hash"]
    p.write_text(json.dumps(bad))
    with pytest.raises(SplitError, match="lacks field 'content_hash'"):
        load_splits(p)
    bad = json.loads(json.dumps(good))
    bad["ids"]["test"].append(bad["ids"]["train"][0])
    bad["sizes"]["test"] += 1
    p.write_text(json.dumps(bad))
    with pytest.raises(SplitError, match="appears twice"):
        load_splits(p)
    bad = json.loads(json.dumps(good))
    bad["sizes"]["train"] = 99
    p.write_text(json.dumps(bad))
    with pytest.raises(SplitError, match="do not match"):
        load_splits(p)


def test_validation_split_for_choosing_settings():
    """Settings are chosen on `validation`: disjoint from the training queries and from the held-out test
    queries; the ids used are recorded by hash."""
    import hashlib

    from spogw_dagster.benchmarks.splits import ids_sha256
    from spogw_dagster.benchmarks.queries import held_out_problems, split_problems

    val, info = split_problems("humaneval", "validation")
    test, tinfo = split_problems("humaneval", "test", limit=20)
    assert [p.id for p in test] == [p.id for p in held_out_problems("humaneval", limit=20)]
    assert info["split"] == "validation" and info["queries"] == len(val) == info["split_sizes"]["val"] == 16
    assert not {p.id for p in val} & {p.id for p in held_out_problems("humaneval")}
    from spogw_dagster.benchmarks import load_split_problems, make_benchmark_splits

    s = make_benchmark_splits("humaneval", 0, *[info["split_sizes"][k] for k in ("train", "val", "test")])
    assert not {p.id for p in val} & set(s.train)
    assert info["ids_sha256"] == hashlib.sha256("\n".join(p.id for p in val).encode()).hexdigest()
    assert ids_sha256(["a", "b"]) != ids_sha256(["b", "a"])
    assert info["splits_content_hash"] == s.content_hash == tinfo["splits_content_hash"]
    assert [p.id for p in load_split_problems(s, "val")] == [p.id for p in val]
    with pytest.raises(ValueError, match="has 16"):
        split_problems("humaneval", "validation", limit=17)
    with pytest.raises(ValueError, match="unknown split"):
        split_problems("humaneval", "train")


def test_training_problems_are_what_an_iteration_samples_for():
    """`spogw baseline --split train` scores the queries training sees: the first d of the train split, the
    pipeline's own `benchmark.train_queries` (the same function serves both)."""
    from spogw_dagster.benchmarks.queries import default_split_sizes, held_out_problems, training_problems

    first = training_problems("humaneval", limit=16)
    s = make_benchmark_splits("humaneval", 0, *default_split_sizes("humaneval"))
    assert [p.id for p in first] == s.train[:16] and len(training_problems("humaneval")) == len(s.train) == 65
    assert not {p.id for p in training_problems("humaneval")} & {p.id for p in held_out_problems("humaneval")}
    with pytest.raises(ValueError, match="has 65; choose 1 to 65"):
        training_problems("humaneval", limit=66)
