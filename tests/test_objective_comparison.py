"""objective_comparison's pure parts: each method's config, its examples from the same data, and the table of
values with paired differences to the reference method (expected values by hand)."""

from __future__ import annotations

import polars as pl
import pytest

from spogw_dagster.core.methods.catalog import METHODS, method_overrides, own_data
from spogw_dagster.pipeline.domain.comparison_methods import method_config
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


def test_methods_are_scored_on_validation_unless_told():
    from spogw_dagster.pipeline.domain.comparison_methods import scoring_config

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
    from spogw_dagster.pipeline.settings import load_config

    cfg = load_config("answers", overrides={"training": {"off_policy_loss": "shaped"}})
    got = {name: method_config(cfg, name) for name in method_names()}
    assert got["spogw"].training.off_policy_loss == "shaped" and got["grpo"].training.off_policy_loss == "shaped"
    for name, mc in got.items():
        grouped = mc.generator.anchors and mc.train_config().spec.data == "groups"
        assert mc.training.off_policy_loss == ("shaped" if grouped else "clipped"), name
    assert got["score_dpo"].training.off_policy_loss == "clipped" and got["rwr"].training.off_policy_loss == "clipped"
