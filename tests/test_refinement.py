"""W4S multi-turn refinement: the prompt and feedback text by hand, and a real two-turn iteration on the
bundled model (turn 1 revises turn 0 from feedback, is executed in the sandbox and scored, names its parent)."""

from __future__ import annotations

import dagster as dg
import polars as pl
import pytest

from spogw_dagster.pipeline.domain.refinement import Run, accuracy, feedback_text
from spogw_dagster.workflow.template import WORKFLOW_HEADER, generator_prompt, refinement_prompt


def test_feedback_text_has_accuracy_failure_cases_and_the_change():
    from spogw_dagster.contracts import Problem

    code = Problem("humaneval", "H/1", "Write add(a, b).", answer="return a + b", family="code",
                   entry_point="add", public_tests=["assert add(1, 2) == 3"])
    math_p = Problem("gsm8k", "G/1", "What is 2 + 3?", answer="5", family="math")
    runs = [Run(code, "ok", 0.0, "def add(a, b): return a - b", ""),
            Run(math_p, "runtime_error", 0.0, "", "NameError: name 'x' is not defined\n  at line 3"),
            Run(math_p, "ok", 1.0, "5", "")]
    text = feedback_text(runs, previous=0.5, max_cases=10)
    assert text.split("\n") == [
        "validation accuracy 0.33 (1/3 example tasks solved)",  # 1 / 3
        "failure 1: task: Write add(a, b).",
        "  its answer (ok): def add(a, b): return a - b",
        "  expected: assert add(1, 2) == 3",  # code: the public test, never the canonical solution
        "failure 2: task: What is 2 + 3?",
        "  its answer (runtime_error): (none) [NameError: name 'x' is not defined]",
        "  expected: 5",
        "change against the previous workflow: -0.17 (it had 0.50)",  # 1/3 - 0.5
        "Please improve the workflow.",
    ]
    assert "return a + b" not in text
    # at most max_cases failures; no change line at the first turn
    short = feedback_text(runs, previous=None, max_cases=1).split("\n")
    assert sum(line.startswith("failure ") for line in short) == 1 and not any("change" in x for x in short)
    assert accuracy(runs) == pytest.approx(1 / 3) and accuracy([]) == 0.0


def test_refinement_prompt_shows_workflow_and_feedback_and_does_not_grow():
    base = generator_prompt("code", "Write add(a, b).")
    wf = WORKFLOW_HEADER + "        return await self.code_generate(instruction=\"x\")\n"
    p1 = refinement_prompt(base, wf, "example 1: ok, reward 0.50\nmean reward 0.50 over 1 example tasks")
    assert p1.startswith(base[: base.index("# Task: ")])  # operators and few-shot examples kept
    assert "# Task: Write add(a, b)." in p1
    assert "# | class Workflow:" in p1 and "# |         return await self.code_generate" in p1
    assert "# example 1: ok, reward 0.50" in p1
    assert p1.endswith(WORKFLOW_HEADER + "        ")
    # a second turn replaces the previous workflow and feedback instead of stacking them
    p2 = refinement_prompt(p1, wf, "mean reward 0.00 over 1 example tasks")
    assert p2.count("# Previous workflow:") == 1 and "reward 0.50" not in p2
    assert p2.count("# Task: ") == 1


