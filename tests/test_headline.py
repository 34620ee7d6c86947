"""The headline (last checkpoint vs base and vs the best static baseline, on the answer score) and the summary
over training seeds, by hand."""

from __future__ import annotations

import math
import os
from pathlib import Path

import polars as pl
import pytest

from spogw_dagster.pipeline.domain import headline as hl
from spogw_dagster.pipeline.data import report_stats
from spogw_dagster.pipeline.data import tables
from spogw_dagster.pipeline.data.storage import AssetStore


def _rows(system, kind, iteration, answers, *, mode="greedy", seed=7, ckpt=None):
    """One sample per query q0, q1, ... with the given answer scores."""
    return [{"iteration": iteration, "split": "test", "system": system, "kind": kind, "mode": mode,
             "greedy": mode == "greedy", "query_id": f"q{i}", "sample_idx": 0, "seed": seed, "exec_seed": 11,
             "temperature": None, "parse_status": "ok", "status": "ok", "valid": True, "executes": 1.0,
             "reward": a, "answer_score": a, "trivial": False, "copied_from": None, "near_copy": False,
             "finish_reason": "stop", "n_tokens": 1, "llm_calls": 1, "cached_calls": 0, "prompt_tokens": 1,
             "completion_tokens": 1, "checkpoint_iteration": ckpt, "adapter_sha256": None, "workflow": "w",
             "error": ""} for i, a in enumerate(answers)]


def _store(tmp_path, last_answers):
    store = AssetStore(tmp_path)
    base = [1, 0, 0, 0]
    r0 = _rows("spogw@0000", "checkpoint", 0, [1, 1, 0, 0], ckpt=0) + _rows("base", "previous", 0, base) \
        + _rows("baseline:io", "baseline", 0, [1, 1, 1, 0], seed=None) + _rows("baseline:cot", "baseline", 0,
                                                                               [0, 1, 0, 0], seed=None)
    r1 = _rows("spogw@0001", "checkpoint", 1, last_answers, ckpt=1) + _rows("spogw@0000", "previous", 1, [1, 1, 0, 0],
                                                                            ckpt=0)
    store.write_parquet("heldout_results", "0000", tables.heldout_frame(r0))
    store.write_parquet("heldout_results", "0001", tables.heldout_frame(r1))
    return store


def test_last_checkpoint_against_base_and_best_baseline(tmp_path):
    rows = hl.headline(_store(tmp_path, [1, 1, 1, 1]), resamples=100)
    by = {r["against"]: r for r in rows}
    assert set(by) == {"base", "baseline:io"}  # io (3/4) beats cot (1/4)
    # vs base: per-query diffs 0, 1, 1, 1 -> mean 0.75
    assert by["base"]["system"] == "spogw@0001"
    assert (by["base"]["a"], by["base"]["b"], by["base"]["diff"]) == (1.0, 0.25, 0.75)
    # vs io: diffs 0, 0, 0, 1 -> 0.25; bootstrap resamples of {0, 0, 0, 1} stay within [0, 1]
    assert by["baseline:io"]["diff"] == 0.25 and 0.0 <= by["baseline:io"]["diff_ci_low"] <= 0.25
    text = hl.headline_text(rows)
    assert "spogw@0001 vs base" in text and "Δ +0.750" in text


def test_baseline_pairs_need_only_the_executor_seed():
    a = tables.heldout_frame(_rows("P", "checkpoint", 0, [1, 0]))
    b = tables.heldout_frame(_rows("baseline:io", "baseline", 0, [0, 0], seed=None))
    with pytest.raises(ValueError, match="different seeds"):
        report_stats.paired_comparison(a, b)
    (r,) = [x for x in report_stats.paired_comparison(a, b, resamples=50, generator_seeds=False)
            if x["metric"] == "answer_score"]
    assert r["diff"] == 0.5


def test_seed_table_mean_and_spread_by_hand():
    per_seed = {0: [{"against": "base", "mode": "greedy", "a": 0.5, "b": 0.25, "diff": 0.25, "diff_ci_low": 0.0,
                     "diff_ci_high": 0.5}],
                1: [{"against": "base", "mode": "greedy", "a": 0.25, "b": 0.25, "diff": 0.0, "diff_ci_low": -0.25,
                     "diff_ci_high": 0.25}],
                2: [{"against": "base", "mode": "greedy", "a": 0.75, "b": 0.25, "diff": 0.5, "diff_ci_low": 0.25,
                     "diff_ci_high": 0.75}]}
    t = hl.seed_table(per_seed)
    agg = t.filter(pl.col("seed").is_null()).row(0, named=True)
    # diffs 0.25, 0, 0.5: mean 0.25, sample sd sqrt(((0)^2 + 0.25^2 + 0.25^2) / 2) = 0.25
    assert agg["diff"] == 0.25 and agg["sd"] == pytest.approx(0.25) and (agg["min"], agg["max"]) == (0.0, 0.5)
    assert agg["this"] == 0.5 and agg["n_seeds"] == 3
    assert t.filter(pl.col("seed").is_not_null()).height == 3
    one = hl.seed_table({0: per_seed[0]}).filter(pl.col("seed").is_null()).row(0, named=True)
    assert math.isnan(one["sd"])
    assert "mean of 3" in hl.seed_table_text(t)


