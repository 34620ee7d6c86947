"""Loaders on the real packaged data and on our fixtures, and their errors on bad input."""

from __future__ import annotations

import gzip
import json
import shutil

import pytest

from spogw_dagster.benchmarks import (
    BenchmarkDataError,
    BenchmarkFileNotFoundError,
    dataset_names,
    load_benchmark,
    write_fixtures,
)
from spogw_dagster.benchmarks.drop import render_answer
from spogw_dagster.benchmarks.gsm8k import parse_gsm8k_answer
from spogw_dagster.benchmarks.mbpp import entry_point_of
from spogw_dagster.paths import humaneval_data


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    return write_fixtures(tmp_path_factory.mktemp("fixtures"))


# ---------------------------------------------------------------- packaged data


def test_humaneval_real():
    ps = load_benchmark("humaneval")
    assert len(ps) == 164
    assert len({p.id for p in ps}) == 164
    p0 = ps[0]
    assert p0.id == "HumanEval/0" and p0.benchmark == "humaneval" and p0.family == "code"
    assert p0.entry_point == "has_close_elements"
    assert p0.question.lstrip().startswith("from typing import List")
    assert "def check(candidate)" in p0.hidden_tests
    assert "check(has_close_elements)" not in p0.hidden_tests  # appended at scoring time
    assert p0.answer.startswith(p0.question)  # prompt + canonical body: a complete program
    assert p0.meta["code_preamble"].strip() == "from typing import List"
    # most problems get public tests, none gets more than 3
    with_tests = [p for p in ps if p.public_tests]
    assert len(with_tests) >= 140
    assert max(len(p.public_tests) for p in ps) == 3


def test_gsm8k_real():
    test = load_benchmark("gsm8k")
    train = load_benchmark("gsm8k_train")
    assert len(test) == 1319 and len(train) == 7473
    assert test[0].id == "gsm8k/test/0" and train[0].id == "gsm8k/train/0"
    assert {p.benchmark for p in test + train} == {"gsm8k"}
    assert test[0].meta["dataset"] == "gsm8k" and train[0].meta["dataset"] == "gsm8k_train"
    assert test[0].question.startswith("Janet")
    assert test[0].answer == "18"  # 16 - 3 - 4 = 9 eggs at $2
    assert "####" not in test[0].meta["rationale"]
    assert all(float(p.answer) == float(p.answer) for p in test)


def test_math_real():
    m500 = load_benchmark("math")
    assert len(m500) == 500
    p = m500[0]
    assert p.id == "math500/test/precalculus/807.json"
    assert p.answer == r"\left( 3, \frac{\pi}{2} \right)"
    assert p.benchmark == "math" and p.family == "math"
    full = load_benchmark("math_full")
    assert len(full) == 5000
    assert all(p.answer for p in full)
    assert full[0].id == "math/test/0" and full[0].answer == "2"  # vertical asymptotes of 2/(x^2+x-6)
    train = load_benchmark("math_train")
    assert 7490 <= len(train) <= 7500  # a couple of train solutions end in an empty \boxed{}


def test_unknown_benchmark():
    with pytest.raises(ValueError, match="unknown benchmark 'nope'.*humaneval"):
        load_benchmark("nope")
    assert {"humaneval", "gsm8k", "math", "math_full", "mbpp", "drop", "hotpotqa"} <= set(dataset_names())


# ---------------------------------------------------------------- fixtures


def test_mbpp_fixture(fx):
    ps = load_benchmark("mbpp", fx["mbpp"])
    assert len(ps) == 6
    p = ps[0]
    assert p.id == "mbpp/901" and p.family == "code" and p.entry_point == "count_vowels"
    assert p.public_tests == ['assert count_vowels("hello") == 2']
    assert p.question.startswith("Write a python function to count the vowels")
    assert p.question.endswith('assert count_vowels("hello") == 2')
    assert p.hidden_tests.count("assert") == 3
    # setup code goes with the hidden tests; the entry point is found inside math.isclose(...)
    dist = ps[5]
    assert dist.entry_point == "point_distance"
    assert dist.hidden_tests.startswith("import math\n")
    assert dist.meta["test_setup_code"] == "import math"
    assert ps[2].meta["challenge_test_list"]  # kept, not scored
    # a directory holding the standard file name works too
    assert len(load_benchmark("mbpp", fx["mbpp"].parent)) == 6


