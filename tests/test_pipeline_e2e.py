"""End to end with the real bundled model (SmolLM2-135M as generator via transformers and as executor via
llama.cpp), on the `ci` profile: iterations 0 and 1 materialize through the Dagster job; the Parquet files
and DuckDB views hold the expected rows; iteration 1 names iteration 0's checkpoint; iteration 1 without
iteration 0's checkpoint fails fast and writes nothing; a rerun of iteration 1 makes zero new executor
calls and leaves the same row counts; `spogw run` then finds both iterations done and prints the table.

Timings per asset go to test-artifacts/pipeline_ci_timings.json.
"""

from __future__ import annotations

import io
import json
import shutil
import time
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from spogw_dagster.pipeline.data import report_stats
from spogw_dagster.pipeline.data import tables
from spogw_dagster.pipeline.data.catalog import query
from spogw_dagster.pipeline.settings import load_config
from spogw_dagster.pipeline.defs.wiring import build_definitions
from spogw_dagster.pipeline.defs.partitions import PARTITIONS_NAME
from spogw_dagster.pipeline.defs.sensors import JOB_NAME
from spogw_dagster.pipeline.data.storage import AssetStore
from spogw_dagster.pipeline.defs.assets import ASSET_NAMES

pytestmark = pytest.mark.model

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"


def _metadata(result) -> dict[str, dict]:
    out = {}
    for ev in result.get_asset_materialization_events():
        out[ev.asset_key.to_user_string()] = {k: v.value for k, v in ev.materialization.metadata.items()}
    return out


def _counts(store: AssetStore, key: str) -> dict[str, int]:
    return {t: store.read_parquet(t, key).height for t in ASSET_NAMES + ("heldout_results",)}


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    assets = tmp_path_factory.mktemp("assets")
    hidden = tmp_path_factory.mktemp("hidden") / "ckpt0"
    home = tmp_path_factory.mktemp("dagster_home")
    defs = build_definitions("ci", assets_dir=assets)
    job = defs.resolve_job_def(JOB_NAME)
    store = AssetStore(assets)
    st: dict = {"assets": assets, "store": store, "defs": defs}
    timings: dict = {}

    def run(key: str, label: str):
        t0 = time.monotonic()
        res = job.execute_in_process(partition_key=key, instance=inst, raise_on_error=False)
        md = _metadata(res)
        timings[label] = {"total_s": round(time.monotonic() - t0, 1),
                          **{a: m.get("wall_s") for a, m in md.items()}}
        return res, md

    with dg.instance_for_test(temp_dir=str(home)) as inst:
        inst.add_dynamic_partitions(PARTITIONS_NAME, ["0000", "0001"])
        st["r0"], st["md0"] = run("0000", "iteration 0")
        assert st["r0"].success, [e.message for e in st["r0"].all_events if e.is_failure]

        # iteration 1 without iteration 0's checkpoint
        shutil.move(str(store.adapter_dir("0000")), hidden)
        st["r1_missing"], _ = run("0001", "iteration 1 without checkpoint 0")
        # partition 0001's files start with its key (0001.parquet, .snapshots/.../0001-<hash>.parquet, an adapter
        # folder); a glob on "*0001*" also matched iteration 0's snapshot whose data hash held "0001"
        st["files_0001_after_missing"] = [str(p) for p in assets.rglob("0001*")]
        shutil.move(hidden, str(store.adapter_dir("0000")))

        st["r1"], st["md1"] = run("0001", "iteration 1")
        assert st["r1"].success, [e.message for e in st["r1"].all_events if e.is_failure]
        st["counts1"] = _counts(store, "0001")
        st["sampled1"] = store.read_parquet("sampled_workflows", "0001")
        st["views1"] = query(store, "select count(*) from execution_scores where iteration = 1")

        st["r1b"], st["md1b"] = run("0001", "iteration 1 rerun")
        st["counts1b"] = _counts(store, "0001")
        st["sampled1b"] = store.read_parquet("sampled_workflows", "0001")
        st["sensor"] = defs.resolve_sensor_def("next_iteration_sensor")(
            dg.build_sensor_context(instance=inst, definitions=defs))
        st["mats_1"] = inst.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey("sampled_workflows"), asset_partitions=["0001"]), limit=10)
        try:
            ARTIFACTS.mkdir(exist_ok=True)
            (ARTIFACTS / "pipeline_ci_timings.json").write_text(json.dumps(timings, indent=2))
        except OSError:
            pass
        yield st


