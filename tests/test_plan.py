"""spogw plan (spogw_dagster/pipeline/runs/plan.py): counts computed by hand."""

from __future__ import annotations

import math

import polars as pl
import pytest

from spogw_dagster.pipeline.runs.preflight import load_config_for_plan
from spogw_dagster.pipeline.runs.plan import (
    Measured,
    Speeds,
    format_plan,
    groups_per_query,
    measure_assets,
    plan_from_config,
    plan_iteration,
    training_rows_per_query,
)


def test_groups_and_rows_per_query_by_hand():
    # the paper: m = 16, n = 14 -> C(16, 14) = 16*15/2 = 120 groups <= g_max = 120; rows = 120 x 2t(=8) = 960
    assert math.comb(16, 14) == 120
    assert training_rows_per_query(16, 14, 4, 120) == (120, 960, 16)
    assert groups_per_query(16, 14, 50) == 50  # more subsets than g_max: g_max of them
    assert groups_per_query(15, 14, 120) == 15  # one near-duplicate fewer: C(15, 14) = 15
    assert training_rows_per_query(15, 14, 4, 120) == (15, 120, 15)
    assert groups_per_query(13, 14, 120) == 0  # m' < n: no group
    # tiny: m = 8, n = 5 -> C(8, 5) = 56 > g_max = 2 -> 2 groups x 2t(=4) = 8 rows, at most 8 distinct workflows
    assert training_rows_per_query(8, 5, 2, 2) == (2, 8, 8)
    # one group of 4 sharpened to 2 rows: only 2 distinct workflows, fewer than m
    assert training_rows_per_query(4, 4, 1, 1) == (1, 2, 2)


def test_paper_iteration_upper_bounds_by_hand():
    p = plan_iteration(d=100, m=16, n=14, t=4, g_max=120, runs=1, max_new_tokens=512, max_llm_calls=32,
                       executor_max_tokens=1024, batch_size=8, epochs=1, heldout=80, report_greedy=True,
                       report_samples=8, speeds=Speeds(100.0, 1000.0, 50.0))
    assert p.samples == 1600 and p.generator_tokens == 1600 * 512 and not p.tokens_per_sample_is_measured
    assert p.executor_calls == 1600 * 32 and not p.calls_are_measured  # the cap: an upper bound
    assert p.executor_completion_tokens == 1600 * 32 * 1024 and p.executor_prompt_tokens is None
    assert (p.rows_per_query, p.training_rows, p.training_rows_unique) == (960, 96_000, 1_600)
    assert (p.steps, p.steps_unique) == (12_000, 200)  # ceil(96000 / 8), ceil(1600 / 8)
    assert p.report_workflows == 80 * 9 and p.report_executor_calls == 720 * 32
    assert p.generator_s == pytest.approx(1600 * 512 / 100)
    assert p.executor_s == pytest.approx(1600 * 32 * 1024 / 1000)
    assert p.train_s == pytest.approx(96_000 * 512 / 50) and p.train_unique_s == pytest.approx(1600 * 512 / 50)
    text = format_plan(p)
    assert "upper bound: executor.max_llm_calls" in text and "960 rows per query" in text
    assert "min(C(16, 14) = 120, g_max = 120) = 120" in text


def test_measured_averages_replace_the_caps():
    m = Measured(calls_per_workflow=2.5, prompt_tokens_per_call=100.0, completion_tokens_per_call=40.0,
                 tokens_per_sample=60.0, workflows=10, samples=10, source="x")
    p = plan_iteration(d=2, m=4, n=4, t=1, g_max=1, runs=3, max_new_tokens=32, max_llm_calls=6,
                       executor_max_tokens=48, batch_size=4, grad_accum=2, epochs=2, heldout=2, report_greedy=True,
                       report_samples=2, first_iteration=True, measured=m)
    assert p.calls_are_measured and p.executor_calls == 8 * 3 * 2.5  # 8 workflows x R = 3 x 2.5
    assert p.executor_completion_tokens == 60 * 40 and p.executor_prompt_tokens == 60 * 100
    assert p.generator_tokens == 8 * 60
    assert (p.training_rows, p.training_rows_unique, p.steps) == (4, 4, 2)  # ceil(4 / (4 x 2)) x 2 epochs
    assert p.report_workflows == 2 * 3 * 2  # (greedy + 2 samples) x 2 queries x (pi_0 and base at k = 0)
    assert "measured average" in format_plan(p)


