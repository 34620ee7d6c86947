"""The comparison's table and statistics (`pipeline/domain/comparison_stats.py`): each method's values and paired
difference to the reference, and Holm's family-wise control over the headline family, computed by hand."""

from __future__ import annotations

import polars as pl
import pytest

from spogw_dagster.core.methods.catalog import METHODS
from spogw_dagster.pipeline.data import tables
from spogw_dagster.pipeline.domain.comparison_stats import MethodRun, comparison_frame
from spogw_dagster.pipeline.settings import load_config


def _rows(system: str, kind: str, valid: list[int], reward: list[float], answer: list[float] | None = None) -> list[dict]:
    answer = answer if answer is not None else [0.0] * len(valid)
    return [{"iteration": 1, "split": "test", "system": system, "kind": kind, "mode": "greedy", "greedy": True,
             "query_id": f"q{i}", "sample_idx": 0, "seed": 7, "exec_seed": 11, "status": "ok" if v else "invalid",
             "valid": bool(v), "executes": bool(v), "trivial": False, "near_copy": False, "workflow_answer": False,
             "reward": r, "answer_score": a,
             "llm_calls": 1, "cached_calls": 0, "prompt_tokens": 10, "completion_tokens": 5}
            for i, (v, r, a) in enumerate(zip(valid, reward, answer))]


def _run(method: str, n: int) -> MethodRun:
    return MethodRun(method=method, objective=method, adapter=None, adapter_sha256="x", n_examples=n,  # type: ignore[arg-type]
                     examples_sha256=f"e-{method}", seed=0, train_seconds=1.0, reused="", rows_sha256="R")


def test_table_values_and_paired_differences_to_the_reference():
    # spogw valid (1, 0, 0, 1) rewards (.5, .1, .1, .5); grpo valid (1, 1, 0, 1) rewards (.5, .5, .1, .5)
    heldout = tables.heldout_frame(_rows("spogw", "method", [1, 0, 0, 1], [.5, .1, .1, .5])
                                   + _rows("grpo", "method", [1, 1, 0, 1], [.5, .5, .1, .5]))
    t = comparison_frame(heldout, [_run("spogw", 4), _run("grpo", 6)], reference="spogw", iteration=1,
                         parent_sha256="P", config_hash="C", split_ids_sha256="S",
                         resamples=200, seed=0)

    def row(method, metric):
        return t.filter((pl.col("method") == method) & (pl.col("metric") == metric)).row(0, named=True)

    assert row("spogw", "valid_rate")["value"] == pytest.approx(0.5)
    assert row("grpo", "valid_rate")["value"] == pytest.approx(0.75)
    # per-query differences (0, 1, 0, 0): mean 0.25; the reference has no difference to itself
    assert row("grpo", "valid_rate")["diff_vs_reference"] == pytest.approx(0.25)
    assert row("grpo", "mean_reward")["diff_vs_reference"] == pytest.approx(0.4 / 4)
    assert row("spogw", "valid_rate")["diff_vs_reference"] is None
    assert set(t["reference"].to_list()) == {"spogw"}
    # what each trained on travels with it; the shared inputs are one value for every method
    assert row("grpo", "valid_rate")["n_examples"] == 6 and row("spogw", "valid_rate")["n_examples"] == 4
    assert set(t["rows_sha256"].to_list()) == {"R"} and set(t["parent_adapter_sha256"].to_list()) == {"P"}
    assert set(t["kind"].to_list()) == {"method"}