def test_seed_overrides_keep_the_heldout_draws():
    from spogw_dagster.pipeline.settings import load_config

    a = load_config("tiny", None, hl.seed_overrides(1, tmp := Path("/tmp/c.sqlite")))
    b = load_config("tiny", None, hl.seed_overrides(2, tmp))
    assert (a.generator.seed, a.training.seed, a.curation.seed) == (1, 1, 1)
    assert a.report.seed == b.report.seed and a.execution.seed == b.execution.seed
    assert a.hash != b.hash


def test_parse_seeds():
    from spogw_dagster.pipeline.runs.commands import parse_seeds
    from spogw_dagster.pipeline.settings import ConfigValidationError

    assert parse_seeds("0, 1,2") == [0, 1, 2]
    for bad in ("a,b", "1,1", ","):
        with pytest.raises(ConfigValidationError, match="--seeds"):
            parse_seeds(bad)


def test_run_seeds_runs_one_loop_per_seed_and_summarises(tmp_path, monkeypatch):
    """run_seeds' own logic (directories, overrides, each seed's Dagster instance, the summary), with the loop's
    iterations replaced by ones that write each seed's held-out rows: the loop is tested end to end in
    test_pipeline_e2e."""
    import io

    from spogw_dagster.pipeline.runs import loop

    calls = []

    from spogw_dagster.pipeline.settings import load_config

    def fake_locked(cfg, root, config_file, force, out, instance, log_level, steps):
        # run_loop itself runs (config, lock, environment); only its iterations are replaced
        calls.append((Path(root), {"executor": {"cache_file": cfg.executor.cache_file}},
                      loop.ensure_dagster_home(Path(root))))
        _store(Path(root), [1, 1, 1, 1] if cfg.generator.seed == 0 else [1, 1, 0, 0])
        return [loop.IterationOutcome("0000", "ok")]

    monkeypatch.setattr(loop, "require", lambda profile, config_file, overrides, **kw:
                        load_config(profile, config_file, overrides))
    monkeypatch.setattr(loop, "_run_loop_locked", fake_locked)
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    out = io.StringIO()
    loop.run_seeds("ci", None, 1, tmp_path, [0, 1], out=out)
    assert [c[0].name for c in calls] == ["seed-0", "seed-1"]
    # each seed's runs in its own instance (the loop sets DAGSTER_HOME; the next seed must not inherit it)
    assert [c[2] for c in calls] == [tmp_path.resolve() / "seed-0" / ".dagster", tmp_path.resolve() / "seed-1" / ".dagster"]
    assert "DAGSTER_HOME" not in os.environ
    assert {c[1]["executor"]["cache_file"] for c in calls} == {str(tmp_path.resolve() / "call_cache.sqlite")}
    t = pl.read_parquet(tmp_path / "seeds_summary.parquet")
    agg = t.filter(pl.col("seed").is_null() & (pl.col("against") == "base")).row(0, named=True)
    # vs base (0.25): seed 0 gains 0.75, seed 1 gains 0.25 -> mean 0.5, sd sqrt(2 * 0.25^2 / 1) = 0.3536
    assert agg["diff"] == 0.5 and agg["sd"] == pytest.approx(0.35355, abs=1e-4)
    assert "mean of 2" in out.getvalue()


def test_old_partitions_without_copy_columns_do_not_break_the_headline(tmp_path):
    """Partitions written before near_copy existed: concatenated with new ones the column is null for them, so
    the metric is left out of the comparison, not summed over nulls."""
    store = _store(tmp_path, [1, 1, 1, 1])
    old = store.read_parquet("heldout_results", "0000").drop("copied_from", "near_copy")
    store.write_parquet("heldout_results", "0000", old)
    rows = hl.headline(store, resamples=50)
    assert {r["against"] for r in rows} == {"base", "baseline:io"}
    held = hl.heldout_rows(store)
    metrics = {r["metric"] for r in report_stats.paired_comparison(report_stats.system_rows(held, "spogw@0001"),
                                                              report_stats.system_rows(held, "base"), resamples=50)}
    assert "answer_score" in metrics and "near_copy_rate" not in metrics


def test_a_baseline_cached_before_the_copy_columns_is_upgraded_not_a_crash(tmp_path):
    from spogw_dagster.pipeline.domain import heldout as ho

    rows = tables.heldout_frame(_rows("baseline:io", "baseline", 0, [1, 0], seed=None)).drop("copied_from",
                                                                                              "near_copy")
    (tmp_path / ho.CACHE_DIR).mkdir(parents=True)
    rows.write_parquet(tmp_path / ho.CACHE_DIR / f"baseline-{'k' * 24}.parquet")
    got = ho.cached_baseline(tmp_path, "k" * 40, 3)
    assert got["near_copy"].to_list() == [False, False] and got["copied_from"].null_count() == 2
    assert set(got.columns) == set(tables.HELDOUT_SCHEMA) and got["iteration"].to_list() == [3, 3]
    both = pl.concat([tables.heldout_frame(_rows("P", "checkpoint", 3, [1, 1])), got], how="vertical_relaxed")
    assert both.height == 4


