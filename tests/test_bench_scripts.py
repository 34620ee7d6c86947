"""Every script under bench/ imports: a moved or renamed function breaks a benchmark nobody runs in CI
otherwise (they need minutes or a GPU to run, not to load)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"

LOAD_ALL = """
import importlib.util, sys
bad = []
for path in sys.argv[1:]:
    name = "bench_" + path.rsplit("/", 1)[-1][:-3]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = sys.modules[name] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
    try:
        spec.loader.exec_module(mod)
    except Exception as e:  # noqa: BLE001
        bad.append(f"{path}: {type(e).__name__}: {e}")
print("\\n".join(bad))
sys.exit(1 if bad else 0)
"""


def test_every_bench_script_imports():
    scripts = sorted(str(p) for p in BENCH.glob("*.py"))
    assert len(scripts) >= 10
    res = subprocess.run([sys.executable, "-c", LOAD_ALL, *scripts], capture_output=True, text=True, timeout=600,
                         cwd=BENCH.parent)
    assert res.returncode == 0, res.stdout + res.stderr[-2000:]


def test_retrain_reads_its_settings_as_the_config_would():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_retrain", BENCH / "retrain.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    got = mod.field_overrides(["epochs=3", "learning_rate=2e-3", "objective=grpo", "eval_after=true"])
    assert got == {"epochs": 3, "learning_rate": 0.002, "objective": "grpo", "eval_after": True}
    assert type(got["epochs"]) is int and type(got["learning_rate"]) is float
    import pytest

    with pytest.raises(SystemExit, match="FIELD=VALUE"):
        mod.field_overrides(["epochs"])
    with pytest.raises(SystemExit, match="--curation 'anchor_weight'"):
        mod.field_overrides(["anchor_weight"], "--curation")


def _write_seed(root: Path, answers: dict[str, list[float]], base: list[float], queries=("q0", "q1", "q2", "q3")):
    import polars as pl

    def frame(system_answers):
        return pl.DataFrame([{"system": s, "mode": "greedy", "split": "validation", "query_id": q, "exec_seed": 0,
                              "status": "ok", "answer_score": a}
                             for s, v in system_answers.items() for q, a in zip(queries, v)])

    for table, rows in (("comparison_heldout", frame(answers)), ("selection_results", frame({"base": base}))):
        (root / table).mkdir(parents=True)
        rows.write_parquet(root / table / "0000.parquet")


def test_pool_comparison_pools_seeds_per_query(tmp_path, capsys):
    """Two seeds of 4 queries: spogw 2/4 and 1/4 (pooled 3/8), grpo 1/4 and 1/4 (2/8); grpo − spogw per query and
    seed: (−1, 0, 0, 0) and (+1, −1, 0, 0), mean −1/8 = −0.125; base 0/4 both: spogw − base = +0.375; IO 1/4 both.
    Seeds holding other queries are refused."""
    import importlib.util

    import pytest

    spec = importlib.util.spec_from_file_location("bench_pool_comparison", BENCH / "pool_comparison.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    _write_seed(tmp_path / "s0", {"spogw": [1, 1, 0, 0], "grpo": [0, 1, 0, 0], "baseline:io": [1, 0, 0, 0]},
                [0, 0, 0, 0])
    _write_seed(tmp_path / "s1", {"spogw": [0, 1, 0, 0], "grpo": [1, 0, 0, 0], "baseline:io": [1, 0, 0, 0]},
                [0, 0, 0, 0])
    assert mod.main([str(tmp_path / "s0"), str(tmp_path / "s1"), "--resamples", "2000"]) == 0
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ") and not line.startswith("| system")}
    assert rows["spogw"][1:4] == ["0.500", "0.250", "0.375"]
    assert rows["grpo"][1:4] == ["0.250", "0.250", "0.250"] and rows["grpo"][4].startswith("-0.125 [")
    assert rows["spogw"][6].startswith("+0.375 [") and rows["baseline:io"][3] == "0.250"
    _write_seed(tmp_path / "s2", {"spogw": [0, 1, 0, 0]}, [0, 0, 0, 0], queries=("q0", "q1", "q2", "q9"))
    with pytest.raises(SystemExit, match="different queries"):
        mod.main([str(tmp_path / "s0"), str(tmp_path / "s2")])


def _load(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_executor_levers_measures_what_a_stop_and_a_prompt_lookup_could_save():
    mod = _load("executor_levers")
    # llama.cpp returns the text before the stop string; the opening fence is not a stop
    assert mod.cut_at_stop("```python\ndef f():\n    return 1\n```\n\nIt returns 1.") == "```python\ndef f():\n    return 1"
    assert mod.cut_at_stop("```python\ndef f(): pass\n```") == "```python\ndef f(): pass\n```"
    # 24+ character runs that occur in the prompt: the docstring (30 characters) counts, the new body does not
    doc = '"""Return the sum of xs."""\n'  # 28 characters
    prompt = "def total(xs):\n    " + doc
    reply = "def total(xs):\n    " + doc + "    return sum(xs)\n"
    assert mod.copied_chars(reply, prompt) == len("def total(xs):\n    " + doc)
    assert mod.copied_chars("short", prompt) == 0


def test_headroom_oracle_takes_the_best_per_query_at_the_cheapest_calls(tmp_path):
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("bench_headroom", BENCH / "headroom.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    table = {"io": {"a": (1.0, 1), "b": (0.0, 1), "c": (0.0, 1)},
             "gen_test": {"a": (1.0, 2), "b": (1.0, 2), "c": (0.0, 2)},
             "sc3": {"a": (0.0, 4), "b": (1.0, 4), "c": (1.0, 5), "d": (1.0, 4)}}
    # a: io and gen_test answer, io is cheaper (1); b: gen_test (2) beats sc3 (4); c: only sc3 (5); d is not
    # scored by every method, so it is left out
    assert mod.oracle(table) == {"a": (1.0, 1), "b": (1.0, 2), "c": (1.0, 5)}
    assert mod.oracle({"io": {"a": (0.0, None)}, "x": {"a": (0.0, 3)}}) == {"a": (0.0, None)}
    # from `spogw baseline --json` files: executor errors leave, per-query calls come along
    f = tmp_path / "io.json"
    f.write_text(json.dumps({"method": "io", "results": [{"query": "a", "status": "ok", "score": 1.0, "llm_calls": 1},
                                                         {"query": "b", "status": "executor_error", "score": 0.0}]}))
    assert mod.from_json([str(f)], None) == {"io": {"a": (1.0, 1)}}


def test_structure_margin_counts_where_greedy_can_open_the_ensemble():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_structure_margin", BENCH / "structure_margin.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    # two queries: the ensemble is the likelier whole sequence on both (margins +1 and +2 over gen_test), but its
    # first token " solutions" beats " solution" only on the second (0.3 > 0.2; 0.1 < 0.4 on the first)
    lp = {"io": [-9.0, -9.0], "gen_test": [-5.0, -6.0], "sc3_test": [-4.0, -4.0]}
    ft = {" solution": [0.4, 0.2], " solutions": [0.1, 0.3]}
    r = mod.summarize("p", lp, ft)
    assert r["most_likely"] == {"io": 0, "gen_test": 0, "sc3_test": 2}
    assert r["mean_margin_vs_gen_test"]["sc3_test"] == 1.5  # (1 + 2) / 2
    assert r["solutions_first"] == 1
