"""Pure pipeline logic: the reward ladder, the asset tables, training examples and the report (no model)."""

from __future__ import annotations

import dataclasses

import polars as pl
import pytest

from spogw_dagster.evaluation import EvalResult
from spogw_dagster.pipeline.data import report_stats
from spogw_dagster.pipeline.data import tables
from spogw_dagster.pipeline.data import training_inputs
from spogw_dagster.core.rewards import Ladder, ladder_reward
from spogw_dagster.contracts import Status, Usage

VALID_BODY = 'solution = await self.code_generate(instruction="Write it.")\n        return solution\n'
NO_RETURN = 'solution = await self.code_generate(instruction="Write it.")\n'


def test_ladder_reward_by_hand():
    lad = Ladder(format=0.1, valid=0.2, executes=0.2, answer=0.5)
    assert ladder_reward(lad, "format_error", [], 0.0) == 0.0
    assert ladder_reward(lad, "invalid", [], 0.0) == pytest.approx(0.1)
    assert ladder_reward(lad, "ok", ["runtime_error"], 0.0) == pytest.approx(0.3)
    assert ladder_reward(lad, "ok", ["ok", "runtime_error"], 0.5) == pytest.approx(0.1 + 0.2 + 0.1 + 0.25)
    assert ladder_reward(lad, "ok", ["ok"], 1.0) == pytest.approx(1.0)
    assert ladder_reward(Ladder(), "ok", ["ok"], 0.75) == 0.75  # default: the plain benchmark score
    assert ladder_reward(Ladder(), "invalid", [], 0.0) == 0.0
    # a trivial workflow (no operator that writes a solution) forfeits the executes rung: format + valid only
    assert ladder_reward(lad, "ok", ["ok"], 0.0, trivial=True) == pytest.approx(0.3)
    assert ladder_reward(lad, "ok", ["ok"], 0.0, trivial=False) == pytest.approx(0.5)


def test_the_call_cost_charges_each_executor_call_of_one_run():
    lad = Ladder(format=0.05, valid=0.1, executes=0.1, answer=0.75, call_cost=0.02)
    # right with 4 calls: 1 - 4 x 0.02 = 0.92; IO right with 1 call: 0.98; three runs of 4 calls each (12 in all)
    # are charged per run: 0.92 again
    assert ladder_reward(lad, "ok", ["ok"], 1.0, llm_calls=4) == pytest.approx(0.92)
    assert ladder_reward(lad, "ok", ["ok"], 1.0, llm_calls=1) == pytest.approx(0.98)
    assert ladder_reward(lad, "ok", ["ok"] * 3, 1.0, llm_calls=12) == pytest.approx(0.92)
    # ran but wrong with 8 calls: 0.25 - 0.16 = 0.09; a parse failure that spent nothing keeps its format credit;
    # the floor is 0 (format 0.05 - 8 x 0.02 < 0)
    assert ladder_reward(lad, "ok", ["ok"], 0.0, llm_calls=8) == pytest.approx(0.09)
    assert ladder_reward(lad, "invalid", [], 0.0) == pytest.approx(0.05)
    assert ladder_reward(lad, "invalid", ["runtime_error"], 0.0, llm_calls=8) == 0.0
    assert ladder_reward(Ladder(), "ok", ["ok"], 1.0, llm_calls=8) == 1.0  # λ 0: calls are free, as before
    with pytest.raises(ValueError, match="call_cost"):
        Ladder(call_cost=-0.1)


