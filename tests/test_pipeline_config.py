"""Pipeline configuration: shipped profiles, validation with clear errors, files, hashes."""

from __future__ import annotations

import pytest

from spogw_dagster.pipeline.defs.versions import section_hash
from spogw_dagster.pipeline.settings import ConfigValidationError, config_hash, load_config
from spogw_dagster.pipeline.profiles import profile_names


def test_profiles_load_and_build_core_configs():
    for name in ("tiny", "ci", "answers"):
        cfg = load_config(name)
        assert cfg.profile == name
        cc = cfg.curation_config()
        assert cc.m >= cc.n >= 2 * cc.t
        tc = cfg.train_config()
        assert tc.temperature == cfg.generator.temperature  # π_old is the sampler's distribution
        assert cfg.benchmark.name == "humaneval"
        assert cfg.executor.url is None  # embedded executor
    assert set(profile_names()) == {"tiny", "ci", "answers", "paper"}
    # answers: the capable bundled executor and generator; the headline run: one iteration, held out on the
    # first 40 test queries beside IO (about 50 minutes on 2 cores)
    a = load_config("answers")
    assert (a.executor.model, a.generator.model, a.benchmark.heldout_queries) == ("qwen2.5-coder-0.5b",) * 2 + (40,)
    assert (a.iterations, a.report.baselines, a.generator.prompt) == (1, ("io",), "anchored")
    assert load_config().profile == "tiny"  # the default


def test_paper_profile_needs_its_models(monkeypatch, tmp_path):
    monkeypatch.delenv("SPOGW_GENERATOR_MODEL", raising=False)
    with pytest.raises(ConfigValidationError, match="SPOGW_GENERATOR_MODEL is not set"):
        load_config("paper")
    model = tmp_path / "model"
    model.mkdir()
    monkeypatch.setenv("SPOGW_GENERATOR_MODEL", str(model))
    monkeypatch.setenv("SPOGW_EXECUTOR_URL", "http://127.0.0.1:8000/v1")
    monkeypatch.setenv("SPOGW_EXECUTOR_MODEL", "qwen")
    cfg = load_config("paper")
    assert (cfg.curation.m, cfg.curation.n, cfg.training.beta, cfg.iterations) == (16, 14, 0.1, 3)
    assert (cfg.benchmark.train_queries, cfg.benchmark.heldout_queries) == (65, 83)  # all of train and of test
    assert cfg.generator.model == str(model.resolve())


@pytest.mark.parametrize("overrides, message", [
    ({"curation": {"m": 3}}, "set m >= n"),
    ({"curation": {"t": 3}}, "set n >= 2t"),
    ({"training": {"beta": -0.5}}, "KL coefficient must be >= 0"),
    ({"training": {"objective": "ppo"}}, "choose one of"),
    ({"training": {"bogus": 1}}, "unknown field"),
    ({"training": {"temperature": 0.5}}, "taken from generator.temperature"),
    ({"benchmark": {"name": "imagenet"}}, "unknown benchmark 'imagenet'"),
    ({"benchmark": {"name": "mbpp"}}, "set benchmark.data_path"),
    ({"benchmark": {"train_queries": 0}}, "benchmark.train_queries"),
    ({"generator": {"model": "/no/such/model"}}, "neither an alias"),
    ({"generator": {"temperature": 0}}, "generator.temperature"),
    ({"executor": {"url": "http://x/v1"}}, "needs executor.model"),
    ({"reward": {"format": 0.5, "answer": 0.8}}, "sum to 1.7 > 1"),
    ({"reward": {"valid": float("nan")}}, "finite numbers"),
    ({"iterations": 0}, "iterations"),
    ({"training": {"min_queries": 3}}, "training.min_queries=3 is more than benchmark.train_queries=2"),
    ({"training": {"min_queries": 0}}, "training.min_queries"),
    ({"training": {"off_policy_loss": "log_prob"}}, "generator.anchors is off"),
    ({"curation": {"anchor_groups": "contrast"}}, "curation.anchor_groups applies to the prompt's own workflows"),
    ({"execution": {"anchor_runs": 3}}, "execution.anchor_runs applies to the prompt's own workflows"),
    ({"curation": {"anchor_groups": "apart"}}, "choose one of mixed, contrast"),
    ({"benchmark": {"name": "gsm8k"}, "report": {"baselines": ["io", "sc3"]}}, "not a code benchmark"),
    ({"training": {"off_policy_loss": "shaped", "off_policy_gamma": -1.0}}, "must be > 0"),
    ({"training": {"anchor_stop": 0.8}}, "training.anchor_stop stops when the anchors' verdict is taken"),
    ({"training": {"anchor_stop": 1.5}}, "anchor_stop=1.5"),
    ({"training": {"anchor_stop_margin": 1.0}}, "anchor_stop_margin is the margin of anchor_stop, which is off"),
    ({"nonsense": 1}, "nonsense"),
])
def test_validation_errors_name_the_field_and_fix(overrides, message):
    with pytest.raises(ConfigValidationError) as ei:
        load_config("ci", overrides=overrides)
    assert message in str(ei.value)
    assert str(ei.value).startswith("invalid configuration")