def test_iterations_0_and_1_materialize_with_checks(loop):
    for r in (loop["r0"], loop["r1"], loop["r1b"]):
        assert r.success
        assert {e.asset_key.to_user_string() for e in r.get_asset_materialization_events()} == set(ASSET_NAMES)
        checks = {e.check_name: e.passed for e in r.get_asset_check_evaluations()}
        assert len(checks) == 7
        # the ERROR-severity checks must pass, and no run tripped a bug of ours; groups_kept /
        # compared_with_previous only warn
        for name in ("m_workflows_per_query", "scores_complete", "executor_error_rate", "no_internal_errors",
                     "loss_finite_and_adapter_reloads"):
            assert checks[name], name


def test_parquet_files_and_duckdb_views_hold_the_expected_rows(loop):
    cfg = load_config("ci")
    store: AssetStore = loop["store"]
    d, m, h = cfg.benchmark.train_queries, cfg.curation.m, cfg.benchmark.heldout_queries
    for key, it in (("0000", 0), ("0001", 1)):
        sampled = store.read_parquet("sampled_workflows", key)
        scores = store.read_parquet("execution_scores", key)
        assert sampled.height == d * m and scores.height == d * m
        assert sampled.group_by("query_id").len()["len"].to_list() == [m] * d
        report = store.read_parquet("benchmark_report", key)
        assert report.schema == pl.Schema(tables.REPORT_SCHEMA) and report.height == 6 * len(report_stats.METRICS)
        assert report["kind"].unique(maintain_order=True).to_list() == ["checkpoint", "previous", "baseline"]
        # policies greedy + k sampled, the io baseline greedy + baseline_samples; every metric for each
        rep = cfg.report
        systems = {(s, m) for s, m in report.select("system", "mode").iter_rows()}
        prev = "base" if it == 0 else "spogw@0000"
        assert systems == {(f"spogw@{key}", "greedy"), (f"spogw@{key}", "sampled"), (prev, "greedy"),
                           (prev, "sampled"), ("baseline:io", "greedy"), ("baseline:io", "sampled")}
        assert report.group_by("system", "mode").len()["len"].to_list() == [len(report_stats.METRICS)] * 6
        held = store.read_parquet("heldout_results", key)
        assert held.schema == pl.Schema(tables.HELDOUT_SCHEMA)
        assert held.height == 2 * h * (1 + rep.samples) + h * (1 + rep.baseline_samples)
        ck = report.filter((pl.col("kind") == "checkpoint") & (pl.col("metric") == "answer_score"))
        assert ck["n"].to_list() == [h, h * rep.samples]  # greedy, sampled
        assert ck["diff_vs_prev"].null_count() == 0 and (ck["diff_ci_low"] <= ck["diff_ci_high"]).all()
        for r in report.filter(pl.col("ci_method") != "none").iter_rows(named=True):
            assert 0.0 <= r["ci_low"] <= r["value"] <= r["ci_high"] <= 1.0, r
        # sample j of query q used the same sampler and executor seed under both policies (paired)
        seeds = held.filter(pl.col("kind") != "baseline").group_by("mode", "query_id", "sample_idx").agg(
            pl.col("seed").n_unique().alias("s"), pl.col("exec_seed").n_unique().alias("e"), pl.len())
        assert (seeds["s"] == 1).all() and (seeds["e"] == 1).all() and (seeds["len"] == 2).all()
        assert set(report["split"].to_list()) == {"test"}
        ck = store.read_parquet("lora_checkpoint", key)
        assert ck.height == 1 and Path(ck["adapter_path"][0]) == store.adapter_dir(key)
        assert (store.adapter_dir(key) / "adapter_model.safetensors").is_file()
        for t in ASSET_NAMES + ("heldout_results",):
            n_rows = store.read_parquet(t, key).height
            assert store.read_parquet(t, key)["iteration"].unique().to_list() == ([it] if n_rows else []), t
    # one view per table, every table with an iteration column, rows per iteration exactly as the ci profile
    # implies (sharpened_groups: 2t x kept groups, which may be 0 when no query formed a group)
    for t in ASSET_NAMES + ("heldout_results",):
        rows = dict(query(store, f"select iteration, count(*) from {t} group by 1"))
        expect = {it: _expected_rows(store, key)[t] for key, it in (("0000", 0), ("0001", 1))}
        assert rows == {k: v for k, v in expect.items() if v}, (t, rows, expect)
        assert all(v > 0 for k, v in expect.items()) or t == "sharpened_groups", (t, expect)
    assert query(store, "select count(*) from execution_scores where iteration = 1") == loop["views1"]
    stat = query(store, "select iteration, status, avg(score) from execution_scores group by all order by 1, 2")
    assert {r[0] for r in stat} == {0, 1}
    assert query(store, "select count(distinct iteration) from benchmark_report where kind = 'checkpoint'") == [(2,)]
    curve = query(store, "select step, system, value, ci_low, ci_high from learning_curve "
                         "where metric = 'answer_score' and mode = 'sampled' order by step")
    assert [(r[0], r[1]) for r in curve] == [(-1, "base"), (0, "spogw@0000"), (1, "spogw@0001")]