def test_execution_row_marks_trivial_workflows_and_withholds_their_executes_credit():
    lad = Ladder(format=0.1, valid=0.2, executes=0.2, answer=0.5)
    trivial = "class Workflow:\n    async def run(self):\n        return await self.test(solution=False)\n"
    real = "class Workflow:\n    async def run(self):\n        return await self.code_generate(instruction='x')\n"
    res = _result("Q/0", Status.OK, 0.0, ["ok"], 1)
    t = tables.execution_row(0, "Q/0", 0, "ok", res, lad, workflow=trivial)
    r = tables.execution_row(0, "Q/0", 1, "ok", res, lad, workflow=real)
    assert (t["trivial"], t["score"]) == (True, pytest.approx(0.3))
    assert (r["trivial"], r["score"]) == (False, pytest.approx(0.5))
    with pytest.raises(ValueError):
        Ladder(format=0.6, answer=0.6)


def _sampled(n_q=2, m=3):
    samples, qids, prompts = [], [], []
    for q in range(n_q):
        qids.append(f"Q/{q}")
        prompts.append(f"prompt {q}")
        row = []
        for j in range(m):
            text = VALID_BODY if j == 0 else (NO_RETURN if j == 1 else "")
            row.append(tables.Sample(text, [10 + j, 11, 2], [-0.5, -0.25, -0.125], "stop"))
        samples.append(row)
    return tables.sampled_frame(3, qids, prompts, samples, "code", parent_iteration=2, parent_sha256="abc",
                                generator="smollm2")


def test_sampled_frame_parses_each_completion():
    df = _sampled()
    assert df.height == 6 and df["iteration"].unique().to_list() == [3]
    assert df.filter(pl.col("query_id") == "Q/0")["parse_status"].to_list() == ["ok", "invalid", "format_error"]
    ok = df.row(0, named=True)
    assert ok["workflow"].startswith("class Workflow:") and "return solution" in ok["workflow"]
    assert ok["sum_logprob"] == pytest.approx(-0.875) and ok["n_tokens"] == 3
    assert df["parent_iteration"].unique().to_list() == [2] and df["parent_adapter_sha256"].unique().to_list() == ["abc"]
    assert "return" in df.row(1, named=True)["parse_error"]
    empty = tables.sampled_frame(0, [], [], [], "code", parent_iteration=None, parent_sha256=None, generator="x")
    assert empty.height == 0 and empty.schema == pl.Schema(tables.SAMPLED_SCHEMA)
    with pytest.raises(ValueError):
        tables.sampled_frame(0, ["a"], [], [], "code", parent_iteration=None, parent_sha256=None, generator="x")