def test_holm_family_is_the_answer_score_of_the_trained_methods():
    # grpo answers all 8 queries, spogw 2 of them (a planted effect on the answer); grpo is also valid on 6 more
    # queries; rwr equals spogw everywhere (every paired difference 0: bootstrap p = 1)
    sp_v, sp_r, sp_a = [0, 0, 0, 0, 0, 0, 1, 1], [.1, .1, .1, .1, .1, .1, .5, .5], [0, 0, 0, 0, 0, 0, 1, 1]
    heldout = tables.heldout_frame(_rows("spogw", "method", sp_v, sp_r, sp_a)
                                   + _rows("grpo", "method", [1] * 8, [.5] * 8, [1.0] * 8)
                                   + _rows("rwr", "method", sp_v, sp_r, sp_a))
    t = comparison_frame(heldout, [_run("spogw", 4), _run("grpo", 6), _run("rwr", 4)], reference="spogw",
                         iteration=1, parent_sha256="P", config_hash="C", split_ids_sha256="S",
                         resamples=4000, seed=0)
    fam = t.filter(pl.col("p_holm").is_not_null())
    # the family: answer_score of grpo and rwr (one mode): m = 2, B = max(4000, 10 * 2 / 0.05 = 400)
    assert sorted(fam["method"].to_list()) == ["grpo", "rwr"] and set(fam["metric"].to_list()) == {"answer_score"}
    assert set(fam["family_size"].to_list()) == {2} and set(fam["p_resamples"].to_list()) == {4000}
    # diagnostics: an unadjusted p-value, no Holm columns
    diag = t.filter((pl.col("metric") == "valid_rate") & (pl.col("method") == "grpo")).row(0, named=True)
    assert diag["p_value"] == pytest.approx(2 / 4001) and diag["p_holm"] is None and diag["family_size"] is None
    assert t.filter(pl.col("method") == "spogw")["p_value"].null_count() == t.filter(pl.col("method") == "spogw").height
    rwr = fam.filter(pl.col("method") == "rwr").row(0, named=True)
    assert rwr["p_value"] == 1.0 and rwr["p_holm"] == 1.0
    g = fam.filter(pl.col("method") == "grpo").row(0, named=True)
    # differences (1,1,1,1,1,1,0,0): no resample of 8 queries has mean <= 0 unless it draws only the last two,
    # (2/8)^8 ~ 1.5e-5, so k = 0 of B = 4000 and p = 2 (1 + 0) / 4001, never 0; Holm multiplies the smallest
    # by the family size 2
    assert g["p_value"] == pytest.approx(2 / 4001)
    assert g["p_holm"] == pytest.approx(2 * 2 / 4001) and g["p_holm"] < 0.05
    assert g["holm_ci_low"] > 0 and g["holm_level"] == pytest.approx(1 - 0.05 / 2)
    # the Holm interval is never narrower than the 95% one
    assert all(r["holm_ci_low"] <= r["diff_ci_low"] + 1e-12 and r["holm_ci_high"] >= r["diff_ci_high"] - 1e-12
               for r in fam.iter_rows(named=True))


def test_a_planted_effect_is_rejected_even_when_the_configured_resamples_could_not():
    # six trained methods beside spogw on 30 queries; "planted" answers 20 queries spogw misses, the other five
    # answer exactly what spogw does. With the configured B = 200 the smallest p is 2/201 ~ 0.00995, above
    # Holm's first threshold 0.05/6 ~ 0.0083: nothing could be rejected. The family's B is
    # max(200, 10 * 6 / 0.05 = 1200), p = 2/1201 and p_holm = 6 * 2/1201 ~ 0.010 < 0.05.
    ref_a = [1.0] * 5 + [0.0] * 25
    planted = [1.0] * 25 + [0.0] * 5
    rows = _rows("spogw", "method", [1] * 30, [.5] * 30, ref_a) + _rows("planted", "method", [1] * 30, [.5] * 30, planted)
    names = ["planted"] + [f"null{i}" for i in range(5)]
    for n in names[1:]:
        rows += _rows(n, "method", [1] * 30, [.5] * 30, ref_a)
    t = comparison_frame(tables.heldout_frame(rows), [_run("spogw", 4)] + [_run(n, 4) for n in names],
                         reference="spogw", iteration=1, parent_sha256="P", config_hash="C", split_ids_sha256="S",
                         resamples=200, seed=0)
    fam = t.filter(pl.col("p_holm").is_not_null())
    assert fam.height == 6 and set(fam["p_resamples"].to_list()) == {1200}
    p = fam.filter(pl.col("method") == "planted").row(0, named=True)
    assert p["p_value"] == pytest.approx(2 / 1201) and p["p_holm"] == pytest.approx(6 * 2 / 1201)
    assert p["p_holm"] < 0.05 and p["holm_ci_low"] > 0
    assert all(r["p_holm"] == 1.0 for r in fam.filter(pl.col("method") != "planted").iter_rows(named=True))