def test_mbpp_sanitized_format(tmp_path):
    recs = [
        {
            "task_id": 2,
            "prompt": "Write a function to double a number.",
            "code": "def double(x):\n    return 2 * x",
            "test_imports": [],
            "test_list": ["assert double(2) == 4", "assert double(0) == 0"],
        }
    ]
    f = tmp_path / "sanitized-mbpp.json"
    f.write_text(json.dumps(recs))
    (p,) = load_benchmark("mbpp", f)
    assert p.entry_point == "double" and p.public_tests == ["assert double(2) == 4"]


def test_entry_point_of():
    assert entry_point_of("assert set(similar((3, 4), (4, 5))) == set((4,))", "def similar(a, b): pass") == "similar"
    assert entry_point_of("assert math.isclose(area(2), 4.0)", "def area(r): pass") == "area"
    # not defined by the reference code: first non-builtin name
    assert entry_point_of("assert sorted(foo([2, 1])) == [1, 2]", "") == "foo"


def test_drop_fixture(fx):
    ps = load_benchmark("drop", fx["drop"])
    assert [p.id for p in ps] == [f"drop/drop-fixture-q{i}" for i in range(1, 6)]
    by = {p.id: p for p in ps}
    assert by["drop/drop-fixture-q1"].golds == ["45"]
    assert by["drop/drop-fixture-q2"].golds == ["Tom Brennan", "Brennan"]  # answer + validated
    assert by["drop/drop-fixture-q3"].golds == ["Tom Brennan, Luis Pena"]
    assert by["drop/drop-fixture-q4"].golds == ["14 March 1721"]
    assert by["drop/drop-fixture-q5"].golds == ["700", "700 inhabitants"]
    q = by["drop/drop-fixture-q4"].question
    assert q.startswith("Passage: The treaty") and q.endswith("Question: When was the treaty signed?")
    assert all(p.family == "qa" and p.answer == p.golds[0] for p in ps)


def test_drop_render_answer():
    assert render_answer({"number": "7", "date": {}, "spans": []}) == ("number", "7")
    assert render_answer({"number": "", "date": {"day": "", "month": "June", "year": "1990"}, "spans": []}) == (
        "date",
        "June 1990",
    )
    assert render_answer({"number": "", "date": {"day": "", "month": "", "year": ""}, "spans": []}) is None


def test_hotpotqa_fixture(fx):
    ps = load_benchmark("hotpotqa", fx["hotpotqa"])
    assert len(ps) == 5
    p = ps[1]
    assert p.id == "hotpotqa/hotpot-fixture-2" and p.golds == ["Salzburg"] and p.family == "qa"
    assert p.question.startswith("Context:\nThe Magic Flute: The Magic Flute is an opera")
    assert "He was born in Salzburg in 1756." in p.question  # sentences joined
    assert p.question.endswith("Question: In which city was the composer of the opera The Magic Flute born?")
    assert p.meta["type"] == "bridge" and p.meta["supporting_facts"]


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize("name,fmt_word", [("mbpp", "test_list"), ("drop", "qa_pairs"), ("hotpotqa", "supporting_facts")])
def test_missing_path_is_explained(name, fmt_word):
    with pytest.raises(BenchmarkFileNotFoundError) as e:
        load_benchmark(name)
    msg = str(e.value)
    assert repr(name) in msg and fmt_word in msg and "path=" in msg


def test_nonexistent_path(tmp_path):
    with pytest.raises(BenchmarkFileNotFoundError, match="does not exist"):
        load_benchmark("drop", tmp_path / "nope.json")
    with pytest.raises(BenchmarkFileNotFoundError, match="holds none of"):
        load_benchmark("hotpotqa", tmp_path)  # empty directory


def test_mbpp_bad_json_line(tmp_path, fx):
    f = tmp_path / "mbpp.jsonl"
    f.write_text(fx["mbpp"].read_text().splitlines()[0] + "\n{not json\n")
    with pytest.raises(BenchmarkDataError, match=r"mbpp\.jsonl line 2 is not valid JSON"):
        load_benchmark("mbpp", f)


