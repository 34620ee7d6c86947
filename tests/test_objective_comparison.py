"""objective_comparison's pure parts: each method's config, its examples from the same data, and the table of
values with paired differences to the reference method (expected values by hand)."""

from __future__ import annotations

import polars as pl
import pytest

from spogw_dagster.core.methods.catalog import METHODS, method_overrides, own_data
from spogw_dagster.pipeline.data import tables
from spogw_dagster.pipeline.defs.assets.objective_comparison import MethodRun, comparison_frame, method_config
from spogw_dagster.pipeline.defs.versions import section_hash
from spogw_dagster.pipeline.settings import ConfigValidationError, load_config


def test_each_method_changes_only_its_fields():
    cfg = load_config("tiny")  # n = 5, t = 2, beta = 0.1, tau_std = 0.01, lr 5e-4
    spogw = method_config(cfg, "spogw")
    assert spogw == cfg
    for name, field, want in [("grpo", "objective", "grpo"), ("rwr_ours", "objective", "rwr"),
                              ("score_dpo_ours", "objective", "score_dpo"),
                              ("spogw_beta0.05", "beta", 0.05), ("spogw_beta0", "beta", 0.0),
                              ("spogw_ref_previous", "ref_mode", "previous")]:
        m = method_config(cfg, name)
        assert getattr(m.training, field) == want, name
        # everything else as the loop: same seed, learning rate, epochs, curation
        assert (m.training.seed, m.training.learning_rate, m.training.epochs) == (0, 5e-4, 2)
        assert m.curation == cfg.curation and m.generator == cfg.generator
    # the baselines at their papers' settings: ScoreFlow lr 1e-6, 1 epoch, one pair (2 rows) per step;
    # W4S lr 2e-5, 3 epochs, batch 8; all else (seed, curation, generator) is the loop's
    sf, w4s = method_config(cfg, "score_dpo"), method_config(cfg, "rwr")
    assert (sf.training.objective, sf.training.learning_rate, sf.training.epochs, sf.training.batch_size) == \
        ("score_dpo", 1e-6, 1, 2)
    assert (w4s.training.objective, w4s.training.learning_rate, w4s.training.epochs, w4s.training.batch_size) == \
        ("rwr", 2e-5, 3, 8)
    assert sf.training.seed == w4s.training.seed == 0 and sf.curation == w4s.curation == cfg.curation
    # both papers' trainers keep Hugging Face's linear decay; the loop's own methods keep their constant rate
    assert sf.training.lr_scheduler == w4s.training.lr_scheduler == "linear" and spogw.training.lr_scheduler == "constant"
    assert method_config(cfg, "score_dpo_ours").training.lr_scheduler == "constant"
    # ScoreFlow samples and scores its own data: generator T 0.2, top-p 0.95; mean of 3 executor runs at T 0
    assert (sf.generator.temperature, sf.generator.top_p, sf.executor.temperature, sf.execution.runs) == \
        (0.2, 0.95, 0.0, 3)
    assert own_data("score_dpo") and not own_data("rwr") and not own_data("score_dpo_ours")
    assert w4s.generator == cfg.generator and w4s.execution == cfg.execution
    # W4S as a whole: its paper's 10 turns of 5 candidates at T = 0.5 with up to 3 repairs, each run on 33
    # feedback queries (comparison.w4s_turns / w4s_feedback_queries), then rwr at W4S's settings
    whole = method_config(cfg, "w4s")
    assert (whole.refinement.turns, whole.refinement.feedback_queries, whole.refinement.repairs, whole.curation.m,
            whole.generator.temperature) == (10, 33, 3, 5, 0.5)
    assert (whole.training.objective, whole.training.learning_rate, whole.training.epochs) == ("rwr", 2e-5, 3)
    assert own_data("w4s") and whole.training.rwr_reward == "w4s"
    assert method_config(cfg, "spogw_no_screening").curation.tau_std == 0.0
    # sharpening off: t = n // 2 = 2 for n = 5 (tiny already has t = 2; with n = 14 it is 7)
    assert method_config(cfg, "spogw_no_sharpening").curation.t == 5 // 2
    assert method_overrides("spogw_no_sharpening", 14)["curation"]["t"] == 7
    assert METHODS["spogw_no_sharpening"]["curation"]["t"] is None  # the registry itself is not mutated
    # the paper's n = 14, t = 4 with w4s's 5 candidates: groups of all 5, t = min(4, 5 // 2) = 2
    assert method_overrides("w4s", 14, 4)["curation"] == {"m": 5, "n": 5, "t": 2}
    assert method_overrides("w4s", 4, 1)["curation"] == {"m": 5}  # n <= m already: untouched