def test_a_planted_effect_on_40_queries_is_rejected_in_the_default_family_with_the_default_resamples():
    # the default methods (spogw, grpo, score_dpo, rwr) in the report's two modes: the headline family is the
    # answer score of the 3 trained methods besides spogw in each mode, m = 3 x 2 = 6. On 40 paired queries
    # grpo is right on 30 (q0-q29), spogw on 10 of them (q0-q9): paired differences twenty 1s and twenty 0s. A
    # resample has mean <= 0 only if it draws none of the twenty 1s, (1/2)^40 ~ 1e-12 each, so k = 0 and
    # p = 2 (1 + 0) / (B + 1) with B = max(2000, 10 x 6 / 0.05 = 1200) = 2000: p = 2/2001 ~ 0.0010 < 0.05/6
    # ~ 0.0083, Holm's first step; p_holm = 6 x 2/2001 ~ 0.0060 < 0.05: rejected. score_dpo and rwr answer as
    # spogw does (every difference 0, p = 1, p_holm = 1): not rejected.
    ref_a = [1.0] * 10 + [0.0] * 30
    planted = [1.0] * 30 + [0.0] * 10
    rows = []
    for mode in ("greedy", "sampled"):
        for name, ans in (("spogw", ref_a), ("grpo", planted), ("score_dpo", ref_a), ("rwr", ref_a)):
            rows += [{**r, "mode": mode, "greedy": mode == "greedy"}
                     for r in _rows(name, "method", [1] * 40, [.5] * 40, ans)]
    runs = [_run(n, 4) for n in ("spogw", "grpo", "score_dpo", "rwr")]
    t = comparison_frame(tables.heldout_frame(rows), runs, reference="spogw", iteration=1, parent_sha256="P",
                         config_hash="C", split_ids_sha256="S", resamples=2000, seed=0)
    fam = t.filter(pl.col("test_role") == "headline")
    assert fam.height == 6 and set(fam["metric"].to_list()) == {"answer_score"}
    assert set(fam["family_size"].to_list()) == {6} and set(fam["p_resamples"].to_list()) == {2000}
    for g in fam.filter(pl.col("method") == "grpo").iter_rows(named=True):
        assert g["diff_vs_reference"] == pytest.approx(0.5)
        assert g["p_value"] == pytest.approx(2 / 2001) and g["p_holm"] == pytest.approx(6 * 2 / 2001)
        assert g["p_holm"] < 0.05 and g["holm_ci_low"] > 0
    assert all(r["p_holm"] == 1.0 for r in fam.filter(pl.col("method") != "grpo").iter_rows(named=True))
    # every other tested metric is a diagnostic: unadjusted, labelled, no Holm columns
    diag = t.filter(pl.col("test_role") == "diagnostic")
    assert diag.height > 0 and "answer_score" not in diag["metric"].to_list()
    assert diag["p_holm"].null_count() == diag.height and diag["family_size"].null_count() == diag.height
    assert set(diag["p_resamples"].to_list()) == {2000}
    # untested rows (the reference, the metrics without a paired difference) have no role
    ref = t.filter(pl.col("method") == "spogw")
    assert ref["test_role"].null_count() == ref.height
    from spogw_dagster.pipeline.data.report_stats import p_label

    assert p_label(fam.filter(pl.col("method") == "grpo").row(0, named=True)) == "0.006 (Holm)"
    assert p_label(diag.row(0, named=True)).endswith("(diagnostic, unadjusted)")
    # the printed table (asset Markdown and `spogw compare` share these cells): grpo's greedy answer row by hand
    from spogw_dagster.pipeline.data.report_stats import comparison_cells

    note, cells = comparison_cells(t, ["answer_score"])
    assert "over the 6 answer-score differences of the trained methods to spogw (2000 bootstrap resamples)" in note
    assert [(c["method"], c["mode"]) for c in cells] == [(m, mode) for mode in ("greedy", "sampled")
                                                          for m in ("grpo", "rwr", "score_dpo", "spogw")]
    g = cells[0]
    assert g["value"].startswith("0.750 [") and g["diff"].startswith("+0.500 [") and g["p"] == "0.006 (Holm)"
    assert g["holm"].startswith("[+") and cells[3]["diff"] == cells[3]["holm"] == cells[3]["p"] == ""  # spogw