def _result(qid, status, score, runs=(), calls=0):
    u = Usage(llm_calls=calls, cached_calls=calls // 2, prompt_tokens=10 * calls, completion_tokens=5 * calls)
    return EvalResult("humaneval", qid, status, score, usage=u, run_statuses=list(runs),
                      run_scores=[score] * len(runs), error="" if status == Status.OK else "why")


def test_execution_rows_and_curation_input():
    lad = Ladder(format=0.1, valid=0.2, executes=0.2, answer=0.5)
    rows = [
        tables.execution_row(3, "Q/0", 0, "ok", _result("Q/0", Status.OK, 1.0, ["ok"], 2), lad),
        tables.execution_row(3, "Q/0", 1, "invalid", _result("Q/0", Status.INVALID, 0.0), lad),
        tables.execution_row(3, "Q/0", 2, "format_error", _result("Q/0", Status.FORMAT_ERROR, 0.0), lad),
    ]
    df = tables.execution_frame(rows)
    assert df["score"].to_list() == pytest.approx([1.0, 0.1, 0.0])
    assert df["answer_score"].to_list() == [1.0, 0.0, 0.0]
    assert df["llm_calls"].to_list() == [2, 0, 0] and df["runs"].to_list() == [1, 0, 0]
    sampled = _sampled(n_q=1)
    cin = tables.curation_input(sampled, df)
    assert cin.columns == ["iteration", "query_id", "sample_idx", "workflow", "prompt_group", "anchor", "score", "status"]
    assert cin["anchor"].to_list() == [False] * cin.height  # a frame without finish_reason has no anchors
    assert cin["prompt_group"].null_count() == cin.height  # one prompt per query: no prompt groups
    with pytest.raises(ValueError, match="no execution score"):
        tables.curation_input(sampled, df.head(2))


def test_screened_frame_keeps_reasons_and_kept_groups_round_trip():
    from spogw_dagster.core import curation as cur
    from spogw_dagster.core.hyperparams import CurationConfig

    samples = pl.DataFrame({
        "iteration": [0] * 6, "query_id": ["a"] * 3 + ["b"] * 3, "sample_idx": [0, 1, 2] * 2,
        "workflow": ["x = 1", "y = 2", "z = 3", "p = 1", "q = 2", "r = 3"],
        "score": [1.0, 0.0, 0.5, 0.0, 0.0, 0.0], "status": ["ok"] * 6,
    })
    cc = CurationConfig(m=3, n=2, t=1, g_max=1, tau_std=0.1)
    df = cur.validate_samples(samples)
    groups, few = cur.form_groups(df, cc.n, cc.g_max, cc.seed)
    kept, low = cur.screen_groups(groups, cc.tau_std)
    out = tables.screened_frame(kept, pl.concat([few, low]))
    assert out.height == 2
    assert out.filter(pl.col("kept"))["query_id"].to_list() == ["a"]
    assert out.filter(~pl.col("kept"))["reason"].to_list() == ["low_score_std"]
    back = tables.kept_groups(out)
    members, _ = cur.sharpen_groups(back, cc.t)
    assert members.height == 2 and sorted(members["role"].to_list()) == ["bottom", "top"]


def test_training_examples_join_sampled_tokens_in_group_order():
    sampled = _sampled(n_q=1)
    sharp = pl.DataFrame({
        "iteration": [3, 3, 3, 3], "query_id": ["Q/0"] * 4, "group_id": ["3:Q/0#1", "3:Q/0#1", "3:Q/0#0", "3:Q/0#0"],
        "sample_idx": [2, 0, 0, 1], "score": [0.0, 1.0, 1.0, 0.1], "role": ["bottom", "top", "top", "bottom"],
        "rank": [1, 0, 0, 1], "group_mean": [0.5] * 4, "group_std": [0.5] * 4, "advantage": [-1.0, 1.0, 1.0, -1.0],
    })
    ex = training_inputs.training_examples(sharp, sampled)
    assert [(e.group_id, e.advantage) for e in ex] == [("3:Q/0#0", 1.0), ("3:Q/0#0", -1.0), ("3:Q/0#1", 1.0),
                                                       ("3:Q/0#1", -1.0)]
    assert ex[0].completion_token_ids == [10, 11, 2] and ex[0].old_logprobs == [-0.5, -0.25, -0.125]
    assert ex[0].prompt == "prompt 0" and ex[0].completion == VALID_BODY
    assert training_inputs.training_examples(sharp.head(0), sampled) == []
    with pytest.raises(ValueError, match="no sampled workflow"):
        training_inputs.training_examples(sharp.with_columns(pl.lit(9).alias("sample_idx")), sampled)


LADDER = Ladder(format=0.1, valid=0.2, executes=0.2, answer=0.5)
WF = "class Workflow:\n    async def run(self):\n        return await self.code_generate(instruction='x')\n"
TRIVIAL = "class Workflow:\n    async def run(self):\n        return await self.test(solution=False)\n"


def _hrow(system, kind, mode, q, j, parse, status, score, runs, wf=WF, calls=0):
    hs = tables.HeldoutSample(system, kind, mode, q, j, 5, 100 + j, 0.5 if mode == "sampled" else 0.0, parse, wf,
                              "stop", 12, None, None)
    return tables.heldout_row(1, "test", hs, _result(q, status, score, runs, calls), LADDER)


def _heldout():
    ck, pv = ("spogw@0001", "checkpoint"), ("spogw@0000", "previous")
    return tables.heldout_frame([
        _hrow(*ck, "sampled", "a", 0, "ok", Status.OK, 1.0, ["ok"], calls=2),
        _hrow(*ck, "sampled", "a", 1, "invalid", Status.INVALID, 0.0, []),
        _hrow(*ck, "sampled", "b", 0, "ok", Status.RUNTIME_ERROR, 0.0, ["runtime_error"], calls=1),
        _hrow(*ck, "sampled", "b", 1, "ok", Status.OK, 0.0, ["ok"], wf=TRIVIAL, calls=1),
        _hrow(*pv, "sampled", "a", 0, "invalid", Status.INVALID, 0.0, []),
        _hrow(*pv, "sampled", "a", 1, "invalid", Status.INVALID, 0.0, []),
        _hrow(*pv, "sampled", "b", 0, "ok", Status.RUNTIME_ERROR, 0.0, ["runtime_error"]),
        _hrow(*pv, "sampled", "b", 1, "ok", Status.EXECUTOR_ERROR, 0.0, ["executor_error"]),
        _hrow("baseline:io", "baseline", "greedy", "a", 0, "ok", Status.OK, 1.0, ["ok"], calls=1),
        _hrow("baseline:io", "baseline", "greedy", "b", 0, "ok", Status.OK, 0.0, ["ok"], calls=1),
    ])


def test_heldout_rows_keep_what_each_workflow_answered():
    hs = tables.HeldoutSample("spogw@0001", "checkpoint", "greedy", "a", 0, 5, 100, 0.0, "ok", WF)
    res = _result("a", Status.OK, 1.0, ["ok"], 1)
    res.answer = "def f(x):\n    return x\n"
    assert tables.heldout_row(1, "test", hs, res, LADDER)["answer"] == "def f(x):\n    return x\n"
    res.answer = "x" * (tables.MAX_ANSWER_CHARS + 5)  # kept cut to the cap, as execution_scores keeps it
    assert tables.heldout_row(1, "test", hs, res, LADDER)["answer"] == "x" * tables.MAX_ANSWER_CHARS
    rejected = _result("a", Status.INVALID, 0.0)
    assert tables.heldout_row(1, "test", dataclasses.replace(hs, parse_status="invalid"), rejected,
                              LADDER)["answer"] == ""


def test_heldout_rows_valid_executes_reward_trivial():
    h = _heldout()
    assert h.schema == pl.Schema(tables.HELDOUT_SCHEMA)
    ck = h.filter(pl.col("system") == "spogw@0001")
    assert ck["valid"].to_list() == [True, False, True, True]
    # the trivial workflow ran to the end but earns no executes credit, here as in the reward
    assert ck["executes"].to_list() == [1.0, 0.0, 0.0, 0.0]
    # the ladder 0.1/0.2/0.2/0.5: all four; format only; format + valid; format + valid (trivial: it runs to
    # the end, but calls no operator that writes a solution, so no executes credit)
    assert ck["reward"].to_list() == pytest.approx([1.0, 0.1, 0.3, 0.3])
    assert ck["trivial"].to_list() == [False, False, False, True]
    assert ck["exec_seed"].to_list() == [100, 101, 100, 101] and ck["greedy"].to_list() == [False] * 4
    assert tables.is_trivial(TRIVIAL, True) and not tables.is_trivial(WF, True) and not tables.is_trivial(TRIVIAL, False)


def test_report_long_format_intervals_and_paired_difference():
    from spogw_dagster.core import stats

    rep = report_stats.summarize_heldout(_heldout(), iteration=1, config_hash="h", split_ids_sha256="ids", seed=0)
    assert rep.schema == pl.Schema(tables.REPORT_SCHEMA)

    def get(system, metric, mode="sampled"):
        return rep.filter((pl.col("system") == system) & (pl.col("metric") == metric)
                          & (pl.col("mode") == mode)).row(0, named=True)

    v = get("spogw@0001", "valid_rate")
    # 3/4 valid; queries a [1, 0] and b [1, 1]: design effect 0.0625 / 0.046875 = 4/3, effective n 3
    assert (v["value"], v["n"], v["n_queries"], v["ci_method"]) == (0.75, 4, 2, "wilson_deff")
    assert (v["ci_low"], v["ci_high"]) == pytest.approx(stats.wilson(2.25, 3))
    r = get("spogw@0001", "mean_reward")
    assert r["value"] == pytest.approx(0.425) and r["ci_method"] == "cluster_bootstrap"  # (1 + .1 + .3 + .3) / 4
    assert get("spogw@0001", "trivial_rate")["value"] == 0.25
    assert get("spogw@0001", "answer_score")["value"] == 0.25
    # the previous policy: its executor error is left out (3 scored samples) and counted
    assert get("spogw@0000", "valid_rate")["n"] == 3 and get("spogw@0000", "executor_errors")["value"] == 1.0
    assert get("spogw@0000", "mean_reward")["diff_vs_prev"] is None
    # paired on (query, sample) without the executor-error pair: reward diffs a [0.9, 0], b [0]: mean 0.3;
    # resampling 2 queries gives 0.45 (a, a), 0.3 or 0 (b, b), each end with probability 1/4: [0, 0.45]
    assert (r["diff_vs_prev"], r["diff_ci_low"], r["diff_ci_high"], r["n_pairs"]) == (
        pytest.approx(0.3), 0.0, pytest.approx(0.45), 3)
    assert get("spogw@0001", "valid_rate")["diff_vs_prev"] == pytest.approx(1 / 3)
    # greedy baseline: one sample per query gives plain Wilson; no greedy previous to pair with
    b = get("baseline:io", "valid_rate", "greedy")
    assert (b["value"], b["ci_method"], b["diff_vs_prev"]) == (1.0, "wilson", None)
    assert (b["ci_low"], b["ci_high"]) == pytest.approx(stats.wilson(2, 2))
    assert get("baseline:io", "executor_calls", "greedy")["value"] == 2.0
    assert rep["kind"].unique(maintain_order=True).to_list() == ["checkpoint", "previous", "baseline"]
    assert set(rep["config_hash"].to_list()) == {"h"} and set(rep["split_ids_sha256"].to_list()) == {"ids"}
    text = report_stats.report_table_text(rep)
    assert "0.750 [" in text and "+0.300 [+0.000, +0.450]" in text
    assert "Δ vs previous" in report_stats.curve_table_text(rep)
    assert report_stats.metric_row(rep, "checkpoint", "answer_score")["mode"] == "sampled"


def test_previous_rows_are_reused_only_for_the_same_adapter_config_and_size():
    held = _heldout()
    rep = report_stats.summarize_heldout(held, iteration=1, config_hash="h", split_ids_sha256="ids")
    rep = rep.with_columns(pl.when(pl.col("kind") == "checkpoint").then(pl.lit("sha1"))
                           .otherwise(pl.col("adapter_sha256")).alias("adapter_sha256"))
    again = report_stats.reusable_previous(rep, held, "spogw@0001", "sha1", "h", 2, 4)
    assert again is not None and again.height == 4
    assert again["iteration"].unique().to_list() == [2] and again["kind"].unique().to_list() == ["previous"]
    assert report_stats.reusable_previous(rep, held, "spogw@0001", "other", "h", 2, 4) is None
    assert report_stats.reusable_previous(rep, held, "spogw@0001", "sha1", "changed", 2, 4) is None
    assert report_stats.reusable_previous(rep, held, "spogw@0001", "sha1", "h", 2, 6) is None  # k changed
    assert report_stats.reusable_previous(None, held, "spogw@0001", "sha1", "h", 2, 4) is None


def test_learning_curve_puts_the_base_model_first():
    held = _heldout()
    r0 = report_stats.summarize_heldout(held.with_columns(
        pl.col("system").replace({"spogw@0001": "spogw@0000", "spogw@0000": "base"})),
        iteration=0, config_hash="h", split_ids_sha256="ids")
    r1 = report_stats.summarize_heldout(held, iteration=1, config_hash="h", split_ids_sha256="ids")
    curve = report_stats.learning_curve(pl.concat([r0, r1]))
    steps = curve.filter((pl.col("metric") == "valid_rate") & (pl.col("mode") == "sampled"))
    assert steps["step"].to_list() == [-1, 0, 1]
    assert steps["system"].to_list() == ["base", "spogw@0000", "spogw@0001"]
    from spogw_dagster.pipeline.defs.plots import learning_curve_plot

    assert learning_curve_plot(curve).startswith("![held-out metrics")


def test_score_distribution():
    d = report_stats.score_distribution([0.0, 0.1, 0.5, 0.99, 1.0, None])
    assert list(d.values()) == [2, 0, 1, 0, 2]
    assert list(d)[-1] == "[0.8,1.0]"


def test_catalog_learning_curve_view_and_run_table(tmp_path):
    from spogw_dagster.pipeline.data.catalog import query, refresh_catalog
    from spogw_dagster.pipeline.runs.loop import summary_table
    from spogw_dagster.pipeline.data.storage import AssetStore

    store = AssetStore(tmp_path)
    held = _heldout()
    h0 = held.with_columns(pl.col("system").replace({"spogw@0001": "spogw@0000", "spogw@0000": "base"}),
                           pl.lit(0).cast(pl.Int64).alias("iteration"))
    for key, it, h in (("0000", 0, h0), ("0001", 1, held)):
        store.write_parquet("heldout_results", key, h)
        store.write_parquet("benchmark_report", key,
                            report_stats.summarize_heldout(h, iteration=it, config_hash="c", split_ids_sha256="s"))
    refresh_catalog(store)
    curve = query(store, "select step, system, value, ci_low, ci_high, diff_vs_prev from learning_curve "
                         "where metric = 'mean_reward' and mode = 'sampled' order by step")
    assert [(r[0], r[1]) for r in curve] == [(-1, "base"), (0, "spogw@0000"), (1, "spogw@0001")]
    assert curve[2][2] == pytest.approx(0.425) and curve[2][5] == pytest.approx(0.3) and curve[0][5] is None
    assert query(store, "select count(*) from heldout_results where iteration = 1 and trivial") == [(1,)]
    text = summary_table(store, 2)
    assert text.startswith("held-out scores per iteration (test split")
    # resampling queries a (1.0, 0.1) and b (0.3, 0.3): means 0.3 (b, b), 0.425 (a, b), 0.55 (a, a)
    assert text.count("Δ vs previous") == 2 and "0.425 [0.300, 0.550]" in text
    assert "headline: held-out answer_score" in text and "spogw@0001 vs base" in text


def _paired_rows(system: str, valid: list[list[int]], reward: list[list[float]], seed_shift: int = 0) -> pl.DataFrame:
    rows = []
    for q, (vs, rs) in enumerate(zip(valid, reward)):
        for j, (v, r) in enumerate(zip(vs, rs)):
            rows.append({"system": system, "mode": "sampled", "query_id": f"q{q}", "sample_idx": j,
                         "seed": 100 * q + j + seed_shift, "exec_seed": j, "status": "ok" if v else "invalid",
                         "valid": bool(v), "executes": float(v), "trivial": False, "reward": r,
                         "answer_score": 0.0, "iteration": 0})
    return pl.DataFrame(rows)


def test_paired_comparison_by_hand():
    # q0: A valid on both samples, B on the second only -> diffs (1, 0); q1: A on the second only, B on none
    # -> diffs (0, 1). Every query's mean diff is 0.5, so every bootstrap resample gives 0.5: CI [0.5, 0.5].
    a = _paired_rows("A", [[1, 1], [0, 1]], [[0.5, 0.5], [0.1, 0.5]])
    b = _paired_rows("B", [[0, 1], [0, 0]], [[0.1, 0.5], [0.1, 0.1]])
    rows = {r["metric"]: r for r in report_stats.paired_comparison(a, b, resamples=200)}
    v = rows["valid_rate"]
    assert (v["a"], v["b"], v["diff"], v["diff_ci_low"], v["diff_ci_high"]) == (0.75, 0.25, 0.5, 0.5, 0.5)
    assert v["n_pairs"] == 4 and v["n_queries"] == 2
    # rewards: diffs (0.4, 0.0) and (0.0, 0.4): mean 0.2 in both queries
    r = rows["mean_reward"]
    assert r["diff"] == pytest.approx(0.2) and r["diff_ci_low"] == pytest.approx(0.2)
    assert r["a"] == pytest.approx(0.4) and r["b"] == pytest.approx(0.2)


def test_paired_comparison_refuses_unpaired_seeds_and_unknown_systems():
    a = _paired_rows("A", [[1]], [[0.5]])
    b = _paired_rows("B", [[0]], [[0.1]], seed_shift=7)
    with pytest.raises(ValueError, match="different seeds"):
        report_stats.paired_comparison(a, b)
    with pytest.raises(ValueError, match="no held-out results for system 'C'.*A, B"):
        report_stats.system_rows(pl.concat([a, b]), "C")


def test_anchor_rows_reach_their_own_group_and_train_as_off_policy_examples():
    """sampled_workflows -> curation_input -> screen/sharpen (anchor_groups contrast) -> training examples: the
    rows marked "anchor" form their query's anchor group, zero-sum, and are the off-policy examples."""
    from spogw_dagster.core import curation
    from spogw_dagster.core.hyperparams import CurationConfig

    lad = Ladder(format=0.1, valid=0.2, executes=0.2, answer=0.5)
    samples, fin = [], ["stop"] * 4 + ["anchor"] * 2
    samples.append([tables.Sample(VALID_BODY.replace("Write it.", f"Write it {j}."), [10 + j, 11, 2],
                                  [-0.5, -0.25, -0.125], f) for j, f in enumerate(fin)])
    sampled = tables.sampled_frame(0, ["Q/0"], ["prompt 0"], samples, "code", parent_iteration=None,
                                   parent_sha256=None, generator="smollm2")
    answers = [1.0, 0.0, 0.0, 1.0, 0.0, 1.0]  # samples 0-3, then anchors 4 (wrong) and 5 (right)
    scores = tables.execution_frame(tables.execution_row(0, "Q/0", j, "ok", _result("Q/0", Status.OK, a, ["ok"], 1),
                                                         lad, workflow=VALID_BODY) for j, a in enumerate(answers))
    cin = tables.curation_input(sampled, scores)
    assert cin["anchor"].to_list() == [False] * 4 + [True] * 2
    # tau_sim 1: the samples differ in one word and stay (identical code alone is a near-duplicate)
    cfg = CurationConfig(m=4, n=4, t=2, g_max=1, tau_sim=1.0, tau_std=0.01, anchor_groups="contrast")
    sc = curation.screen(cin, cfg)
    sh = curation.sharpen(sc.groups, cfg)
    anchors = sh.members.filter(pl.col("group_id") == "0:Q/0#anchors").sort("sample_idx")
    # 0.5 and 1.0 (ladder .5 + answer .5): mean .75, std .25 -> -1 and +1 (up to ε)
    assert anchors["advantage"].to_list() == pytest.approx([-1.0, 1.0], abs=1e-3)
    ex = training_inputs.training_examples(sh.members, sampled, mark_off_policy=True)
    by_group = {}
    for e in ex:
        by_group.setdefault(e.group_id, []).append(e.off_policy)
    assert by_group["0:Q/0#anchors"] == [True, True] and not any(by_group["0:Q/0#0"])
    assert sorted(round(e.advantage, 3) for e in ex if e.group_id == "0:Q/0#anchors") == [-1.0, 1.0]