def test_unknown_method_is_refused_with_the_choices():
    with pytest.raises(ConfigValidationError, match=r"unknown method\(s\) \['ppo'\]; choose from spogw, grpo"):
        load_config("ci", overrides={"comparison": {"methods": ["spogw", "ppo"]}})
    with pytest.raises(ValueError, match="unknown method 'ppo'"):
        method_overrides("ppo", 4)


def test_comparison_settings_do_not_change_the_loops_config_hash():
    a = load_config("ci")
    b = load_config("ci", overrides={"comparison": {"methods": ["spogw", "rwr"]}})
    assert a.hash == b.hash  # `spogw run` must not rerun its iterations because the comparison changed


def test_the_old_name_objectives_still_reads_as_methods(tmp_path):
    # comparison.methods was comparison.objectives until 2026-12-05: an old YAML loads to the same methods and
    # the same objective_comparison section hash as the new spelling
    old = tmp_path / "old.yaml"
    old.write_text("profile: ci\ncomparison: {objectives: [spogw, rwr]}\n")
    cfg = load_config(config_file=old)
    assert cfg.comparison.methods == ("spogw", "rwr")
    new = load_config("ci", overrides={"comparison": {"methods": ["spogw", "rwr"]}})
    assert section_hash(cfg, "objective_comparison") == section_hash(new, "objective_comparison")
    assert section_hash(new, "objective_comparison") != section_hash(load_config("ci"), "objective_comparison")
    # an override in the new name replaces the file's old one (one key once both are read)
    assert load_config(config_file=old, overrides={"comparison": {"methods": ["grpo"]}}).comparison.methods == ("grpo",)
    both = tmp_path / "both.yaml"
    both.write_text("profile: ci\ncomparison: {objectives: [spogw], methods: [rwr]}\n")
    with pytest.raises(ConfigValidationError, match="both `methods` and `objectives`"):
        load_config(config_file=both)


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


def test_methods_are_scored_on_validation_unless_told():
    from spogw_dagster.pipeline.defs.assets.objective_comparison import scoring_config

    cfg = load_config("ci")
    assert cfg.comparison.split == "validation" and cfg.report.split == "test"
    assert scoring_config(cfg).report.split == "validation" and scoring_config(cfg).hash != cfg.hash
    same = load_config("ci", overrides={"comparison": {"split": "test"}})
    assert scoring_config(same) is same  # the report's own split: its rows can be reused
    with pytest.raises(Exception, match="comparison.split"):
        load_config("ci", overrides={"comparison": {"split": "train"}})


def test_spogw_compare_says_so_when_the_comparison_has_no_rows(monkeypatch):
    """An empty comparison table (no method scored) is a clear error, not an IndexError on its first row."""
    import argparse

    import polars as pl

    from spogw_dagster.pipeline.runs import commands, loop
    from spogw_dagster.pipeline.settings import ConfigValidationError

    monkeypatch.setattr(loop, "run_comparison", lambda *a, **k: pl.DataFrame())
    args = argparse.Namespace(iteration=3, methods="spogw", profile="ci", config=None, assets_dir=None, split=None,
                              json=False)
    with pytest.raises(ConfigValidationError, match=r"objective_comparison\[0003\] has no rows"):
        commands._objective_comparison(args)


def test_every_method_loads_under_the_anchors_own_loss():
    """A loop with `training.off_policy_loss` set: the GRPO-family methods on the loop's anchored data keep it,
    every other method (own data without anchors, or another objective) trains with the clipped default."""
    from spogw_dagster.core.methods.catalog import method_names
    from spogw_dagster.pipeline.defs.assets.objective_comparison import method_config
    from spogw_dagster.pipeline.settings import load_config

    cfg = load_config("answers", overrides={"training": {"off_policy_loss": "shaped"}})
    got = {name: method_config(cfg, name) for name in method_names()}
    assert got["spogw"].training.off_policy_loss == "shaped" and got["grpo"].training.off_policy_loss == "shaped"
    for name, mc in got.items():
        grouped = mc.generator.anchors and mc.train_config().spec.data == "groups"
        assert mc.training.off_policy_loss == ("shaped" if grouped else "clipped"), name
    assert got["score_dpo"].training.off_policy_loss == "clipped" and got["rwr"].training.off_policy_loss == "clipped"