# Hand counts for the `ci` profile (pipeline/profiles.py): d = 2 training queries, m = n = 4, t = 1, g_max = 1
# (C(4, 4) = 1 group per query), tau_std = 0 (every formed group is kept: a std is >= 0), R = 1 run; h = 2
# held-out queries, report samples k = 2, baseline io with 1 sample; batch_size 4, 1 epoch.
CI = {"d": 2, "m": 4, "n": 4, "t": 1, "g_max": 1, "tau_std": 0.0, "runs": 1, "h": 2, "samples": 2,
      "baselines": ["io"], "baseline_samples": 1, "batch_size": 4, "grad_accum": 1, "epochs": 1}


def _ci_profile_is_what_the_hand_counts_assume() -> None:
    cfg = load_config("ci")
    got = {"d": cfg.benchmark.train_queries, "m": cfg.curation.m, "n": cfg.curation.n, "t": cfg.curation.t,
           "g_max": cfg.curation.g_max, "tau_std": cfg.curation.tau_std, "runs": cfg.execution.runs,
           "h": cfg.benchmark.heldout_queries, "samples": cfg.report.samples, "baselines": list(cfg.report.baselines),
           "baseline_samples": cfg.report.baseline_samples, "batch_size": cfg.training.batch_size,
           "grad_accum": cfg.training.grad_accum, "epochs": cfg.training.epochs}
    assert got == CI, "the ci profile changed: recompute the hand counts of this test"


def _expected_rows(store: AssetStore, key: str) -> dict[str, int]:
    """Rows each table of partition `key` must hold. Fixed by the profile except sharpened_groups, which is
    2t x (kept groups), and kept groups depend on the model's output (a query whose near-duplicate or
    executor-error rows leave fewer than n workflows forms no group)."""
    kept = store.read_parquet("screened_groups", key).filter(pl.col("kept")).height
    d, m, t, h = CI["d"], CI["m"], CI["t"], CI["h"]
    return {
        "sampled_workflows": d * m,  # 2 x 4 = 8
        "execution_scores": d * m,  # one row per sampled workflow (R runs are averaged into it): 8
        "screened_groups": d,  # per query exactly one row: its single group (kept) or a too_few_workflows row
        "sharpened_groups": 2 * t * kept,  # 2 members per kept group
        "lora_checkpoint": 1,
        # every (system, mode) of {checkpoint, previous, io} x {greedy, sampled}: 6 x len(METRICS)
        "benchmark_report": 6 * len(report_stats.METRICS),
        # policies: 2 x h x (1 greedy + k sampled) = 12; baseline io: h x (1 + 1) = 4
        "heldout_results": 2 * h * (1 + CI["samples"]) + h * (1 + CI["baseline_samples"]),
    }