def test_plan_from_config_and_placeholders_for_unset_env(monkeypatch):
    for name in ("SPOGW_GENERATOR_MODEL", "SPOGW_EXECUTOR_URL", "SPOGW_EXECUTOR_MODEL"):
        monkeypatch.delenv(name, raising=False)
    cfg, notes = load_config_for_plan("paper", None)
    assert len(notes) == 3 and cfg.curation.m == 16
    p = plan_from_config(cfg)
    # d = 65: the whole train split of HumanEval (164 problems -> train 65, validation 16, test 83)
    assert (p.d, p.groups_per_query, p.rows_per_query, p.training_rows) == (65, 120, 960, 65 * 960)
    ci, notes = load_config_for_plan("ci", None)
    assert notes == [] and plan_from_config(ci).training_rows == 2 * 1 * 2  # d = 2, one group of 2t = 2 rows


def test_measure_assets_averages_stored_tables(tmp_path):
    assert measure_assets(tmp_path) is None
    (tmp_path / "execution_scores").mkdir()
    (tmp_path / "sampled_workflows").mkdir()
    pl.DataFrame({"llm_calls": [0, 2, 4], "prompt_tokens": [0, 100, 200], "completion_tokens": [0, 30, 60]}) \
        .write_parquet(tmp_path / "execution_scores" / "0000.parquet")
    pl.DataFrame({"llm_calls": [3], "prompt_tokens": [0], "completion_tokens": [0]}) \
        .write_parquet(tmp_path / "execution_scores" / "0001.parquet")
    # an anchor row (generator.anchors) was not sampled: it does not count
    pl.DataFrame({"n_tokens": [10, 20, 30, 99], "finish_reason": ["stop", "length", None, "anchor"]}) \
        .write_parquet(tmp_path / "sampled_workflows" / "0000.parquet")
    m = measure_assets(tmp_path)
    assert m.workflows == 4 and m.calls_per_workflow == pytest.approx(9 / 4)
    assert m.prompt_tokens_per_call == pytest.approx(300 / 9) and m.completion_tokens_per_call == pytest.approx(10)
    assert m.tokens_per_sample == pytest.approx(20) and m.samples == 3


def test_spogw_plan_command(capsys, monkeypatch, tmp_path):
    from spogw_dagster.cli import main

    monkeypatch.delenv("SPOGW_GENERATOR_MODEL", raising=False)
    rc = main(["plan", "--profile", "paper", "--assets-dir", str(tmp_path)])
    out = capsys.readouterr()
    assert rc in (0, None)
    assert "960 rows per query" in out.out and "62,400 rows" in out.out and "1,040 rows" in out.out  # 65 x 960, 65 x 16
    assert "upper bound" in out.out and "SPOGW_GENERATOR_MODEL" in out.err


def test_speeds_are_measured_per_target_or_unknown(monkeypatch):
    from spogw_dagster.pipeline.runs.plan import CPU_EXECUTOR_TPS, CPU_GENERATOR_TPS, speeds_for_config
    from spogw_dagster.pipeline.settings import load_config

    sp = speeds_for_config(load_config("answers"), gpu=False)  # Qwen on both sides, embedded executor
    assert (sp.generator_tps, sp.executor_tps) == (CPU_GENERATOR_TPS["qwen2.5-coder-0.5b"][0],
                                                   CPU_EXECUTOR_TPS["qwen2.5-coder-0.5b"][0])
    assert sp.unknown == () and "answers run" in sp.source
    # a GPU, an endpoint, a folder: no speed, each with its reason, and no total time in the plan
    gpu = load_config("ci", overrides={"generator": {"backend": "vllm"},
                                       "executor": {"url": "http://127.0.0.1:9/v1", "model": "m"}})
    sp = speeds_for_config(gpu)
    assert (sp.generator_tps, sp.executor_tps, sp.train_tps) == (None, None, None)
    assert [k for k, _ in sp.unknown] == ["generator_tps", "train_tps", "executor_tps"]  # each None with its reason
    p = plan_from_config(gpu, speeds=sp)
    assert p.generator_s is None and p.report_s is None
    text = format_plan(p)
    assert "no total" in text and "sampling not estimated" in text and "on a GPU: not measured here" in text
    assert "total ≈" not in text