def test_every_checkpoint_of_a_seed_against_base_io_and_the_best_static(tmp_path):
    rows = hl.checkpoint_rows(_store(tmp_path, [1, 1, 1, 1]), seed=3, resamples=100)
    assert [(r["seed"], r["iteration"], r["system"]) for r in rows] == [(3, 0, "spogw@0000"), (3, 1, "spogw@0001")]
    first, last = rows
    # spogw@0000 answers 1, 1, 0, 0: 0.5 at one call per query; base 1, 0, 0, 0 -> diffs 0, 1, 0, 0 = +0.25;
    # io 1, 1, 1, 0 (the best static: cot has 0.25) -> diffs 0, 0, -1, 0 = -0.25
    assert (first["answer"], first["calls_per_query"], first["n_queries"]) == (0.5, 1.0, 4)
    assert first["delta_vs_base"]["diff"] == 0.25 and first["delta_vs_base"]["other"] == 0.25
    assert first["delta_vs_io"]["diff"] == -0.25 and first["delta_vs_io"]["other"] == 0.75
    assert first["best_static"] == "baseline:io" and first["delta_vs_best_static"] == first["delta_vs_io"]
    lo, hi = first["delta_vs_io"]["low"], first["delta_vs_io"]["high"]
    assert -1.0 <= lo <= -0.25 <= hi <= 0.0
    # spogw@0001 answers all four: +0.75 vs base, +0.25 vs io
    assert (last["answer"], last["delta_vs_base"]["diff"], last["delta_vs_io"]["diff"]) == (1.0, 0.75, 0.25)
    assert first["carried_forward"] is None  # no lora_checkpoint table in this store
    store = AssetStore(tmp_path)
    for k, trained, selected in ((0, True, None), (1, True, False)):
        store.write_parquet("lora_checkpoint", f"{k:04d}", tables.checkpoint_frame(
            {"iteration": k, "trained": trained, "reused": False, "selected": selected}))
    assert [r["carried_forward"] for r in hl.checkpoint_rows(store, 3, resamples=50)] == [False, True]
    # a reference no report scored pairs with nothing
    assert hl.checkpoint_rows(AssetStore(tmp_path), 3, reference="baseline:sc3", resamples=50)[0]["delta_vs_io"] is None


def test_the_headline_table_bench_prints_and_writes_every_seed(tmp_path):
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("headline_table", Path(__file__).parents[1] / "bench" / "headline_table.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    _store(tmp_path / "seed-0", [1, 1, 1, 1])
    _store(tmp_path / "seed-1", [0, 0, 0, 0])
    out = tmp_path / "results" / "headline.json"
    png = tmp_path / "results" / "headline.png"
    assert bench.main([str(tmp_path), "--json", str(out), "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = json.loads(out.read_text())
    assert [(r["seed"], r["iteration"]) for r in rows] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # seed 1's last checkpoint answers none: -0.25 vs base; the mean over the two seeds at iteration 1 is +0.25
    text = bench.table(rows)
    assert "| 1 | 1 | 0.000 | 1.00 | -0.250" in text and "| mean of 2 | 1 | 0.500 | 1.00 | +0.250" in text


def test_pareto_table_by_hand():
    # four queries; calls per query: checkpoint 4, base 2, io 1, cot 1
    rows = (_rows("spogw@0000", "checkpoint", 0, [1, 1, 1, 0]) + _rows("base", "previous", 0, [1, 0, 0, 0])
            + _rows("baseline:io", "baseline", 0, [1, 1, 0, 0], seed=None)
            + _rows("baseline:cot", "baseline", 0, [1, 0, 0, 0], seed=None))
    for r in rows:
        r["llm_calls"] = {"spogw@0000": 4, "base": 2, "baseline:io": 1, "baseline:cot": 1}[r["system"]]
    rows[3]["status"] = "executor_error"  # the checkpoint's fourth query: left out (3 queries, 1.0, 4 calls)
    t = report_stats.pareto_table(tables.heldout_frame(rows))
    got = {r["system"]: (r["answer_score"], r["calls_per_query"], r["on_frontier"]) for r in t.iter_rows(named=True)}
    # io (0.5 at 1 call) dominates cot (0.25 at 1) and base (0.25 at 2); the checkpoint (1.0 at 4) is not dominated
    assert got == {"baseline:io": (0.5, 1.0, True), "baseline:cot": (0.25, 1.0, False), "base": (0.25, 2.0, False),
                   "spogw@0000": (1.0, 4.0, True)}
    assert t["system"].to_list()[-1] == "spogw@0000"  # sorted by calls
    assert "| spogw@0000 | 1.000 | 4.00 | yes |" in report_stats.pareto_text(t)