def test_each_table_holds_exactly_the_rows_the_ci_profile_implies(loop):
    _ci_profile_is_what_the_hand_counts_assume()
    store: AssetStore = loop["store"]
    d, m, n, t = CI["d"], CI["m"], CI["n"], CI["t"]
    for key, it in (("0000", 0), ("0001", 1)):
        expect = _expected_rows(store, key)
        assert expect["sampled_workflows"] == 8 and expect["heldout_results"] == 16
        got = {tb: store.read_parquet(tb, key).height for tb in expect}
        assert got == expect, key
        sampled = store.read_parquet("sampled_workflows", key)
        scores = store.read_parquet("execution_scores", key)
        screened = store.read_parquet("screened_groups", key)
        sharp = store.read_parquet("sharpened_groups", key)
        ck = store.read_parquet("lora_checkpoint", key).row(0, named=True)
        # sample_idx 0..m-1 for each of the d queries, the same keys in sampled and scored rows
        keys = sorted(sampled.select("query_id", "sample_idx").iter_rows())
        queries = sorted({q for q, _ in keys})
        assert len(queries) == d and keys == [(q, j) for q in queries for j in range(m)]
        assert sorted(scores.select("query_id", "sample_idx").iter_rows()) == keys
        # R = 1 run for a workflow that parsed, none for a rejected one (it scores without running)
        runs = dict(zip(scores.select("query_id", "sample_idx").iter_rows(), scores["runs"].to_list()))
        for q, j, status in sampled.select("query_id", "sample_idx", "parse_status").iter_rows():
            assert runs[(q, j)] == (CI["runs"] if status == "ok" else 0), (q, j, status)
        # screened: one row per query; a kept row is a group of n members, a dropped row has fewer than n
        assert sorted(screened["query_id"].to_list()) == queries
        for r in screened.iter_rows(named=True):
            if r["kept"]:
                assert len(r["members"]) == n and r["reason"] is None and r["score_std"] >= 0.0
            else:
                assert r["reason"] == "too_few_workflows" and len(r["members"]) < n, r
        # sharpened: per kept group one top and one bottom member (ranks 0 and 1), scores as executed, and
        # Â = ±δ/(δ + ε) with δ = |s_top − s_bottom| / 2 (population std of two scores), ε = 1e-4; 0 when equal
        kept_ids = sorted(screened.filter(pl.col("kept"))["group_id"].to_list())
        assert sorted(set(sharp["group_id"].to_list())) == kept_ids
        score_of = dict(zip(scores.select("query_id", "sample_idx").iter_rows(), scores["score"].to_list()))
        for gid in kept_ids:
            g = sharp.filter(pl.col("group_id") == gid).sort("rank")
            assert g["rank"].to_list() == list(range(2 * t)) and g["role"].to_list() == ["top", "bottom"]
            (q_top, top, s_top, a_top), (q_bot, bot, s_bot, a_bot) = g.select(
                "query_id", "sample_idx", "score", "advantage").iter_rows()
            assert s_top == score_of[(q_top, top)] and s_bot == score_of[(q_bot, bot)] and s_top >= s_bot
            delta = (s_top - s_bot) / 2
            want = 0.0 if delta == 0 else delta / (delta + 1e-4)
            assert a_top == pytest.approx(want, abs=1e-9) and a_bot == pytest.approx(-want, abs=1e-9)
        # checkpoint: one example per sharpened member; ceil(examples / batch_size) steps per epoch
        assert ck["n_examples"] == sharp.height and ck["trained"] == (sharp.height > 0)
        steps = -(-sharp.height // (CI["batch_size"] * CI["grad_accum"])) * CI["epochs"]
        assert ck["optimizer_steps"] == steps and len(ck["loss_curve"]) == steps
        assert ck["iteration"] == it
    assert loop["counts1"] == _expected_rows(store, "0001")


def test_iteration_1_names_iteration_0s_checkpoint(loop):
    md0, md1 = loop["md0"], loop["md1"]
    assert md0["sampled_workflows"]["parent_partition"] == "base"
    parent = md1["sampled_workflows"]["parent_checkpoint"]
    assert parent["partition"] == "0000"
    assert parent["path"] == str(loop["store"].adapter_dir("0000"))
    assert parent["adapter_sha256"] == md0["lora_checkpoint"]["adapter_sha256"]
    assert md1["lora_checkpoint"]["parent_checkpoint"]["partition"] == "0000"
    s1 = loop["sampled1"]
    assert s1["parent_iteration"].unique().to_list() == [0]
    assert s1["parent_adapter_sha256"].unique().to_list() == [parent["adapter_sha256"]]
    rep1 = loop["store"].read_parquet("benchmark_report", "0001")
    assert rep1.filter(pl.col("kind") == "previous")["system"].unique().to_list() == ["spogw@0000"]
    # π_0's rows in report 1 are report 0's checkpoint rows (same adapter and config: reused, not regenerated)
    assert md1["benchmark_report"]["previous_reused_from_report"] is True
    assert md1["benchmark_report"]["split"]["split"] == "test"
    assert md1["benchmark_report"]["split_ids_sha256"] == md0["benchmark_report"]["split_ids_sha256"]
    assert md1["benchmark_report"]["iterations_in_curve"] == 2
    assert md1["benchmark_report"]["learning_curve"].startswith("![held-out metrics")
    for md in (md0, md1):  # config hash and code versions recorded everywhere
        for a in ASSET_NAMES:
            assert md[a]["config_hash"] == load_config("ci").hash


def test_iteration_1_without_checkpoint_0_fails_clearly_and_writes_nothing(loop):
    r = loop["r1_missing"]
    assert not r.success
    fail = next(e for e in r.all_events if e.is_step_failure)
    assert fail.step_key == "sampled_workflows"
    msg = fail.step_failure_data.user_failure_data.description
    assert "lora_checkpoint[0000] is missing" in msg and "Materialize iteration 0000 first" in msg
    assert r.get_asset_materialization_events() == []
    assert loop["files_0001_after_missing"] == []


def test_rerun_of_iteration_1_is_served_from_the_cache(loop):
    md1, md1b = loop["md1"], loop["md1b"]
    md0 = loop["md0"]
    assert md0["benchmark_report"]["executor_new_calls"] > 0  # the baselines at least call the executor
    assert md0["benchmark_report"]["baselines_from_cache"] == []
    # static baselines do not depend on the checkpoint: computed once, reused by later reports
    assert md1["benchmark_report"]["baselines_from_cache"] == ["io"]
    assert md1b["execution_scores"]["executor_new_calls"] == 0
    assert md1b["benchmark_report"]["executor_new_calls"] == 0
    assert md1b["benchmark_report"]["baselines_from_cache"] == ["io"]
    assert md1b["execution_scores"]["executor_cache_hits"] == md1b["execution_scores"]["executor_calls"]
    assert loop["counts1b"] == loop["counts1"]
    # the same workflows were sampled again (seeded), and the same training run was recognised
    assert loop["sampled1b"]["completion"].to_list() == loop["sampled1"]["completion"].to_list()
    assert md1b["lora_checkpoint"]["reused_identical_run"] is True or md1b["lora_checkpoint"]["trained"] is False
    assert md1b["lora_checkpoint"]["adapter_sha256"] == md1["lora_checkpoint"]["adapter_sha256"]
    assert len(loop["mats_1"].records) == 2  # both materializations of partition 0001 are in the instance


def test_sensor_stops_after_the_configured_iterations(loop):
    res = loop["sensor"]
    assert isinstance(res, dg.SkipReason) and "done: 2 iteration(s)" in res.skip_message


def test_spogw_run_skips_finished_iterations_and_prints_the_table(loop, tmp_path, monkeypatch):
    from spogw_dagster.pipeline.runs.loop import run_loop

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    buf = io.StringIO()
    outcomes = run_loop("ci", assets_dir=loop["assets"], out=buf)
    text = buf.getvalue()
    assert [o.status for o in outcomes] == ["skipped", "skipped"]
    assert "held-out scores per iteration" in text and "spogw@0001" in text and "baseline:io" in text
    assert "Δ vs previous" in text and "answer score" in text and "near copy" in text
    # the embedded default points to the run where answers can move, with its wall time
    assert "the headline run" in text and "spogw run --profile answers" in text and "min" in text
    assert (tmp_path / "home" / "dagster.yaml").is_file()


def test_spogw_compare_trains_methods_on_the_same_inputs(loop, tmp_path, monkeypatch, capsys):
    """`spogw compare --iteration 1`: spogw (the loop's own checkpoint 1, reused), grpo and rwr trained from
    checkpoint 0 on iteration 1's rows with one seed, scored on the report's queries and seeds."""
    from spogw_dagster.cli import main

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    store: AssetStore = loop["store"]
    # --split test: the report's split, so spogw's rows can be the report's (the default is validation)
    assert main(["compare", "--iteration", "1", "--profile", "ci", "--methods", "spogw,grpo,rwr,score_dpo",
                 "--split", "test", "--assets-dir", str(loop["assets"])]) == 0
    out = capsys.readouterr().out
    assert "paired difference to spogw" in out and "rwr" in out and "scored on test" in out and "Holm" in out
    t = store.read_parquet("objective_comparison", "0001")
    methods = t.filter(pl.col("kind") != "baseline")
    assert sorted(methods["method"].unique().to_list()) == ["grpo", "rwr", "score_dpo", "spogw"]
    # identical inputs: one candidate-rows hash, one seed, one parent adapter (checkpoint 0); ScoreFlow samples
    # and scores its own candidates (T 0.2; mean of 3 executor runs at T 0), from the same parent and seeds
    ckpt0 = store.read_parquet("lora_checkpoint", "0000").row(0, named=True)
    loop_data = methods.filter(pl.col("method") != "score_dpo")
    assert loop_data["rows_sha256"].n_unique() == 1 and methods["seed"].unique().to_list() == [0]
    assert methods.filter(pl.col("method") == "score_dpo")["rows_sha256"][0] != loop_data["rows_sha256"][0]
    own = store.read_parquet("comparison_candidates", "0001")
    assert set(own["method"].to_list()) == {"score_dpo"} and own.height == 8  # d x m
    assert set(own.filter(pl.col("runs") > 0)["runs"].to_list()) <= {3}
    assert methods["parent_adapter_sha256"].unique().to_list() == [ckpt0["adapter_sha256"]]
    ex = {r["method"]: r for r in methods.filter(pl.col("metric") == "valid_rate").iter_rows(named=True)}
    # spogw is the loop's own checkpoint 1 (same config and data); grpo trains on the same sharpened rows;
    # rwr on each candidate W4S keeps once: it ran (status ok, no sandbox violation, not trivial) and its answer
    # score is above 0.05
    assert ex["spogw"]["reused"] == "lora_checkpoint"
    assert ex["grpo"]["n_examples"] == ex["spogw"]["n_examples"] == store.read_parquet("sharpened_groups", "0001").height
    scores1 = store.read_parquet("execution_scores", "0001")
    ran = ((pl.col("status") == "ok") & ~pl.col("trivial")
           & ~pl.col("run_statuses").list.contains("sandbox_violation"))
    kept = scores1.filter(ran & (pl.col("answer_score") > 0.05)).height
    assert ex["rwr"]["n_examples"] == kept
    # the headline family: the answer score of the trained methods only, with B sized to it
    fam = methods.filter(pl.col("p_holm").is_not_null())
    assert set(fam["metric"].to_list()) <= {"answer_score"}
    assert all(2 / (r["p_resamples"] + 1) < 0.05 / r["family_size"] for r in fam.iter_rows(named=True))
    # spogw's held-out rows are the report's rows of spogw@0001, sample for sample
    side = store.read_parquet("comparison_heldout", "0001")
    mine = side.filter(pl.col("system") == "spogw").sort(["mode", "query_id", "sample_idx"])
    report = store.read_parquet("heldout_results", "0001").filter(pl.col("system") == "spogw@0001").sort(
        ["mode", "query_id", "sample_idx"])
    assert mine["reward"].to_list() == report["reward"].to_list() and mine.height == report.height
    # every method is scored on the same samples: same queries, sample indices and seeds
    keys = {m: side.filter(pl.col("system") == m).select("mode", "query_id", "sample_idx", "seed", "exec_seed")
            .sort(["mode", "query_id", "sample_idx"]).to_dicts() for m in ("spogw", "grpo", "rwr")}
    assert keys["spogw"] == keys["grpo"] == keys["rwr"]


def test_execution_and_report_metadata_name_the_executor_runtime_and_its_cpu_features(loop):
    """The embedded executor's build and the CPU features it uses travel with each materialization."""
    from spogw_dagster.executors.llama_runtime import build_tag

    for asset in ("execution_scores", "benchmark_report"):
        md = loop["md0"][asset]
        feats = md["executor_cpu_features"].split()
        assert "AVX2" in feats and not any(f.startswith("AMX") for f in feats), feats
        runtime = md["executor_runtime"]
        assert runtime and all(r["runtime"]["tag"] == build_tag() for r in runtime)
        assert all(r["threads"] == 1 and r["slots"] == 1 for r in runtime)
        assert all(r["runtime"]["variant"] == "portable" for r in runtime)  # reproducible: the portable build
    # where the time went (bench/loop_profile.py): the executor's own prefill/decode split of its new calls,
    # the sampler's prefill/decode seconds and the report's generation seconds
    split = loop["md0"]["execution_scores"]["executor_time"]
    assert split["calls"] == loop["md0"]["execution_scores"]["executor_new_calls"] > 0
    assert split["decode_tokens"] > 0 and split["decode_s"] > 0 and split["prefill_s"] > 0
    assert split["served_s"] >= split["decode_s"] + split["prefill_s"] - 0.5
    timing = loop["md0"]["sampled_workflows"]["sampling_time"]
    assert timing["decode_s"] > 0 and timing["load_s"] > 0 and "prefill_s" in timing
    assert loop["md0"]["benchmark_report"]["generation_s"] > 0
    # the cost axis: every system of the report with its calls per query, the frontier marked, and its plot
    pareto = loop["md0"]["benchmark_report"]["pareto"]
    assert all(f"| {s} |" in pareto for s in ("spogw@0000", "base", "baseline:io")), pareto
    assert "data:image/png;base64," in loop["md0"]["benchmark_report"]["pareto_plot"]


def test_sampled_metadata_and_report_measure_copies(loop):
    """The copy measures reach the UI: sampled_workflows' metadata and the report's rows."""
    from spogw_dagster.workflow.copies import copied_from

    md = loop["md1"]["sampled_workflows"]
    sampled = loop["sampled1"]
    valid = sampled.filter(pl.col("parse_status") == "ok")
    expected = (sum(copied_from(w, "code") is not None for w in valid["workflow"].to_list()) / valid.height
                if valid.height else 0.0)
    assert md["near_copy_rate"] == pytest.approx(expected, abs=1e-4)
    assert "distinct_per_query" in md