def test_several_errors_are_reported_together():
    with pytest.raises(ConfigValidationError) as ei:
        load_config("ci", overrides={"iterations": 0, "benchmark": {"heldout_queries": 0}})
    assert "iterations" in str(ei.value) and "heldout_queries" in str(ei.value)


def test_yaml_file_starts_from_a_profile_and_overrides(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("profile: ci\ncuration:\n  m: 6\n  n: 4\nreport:\n  baselines: [io, cot]\n")
    cfg = load_config(config_file=f)
    assert cfg.profile == "ci" and cfg.curation.m == 6 and cfg.report.baselines == ("io", "cot")
    assert cfg.benchmark.train_queries == load_config("ci").benchmark.train_queries
    with pytest.raises(ConfigValidationError, match="conflicts"):
        load_config("tiny", config_file=f)
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n")
    with pytest.raises(ConfigValidationError, match="mapping"):
        load_config(config_file=bad)
    with pytest.raises(ConfigValidationError, match="does not exist"):
        load_config(config_file=tmp_path / "missing.yaml")
    bare = tmp_path / "bare.yaml"  # no profile: the defaults
    bare.write_text("iterations: 1\n")
    assert load_config(config_file=bare).profile == "custom"


def test_hashes():
    a, b = load_config("ci"), load_config("ci")
    assert config_hash(a) == config_hash(b)
    # the number of iterations changes no asset's content
    assert config_hash(load_config("ci", overrides={"iterations": 5})) == config_hash(a)
    # nor where the call cache lives (`--seeds` shares one file; a moved assets directory keeps its iterations)
    moved = load_config("ci", overrides={"executor": {"cache_file": "/elsewhere/call_cache.sqlite"}})
    assert config_hash(moved) == config_hash(a) and section_hash(moved, "execution_scores") == section_hash(
        a, "execution_scores")
    assert config_hash(load_config("ci", overrides={"executor": {"cache": False}})) != config_hash(a)
    # the cached static baselines of a moved `--seeds` run are found again too
    from spogw_dagster.benchmarks.queries import split_problems
    from spogw_dagster.pipeline.domain.heldout import baseline_cache_key

    probs, _ = split_problems("humaneval", "test", limit=2, seed=0)
    assert baseline_cache_key("io", probs, moved) == baseline_cache_key("io", probs, a)
    assert baseline_cache_key("io", probs, load_config("ci", overrides={"executor": {"temperature": 0.1}})) != \
        baseline_cache_key("io", probs, a)
    c = load_config("ci", overrides={"report": {"baselines": ["io", "cot"]}})
    assert config_hash(c) != config_hash(a)
    assert section_hash(c, "sampled_workflows") == section_hash(a, "sampled_workflows")
    assert section_hash(c, "benchmark_report") != section_hash(a, "benchmark_report")


def test_code_versions_follow_config_sections():
    from spogw_dagster.pipeline.defs.versions import code_version

    a = load_config("ci")
    c = load_config("ci", overrides={"curation": {"tau_std": 0.2}})
    assert code_version("screened_groups", a) != code_version("screened_groups", c)
    assert code_version("execution_scores", a) == code_version("execution_scores", c)


def test_report_section_samples_temperature_and_split():
    cfg = load_config("tiny")
    assert cfg.report.greedy and cfg.report.samples >= 1 and cfg.report.split == "test"
    # the sampled mode defaults to the training temperature
    assert cfg.report.sample_temperature is None and cfg.report_temperature() == cfg.generator.temperature
    assert load_config("ci", overrides={"report": {"sample_temperature": 0.9}}).report_temperature() == 0.9
    assert load_config("ci").report.samples <= 2  # the e2e test stays fast
    with pytest.raises(ConfigValidationError, match="score nothing"):
        load_config("ci", overrides={"report": {"greedy": False, "samples": 0}})
    with pytest.raises(ConfigValidationError, match="report.split"):
        load_config("ci", overrides={"report": {"split": "train"}})
    with pytest.raises(ConfigValidationError, match="report.temperature"):  # the old field is gone, loudly
        load_config("ci", overrides={"report": {"temperature": 0.0}})
    # the report's code version follows the reward ladder (its mean reward uses it)
    a = load_config("ci")
    b = load_config("ci", overrides={"reward": {"format": 0.0}})
    assert section_hash(a, "benchmark_report") != section_hash(b, "benchmark_report")


def test_config_is_merged_once_and_travels_resolved(tmp_path):
    """The resource carries the resolved config: deleting the YAML after loading changes nothing, and the
    resource's config equals the loaded one field for field."""
    from spogw_dagster.pipeline.defs.resources import PipelineResource
    from spogw_dagster.pipeline.defs.wiring import build_definitions

    f = tmp_path / "c.yaml"
    f.write_text("profile: ci\ntraining: {beta: 0.05}\n")
    defs = build_definitions(config_file=f, assets_dir=tmp_path)
    f.unlink()
    res = defs.resources["pipeline"]
    assert isinstance(res, PipelineResource)
    cfg = res.config()
    assert cfg.training.beta == 0.05 and cfg.profile == "ci"
    assert cfg == load_config("ci", overrides={"training": {"beta": 0.05}})


def test_rwr_reward_counts_only_where_rwr_reads_it():
    """training.rwr_reward changes no hash of a config or a training run whose objective is not rwr (their
    finished runs stay recognised); for rwr it does (the reward is a different one)."""
    spogw = load_config("tiny")
    assert load_config("tiny", overrides={"training": {"rwr_reward": "score"}}).hash == spogw.hash
    assert "rwr_reward" not in spogw.training.core(0.5).to_dict()
    rwr_w4s = load_config("tiny", overrides={"training": {"objective": "rwr"}})
    rwr_score = load_config("tiny", overrides={"training": {"objective": "rwr", "rwr_reward": "score"}})
    assert rwr_w4s.hash != rwr_score.hash
    assert rwr_w4s.training.core(0.5).to_dict()["rwr_reward"] == "w4s"


def test_training_processes_reach_the_assets_and_stay_out_of_the_hashes(tmp_path):
    """`processes` changes how an adapter is computed, not what: outside the config and section hashes, but
    carried to the assets (through the resource's JSON) and to the plan; it needs lora_dropout = 0."""
    from spogw_dagster.pipeline.defs.resources import PipelineResource

    one, two = load_config("ci"), load_config("ci", overrides={"training": {"processes": 2}})
    assert (one.training.processes, two.training.processes) == (1, 2)
    assert config_hash(one) == config_hash(two)
    assert section_hash(one, "lora_checkpoint") == section_hash(two, "lora_checkpoint")
    assert PipelineResource.from_config(two, tmp_path).config().training.processes == 2
    assert "processes" not in two.train_config().to_dict()  # nor in the trainer's run hash
    with pytest.raises(ConfigValidationError, match=r"processes=2 with training.lora_dropout=0.1.*lora_dropout: 0"):
        load_config("ci", overrides={"training": {"processes": 2, "lora_dropout": 0.1}})


def test_min_queries_is_hashed_for_training_only_when_set():
    """training.min_queries decides whether lora_checkpoint trains, so a set value is in its section hash; the
    default (1) is left out, so configs written before it existed keep their hashes. The trainer never sees it."""
    ci = load_config("ci")
    same = load_config("ci", overrides={"training": {"min_queries": 1}})
    two = load_config("ci", overrides={"training": {"min_queries": 2}})
    assert config_hash(same) == config_hash(ci) and section_hash(same, "lora_checkpoint") == section_hash(
        ci, "lora_checkpoint")
    assert section_hash(two, "lora_checkpoint") != section_hash(ci, "lora_checkpoint")
    assert section_hash(two, "sampled_workflows") == section_hash(ci, "sampled_workflows")
    assert "min_queries" not in two.train_config().to_dict() and two.training.min_queries == 2


def test_off_policy_loss_is_hashed_only_when_it_changes_the_loss():
    """At "clipped" (the default) the fields are left out of the config and the trainer's run hash, whatever γ
    says; γ counts only for "shaped". Another loss changes the training section, not the samples. Only the GRPO
    family's group rows have off-policy rows."""
    a = load_config("answers")
    for same in ({"off_policy_loss": "clipped"}, {"off_policy_gamma": 0.5}, {"off_policy_loss": "clipped",
                                                                             "off_policy_gamma": 0.3}):
        c = load_config("answers", overrides={"training": same})
        assert config_hash(c) == config_hash(a) and c.train_config().identity() == a.train_config().identity()
    assert not {"off_policy_loss", "off_policy_gamma"} & set(a.train_config().to_dict())
    lp = load_config("answers", overrides={"training": {"off_policy_loss": "log_prob", "off_policy_gamma": 0.5}})
    assert section_hash(lp, "lora_checkpoint") != section_hash(a, "lora_checkpoint")
    assert section_hash(lp, "sampled_workflows") == section_hash(a, "sampled_workflows")
    d = lp.train_config().to_dict()
    assert d["off_policy_loss"] == "log_prob" and "off_policy_gamma" not in d
    shaped = load_config("answers", overrides={"training": {"off_policy_loss": "shaped"}}).train_config().to_dict()
    assert (shaped["off_policy_loss"], shaped["off_policy_gamma"]) == ("shaped", 0.1)
    with pytest.raises(ConfigValidationError, match="GRPO family"):
        load_config("answers", overrides={"training": {"off_policy_loss": "log_prob", "objective": "rwr"}})


def test_anchor_settings_are_hashed_only_when_set_and_only_where_they_act():
    """At their defaults the anchor settings leave every hash as it was; set, each changes its own stage and what
    follows, never the samples."""
    a = load_config("answers")
    same = load_config("answers", overrides={"curation": {"anchor_groups": "mixed", "anchor_weight": 1.0},
                                             "execution": {"anchor_runs": None}})
    assert config_hash(same) == config_hash(a)
    runs3 = load_config("answers", overrides={"execution": {"anchor_runs": 3}})
    assert section_hash(runs3, "execution_scores") != section_hash(a, "execution_scores")
    assert section_hash(runs3, "sampled_workflows") == section_hash(a, "sampled_workflows")
    contrast = load_config("answers", overrides={"curation": {"anchor_groups": "contrast"}})
    assert section_hash(contrast, "screened_groups") != section_hash(a, "screened_groups")
    assert section_hash(contrast, "execution_scores") == section_hash(a, "execution_scores")


def test_every_other_profile_points_to_the_headline_run():
    from spogw_dagster.pipeline.profiles import HEADLINE_RUN, PROFILES
    from spogw_dagster.pipeline.runs.loop import headline_pointer

    assert HEADLINE_RUN["profile"] in PROFILES and headline_pointer(HEADLINE_RUN["profile"]) == ""
    line = headline_pointer("tiny")
    assert HEADLINE_RUN["command"] in line and HEADLINE_RUN["wall"] in line and "README" in line


def test_executor_speed_levers_are_hashed_only_when_set():
    """executor.stop_after_code and executor.reproducible change the executor's texts, so a set value is in the
    hash of every asset that executes workflows and in the baselines' cache key; their defaults are left out, so
    earlier configs keep their hashes and cached baselines. The operators get the stop only when it is on."""
    from spogw_dagster.pipeline.domain.heldout import baseline_cache_key
    from spogw_dagster.pipeline.domain.jobs import operator_config
    from spogw_dagster.benchmarks import load_benchmark
    from spogw_dagster.workflow.operators import CODE_STOP

    a = load_config("ci")
    same = load_config("ci", overrides={"executor": {"stop_after_code": False, "reproducible": True}})
    assert config_hash(same) == config_hash(a)
    problems = load_benchmark("humaneval")[:2]
    for lever in ({"stop_after_code": True}, {"reproducible": False}):
        c = load_config("ci", overrides={"executor": lever})
        assert section_hash(c, "execution_scores") != section_hash(a, "execution_scores")
        assert section_hash(c, "benchmark_report") != section_hash(a, "benchmark_report")
        assert section_hash(c, "sampled_workflows") == section_hash(a, "sampled_workflows")
        assert baseline_cache_key("io", problems, c) != baseline_cache_key("io", problems, a)
    assert baseline_cache_key("io", problems, same) == baseline_cache_key("io", problems, a)
    assert operator_config(a).code_stop == ()
    # the headline profile runs the fast mode (the AVX-512 variant where there is one, n-gram speculation)
    assert load_config("answers").executor.reproducible is False and a.executor.reproducible is True
    assert operator_config(load_config("ci", overrides={"executor": {"stop_after_code": True}})).code_stop == CODE_STOP


def test_the_shipped_configs_load_and_name_their_own_command():
    """Every file under configs/ is a valid config whose header shows how to run it (its own path)."""
    from pathlib import Path

    files = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))
    assert files
    for f in files:
        cfg = load_config(config_file=f)
        assert f"--config configs/{f.name}" in f.read_text(), f
        assert cfg.hash
    stop = load_config(config_file=files[0].parent / "answers-anchor-stop.yaml").train_config()
    assert (stop.anchor_stop, stop.anchor_stop_margin, stop.epochs, stop.off_policy_loss) == (0.8, 0.5, 4, "log_prob")