def test_plan_of_the_paper_profile_guesses_no_time(capsys, monkeypatch, tmp_path):
    from spogw_dagster.cli import main

    for name in ("SPOGW_GENERATOR_MODEL", "SPOGW_EXECUTOR_URL", "SPOGW_EXECUTOR_MODEL"):
        monkeypatch.delenv(name, raising=False)
    assert main(["plan", "--profile", "paper", "--assets-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "no total: a speed is unknown" in out and "generator.model is unset" in out
    assert main(["plan", "--profile", "paper", "--assets-dir", str(tmp_path), "--generator-tps", "2000",
                 "--train-tps", "1000", "--executor-tps", "5000"]) == 0
    out = capsys.readouterr().out
    assert "total ≈" in out and "given: --generator-tps 2000" in out and "unknown" not in out


def test_plan_names_the_training_processes():
    from spogw_dagster.pipeline.settings import load_config

    one = plan_from_config(load_config("ci"))
    two = plan_from_config(load_config("ci", None, {"training": {"processes": 2}}))
    assert (one.processes, two.processes) == (1, 2)
    assert (one.steps, one.training_rows) == (two.steps, two.training_rows)  # the same global batch, split
    assert "on 2 processes" in format_plan(two) and "processes" not in format_plan(one)


def test_report_runs_multiply_only_the_reports_executor_calls():
    from spogw_dagster.pipeline.runs.plan import plan_from_config
    from spogw_dagster.pipeline.settings import load_config

    one = plan_from_config(load_config("answers"))
    three = plan_from_config(load_config("answers", overrides={"report": {"runs": 3}}))
    # answers: 40 held-out queries, greedy only, k > 0: 40 workflows x 8 calls (the cap) x R
    assert (one.report_workflows, one.report_executor_calls) == (40, 40 * 8)
    assert three.report_executor_calls == 3 * 40 * 8 and three.executor_calls == one.executor_calls


def test_w4s_turns_cost_by_hand():
    from spogw_dagster.pipeline.runs.plan import Speeds, w4s_plan

    # 2 queries x 3 turns x 5 candidates = 30 samples; each run on its query and 4 feedback queries: 150 runs,
    # 2 calls each = 300 calls; 30 x 10 tokens at 10 tok/s = 30 s, 300 x 5 tokens at 50 tok/s = 30 s
    w = w4s_plan("x", d=2, turns=3, m=5, feedback_queries=4, repairs=3, runs=1, tokens_per_sample=10.0,
                 calls_per_workflow=2.0, tokens_per_call=5.0,
                 speeds=Speeds(generator_tps=10.0, executor_tps=50.0, train_tps=1.0))
    assert (w.samples, w.repair_samples_max, w.workflow_runs, w.executor_calls, w.seconds) == (30, 90, 150, 300.0,
                                                                                              60.0)


def test_spogw_plan_states_what_w4s_at_its_papers_turns_costs(capsys, tmp_path):
    from spogw_dagster.cli import main

    cfg = tmp_path / "c.yaml"
    cfg.write_text("profile: tiny\ncomparison: {methods: [spogw, w4s]}\n")
    assert main(["plan", "--config", str(cfg), "--assets-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    # tiny: d = 16, W4S's 10 turns x 5 candidates, 33 feedback queries: 800 samples, 800 x 34 = 27,200 runs
    assert "the comparison's w4s: d = 16 queries x 10 turns x 5 candidates = 800 samples" in out
    assert "33 feedback queries: 27,200 workflow runs" in out
    assert "W4S turns" not in main_plan_text(tmp_path, capsys)


def main_plan_text(tmp_path, capsys) -> str:
    from spogw_dagster.cli import main

    assert main(["plan", "--profile", "tiny", "--assets-dir", str(tmp_path)]) == 0
    return capsys.readouterr().out


def test_anchors_add_executed_workflows_and_group_members_but_no_samples():
    from spogw_dagster.pipeline.settings import load_config

    off = plan_from_config(load_config("answers", overrides={"generator": {"anchors": False}}))
    on = plan_from_config(load_config("answers"))  # the profile anchors
    # answers: d = 16, m = 8, n = 4, g_max = 4; the anchored prompt shows 3 workflows
    assert (on.samples, on.workflows, on.anchors) == (128, 16 * 11, 3) and off.workflows == 128
    assert on.executor_calls == 16 * 11 * 8  # the cap, one run
    assert on.unique_per_query == 11 and off.unique_per_query == 8  # at most m + anchors distinct rows per query
    assert "+ 3 of the prompt's workflows per query" in format_plan(on) and "C(11, 4) = 330" in format_plan(on)