@pytest.mark.model
def test_two_turns_on_the_real_model(tmp_path):
    """ci profile with refinement.turns = 2, as W4S runs its turns: the turn-0 candidates (and their self-check
    repairs) run on the validation queries, the best advances the state, and the m turn-1 candidates of a query
    are sampled from one prompt showing that state's workflow and feedback; every row is executed and scored;
    and no screened group and no Score-DPO pair holds completions of two prompts."""
    from spogw_dagster.core.hyperparams import ObjectiveConfig
    from spogw_dagster.pipeline.data import training_inputs
    from spogw_dagster.pipeline.defs.partitions import PARTITIONS_NAME
    from spogw_dagster.pipeline.settings import load_config
    from spogw_dagster.pipeline.data.storage import AssetStore
    from spogw_dagster.pipeline.defs.wiring import build_definitions

    cfg = load_config("ci", overrides={"refinement": {"turns": 2, "feedback_queries": 1, "repairs": 1},
                                       "curation": {"n": 2, "t": 1, "tau_std": 0.0}})
    defs = build_definitions(assets_dir=tmp_path / "assets", config=cfg)
    job = defs.resolve_implicit_global_asset_job_def()
    (tmp_path / "home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "home")) as inst:
        inst.add_dynamic_partitions(PARTITIONS_NAME, ["0000"])
        res = job.execute_in_process(partition_key="0000", instance=inst, raise_on_error=False,
                                     asset_selection=[dg.AssetKey(a) for a in
                                                      ("sampled_workflows", "execution_scores", "screened_groups")])
        assert res.success, [e.message for e in res.all_events if e.is_failure]

    store = AssetStore(tmp_path / "assets")
    sampled = store.read_parquet("sampled_workflows", "0000")
    scores = store.read_parquet("execution_scores", "0000")
    m, d = cfg.curation.m, cfg.benchmark.train_queries
    assert scores.height == sampled.height
    cands = sampled.filter(pl.col("repair_of").is_null())
    repairs = sampled.filter(pl.col("repair_of").is_not_null())
    assert cands.height == d * m * 2
    t0, t1 = cands.filter(pl.col("turn") == 0), cands.filter(pl.col("turn") == 1)
    assert t0["parent_sample_idx"].null_count() == t0.height
    assert sorted(t1["sample_idx"].unique().to_list()) == list(range(m, 2 * m))
    # a repair rewrites an unparsed candidate of its turn, at most `repairs` times each, numbered after the turns
    for r in repairs.iter_rows(named=True):
        orig = sampled.filter((pl.col("query_id") == r["query_id"]) & (pl.col("sample_idx") == r["repair_of"]))
        assert orig.height == 1 and orig["parse_status"][0] != "ok" and orig["turn"][0] == r["turn"]
        assert r["sample_idx"] >= 2 * m and "# The validator rejected it:" in r["prompt"]
    assert repairs.group_by("query_id", "repair_of").len()["len"].max() in (None, 1)
    for q in t1["query_id"].unique().to_list():
        mine = t1.filter(pl.col("query_id") == q)
        # one prompt, one state, for all m candidates of the turn
        assert mine["prompt"].n_unique() == 1 and mine["parent_sample_idx"].n_unique() == 1
        state = sampled.filter((pl.col("query_id") == q) & (pl.col("sample_idx") == mine["parent_sample_idx"][0]))
        st = state.row(0, named=True)
        assert st["turn"] == 0 and st["feedback_accuracy"] is not None
        # the state is the best of its query's evaluated turn-0 rows by validation accuracy
        evaluated = sampled.filter((pl.col("query_id") == q) & (pl.col("turn") == 0)
                                   & pl.col("feedback_accuracy").is_not_null())
        assert st["feedback_accuracy"] == evaluated["feedback_accuracy"].max()
        prompt = mine["prompt"][0]
        assert "# Previous workflow:" in prompt and "validation accuracy" in prompt
        assert all(f"# | {line}" in prompt for line in (st["workflow"] or "").rstrip("\n").split("\n"))
    assert t1["feedback_accuracy"].null_count() == t1.height  # the last turn is not run for feedback
    j = sampled.join(scores, on=["iteration", "query_id", "sample_idx"], how="left")
    assert j["score"].null_count() == 0

    # groups and pairs per (query, prompt): every member of a screened group, and both sides of every Score-DPO
    # pair, were sampled from the same prompt
    prompt_of = {(r["query_id"], r["sample_idx"]): r["prompt"] for r in sampled.iter_rows(named=True)}
    screened = store.read_parquet("screened_groups", "0000").filter(pl.col("group_id").is_not_null())
    # both turns formed groups (n = 2 of m = 4 rows per prompt): turn 1's carry its prompt group in the id
    assert any("@" not in g for g in screened["group_id"]) and any("@p" in g for g in screened["group_id"])
    for g in screened.iter_rows(named=True):
        assert len({prompt_of[(g["query_id"], i)] for i in g["members"]}) == 1, g
    _, pairs = training_inputs.score_dpo_training_data(sampled, scores, ObjectiveConfig(objective="score_dpo"), 0)
    for (gid, q), grp in pairs.group_by("group_id", "query_id"):
        assert len({prompt_of[(q, i)] for i in grp["sample_idx"].to_list()}) == 1
    # the W4S reward of every scored row is one of the rule's values
    rewards = training_inputs.w4s_rewards(sampled, scores)
    assert set(rewards.values()) <= {1.0, 0.9, 0.5, 0.4, 0.0, -0.1} and len(rewards) == sampled.height