@pytest.mark.parametrize("profile", ["tiny", "answers", "ci"])
def test_the_smallest_attainable_p_is_below_holms_first_threshold_for_the_configured_family(profile):
    # the family a comparison of the configured methods tests: every method but the reference, in each of the
    # report's modes; and the largest one, every method of the catalog. Its B: stats.resamples_for_family of the
    # configured report.bootstrap_resamples. A bootstrap p is at least 2/(B + 1); Holm's first step needs < α/m.
    from spogw_dagster.core import stats

    cfg = load_config(profile)
    modes = int(cfg.report.greedy) + int(cfg.report.samples > 0)
    for methods in (cfg.comparison.methods, tuple(METHODS)):
        m = (len(methods) - 1) * modes
        b = stats.resamples_for_family(m, cfg.report.bootstrap_resamples)
        assert b >= cfg.report.bootstrap_resamples
        assert 2 / (b + 1) < 0.05 / m, (profile, m, b)
    # by hand for tiny's defaults: 4 methods, greedy and 4 samples -> m = 6, B = 2000, 2/2001 < 0.05/6
    if profile == "tiny":
        assert (len(cfg.comparison.methods), modes, cfg.report.bootstrap_resamples) == (4, 2, 2000)
        assert stats.resamples_for_family(6, 2000) == 2000 and 2 / 2001 < 0.05 / 6
        # the old family of every method x mode x metric, 6 x 2 x 6 = 72 at B = 2000, could reject nothing
        assert 2 / 2001 > 0.05 / 72


def test_resamples_for_family_by_hand():
    from spogw_dagster.core import stats

    assert stats.resamples_for_family(6, 2000) == 2000  # 10 * 6 / 0.05 = 1200 < 2000
    assert stats.resamples_for_family(72, 2000) == 14400  # the old family of 72: 10 * 72 / 0.05
    assert stats.resamples_for_family(0, 300) == 300
    for m in (1, 6, 72):  # the smallest attainable p is below Holm's first threshold
        assert 2 / (stats.resamples_for_family(m, 100) + 1) < 0.05 / m
    with pytest.raises(ValueError, match="margin"):
        stats.resamples_for_family(3, 100, margin=2)


def test_holm_by_hand():
    from spogw_dagster.core import stats

    # sorted 0.01, 0.03, 0.04 (m = 3): 3 * 0.01 = 0.03; max(0.03, 2 * 0.03) = 0.06; max(0.06, 1 * 0.04) = 0.06
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert stats.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1 (2 * 0.5), monotone
    # levels 1 - 0.05/3, 1 - 0.05/1, 1 - 0.05/2 by rank of p
    assert stats.holm_levels([0.01, 0.04, 0.03]) == pytest.approx([1 - 0.05 / 3, 0.95, 1 - 0.05 / 2])
    # bootstrap p: all differences 0 -> 1; all positive -> the floor 2 / (B + 1), never 0
    assert stats.paired_bootstrap_p([[1.0], [1.0]], [[1.0], [1.0]]) == 1.0
    assert stats.paired_bootstrap_p([[1.0], [1.0], [1.0]], [[0.0], [0.0], [0.0]], resamples=999) == 2 / 1000