def test_mbpp_missing_field(tmp_path):
    f = tmp_path / "mbpp.jsonl"
    f.write_text(json.dumps({"task_id": 1, "text": "x", "code": "def f(): pass"}) + "\n")
    with pytest.raises(BenchmarkDataError, match=r"line 1 \(task_id 1\) has no field 'test_list'"):
        load_benchmark("mbpp", f)


def test_mbpp_empty_file(tmp_path):
    f = tmp_path / "mbpp.jsonl"
    f.write_text("\n")
    with pytest.raises(BenchmarkDataError, match="holds no problems"):
        load_benchmark("mbpp", f)


def test_drop_wrong_shape(tmp_path, fx):
    f = tmp_path / "drop.json"
    f.write_text("[1, 2]")
    with pytest.raises(BenchmarkDataError, match=r"drop\.json holds a JSON list; expected DROP JSON"):
        load_benchmark("drop", f)
    # a HotpotQA file given as DROP
    with pytest.raises(BenchmarkDataError, match="hotpot_dev_distractor_v1.json"):
        load_benchmark("drop", fx["hotpotqa"])


def test_drop_bad_question(tmp_path):
    f = tmp_path / "drop.json"
    f.write_text(json.dumps({"p1": {"passage": "x", "qa_pairs": [{"question": "q", "answer": {}}]}}))
    with pytest.raises(BenchmarkDataError, match=r"passage 'p1' qa_pairs\[0\] has no field 'query_id'"):
        load_benchmark("drop", f)


def test_hotpotqa_wrong_shape(tmp_path, fx):
    with pytest.raises(BenchmarkDataError, match="holds a JSON dict"):
        load_benchmark("hotpotqa", fx["drop"])
    f = tmp_path / "h.json"
    f.write_text(json.dumps([{"_id": "a", "question": "q", "answer": "x", "context": [["t", "not a list"]]}]))
    with pytest.raises(BenchmarkDataError, match=r"context\[0\] is not \[title, \[sentences\]\]"):
        load_benchmark("hotpotqa", f)
    f.write_text("{truncated")
    with pytest.raises(BenchmarkDataError, match="is not valid JSON"):
        load_benchmark("hotpotqa", f)


def test_gsm8k_bad_answer(tmp_path):
    f = tmp_path / "g.jsonl"
    f.write_text(json.dumps({"question": "q", "answer": "no marker"}) + "\n")
    with pytest.raises(BenchmarkDataError, match=r"g\.jsonl line 1.*'#### <number>'"):
        load_benchmark("gsm8k", f)
    assert parse_gsm8k_answer("so...\n#### 1,200") == "1200"
    assert parse_gsm8k_answer("#### -3") == "-3"
    assert parse_gsm8k_answer("nothing") is None


def test_humaneval_public_tests_never_use_hidden_tests(tmp_path):
    """Replacing every hidden test program leaves the public tests unchanged."""
    src = humaneval_data()
    rows = [json.loads(line) for line in gzip.open(src, "rt")]
    for r in rows:
        r["test"] = "def check(candidate):\n    assert candidate is not None\n"
    f = tmp_path / "HumanEval.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    altered = load_benchmark("humaneval", f)
    original = load_benchmark("humaneval")
    assert [p.public_tests for p in altered] == [p.public_tests for p in original]


def test_humaneval_test_without_check(tmp_path):
    src = humaneval_data()
    rows = [json.loads(line) for line in gzip.open(src, "rt")][:2]
    rows[1]["test"] = "assert True"
    f = tmp_path / "he.jsonl.gz"
    with gzip.open(f, "wt") as out:
        out.write("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(BenchmarkDataError, match=r"line 2 \(HumanEval/1\).*no check"):
        load_benchmark("humaneval", f)


def test_fixture_writer_creates_directory(tmp_path):
    d = tmp_path / "a" / "b"
    paths = write_fixtures(d)
    assert sorted(paths) == ["drop", "hotpotqa", "mbpp"]
    assert all(p.is_file() and p.parent == d for p in paths.values())
    shutil.rmtree(d)
