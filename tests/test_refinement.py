"""W4S multi-turn refinement: the prompt and feedback text by hand, and a real two-turn iteration on the
bundled model (turn 1 revises turn 0 from feedback, is executed in the sandbox and scored, names its parent)."""

from __future__ import annotations

import dagster as dg
import polars as pl
import pytest

from spogw_dagster.pipeline.refinement import feedback_text
from spogw_dagster.workflow.template import WORKFLOW_HEADER, generator_prompt, refinement_prompt


def test_feedback_text_lists_each_run_and_the_mean():
    text = feedback_text([("ok", 0.5, ""), ("runtime_error", 0.3, "NameError: name 'x' is not defined\n  at line 3")])
    assert text.split("\n") == [
        "example 1: ok, reward 0.50",
        "example 2: runtime_error, reward 0.30 (NameError: name 'x' is not defined)",
        "mean reward 0.40 over 2 example tasks",  # (0.5 + 0.3) / 2
    ]


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
    """ci profile with refinement.turns = 2: sampled_workflows holds m rows per query for each turn; each turn-1
    row revises the turn-0 row it names, its prompt carries that workflow and its feedback, and
    execution_scores scores it in the sandbox like any other row."""
    from spogw_dagster.pipeline.partitions import PARTITIONS_NAME
    from spogw_dagster.pipeline.settings import load_config
    from spogw_dagster.pipeline.wiring import build_definitions

    cfg = load_config("ci", overrides={"refinement": {"turns": 2, "feedback_queries": 1}})
    defs = build_definitions(assets_dir=tmp_path / "assets", config=cfg)
    job = defs.resolve_implicit_global_asset_job_def()
    (tmp_path / "home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "home")) as inst:
        inst.add_dynamic_partitions(PARTITIONS_NAME, ["0000"])
        res = job.execute_in_process(partition_key="0000", instance=inst, raise_on_error=False,
                                     asset_selection=[dg.AssetKey("sampled_workflows"), dg.AssetKey("execution_scores")])
        assert res.success, [e.message for e in res.all_events if e.is_failure]
    from spogw_dagster.pipeline.storage import AssetStore

    store = AssetStore(tmp_path / "assets")
    sampled = store.read_parquet("sampled_workflows", "0000")
    scores = store.read_parquet("execution_scores", "0000")
    m, d = cfg.curation.m, cfg.benchmark.train_queries
    assert sampled.height == d * m * 2 and scores.height == sampled.height
    t0, t1 = sampled.filter(pl.col("turn") == 0), sampled.filter(pl.col("turn") == 1)
    assert t0["parent_sample_idx"].null_count() == t0.height
    assert sorted(t1["sample_idx"].unique().to_list()) == list(range(m, 2 * m))
    for r in t1.iter_rows(named=True):
        parent = t0.filter((pl.col("query_id") == r["query_id"]) & (pl.col("sample_idx") == r["parent_sample_idx"]))
        assert parent.height == 1 and r["sample_idx"] == m + r["parent_sample_idx"]
        p = parent.row(0, named=True)
        # the revision's prompt shows the parent's workflow line by line and the feedback of its runs
        assert "# Previous workflow:" in r["prompt"] and "mean reward" in r["prompt"]
        assert all(f"# | {line}" in r["prompt"] for line in (p["workflow"] or "").rstrip("\n").split("\n"))
    # every turn-1 row was executed (or rejected as unparsed) and scored
    j = t1.join(scores, on=["iteration", "query_id", "sample_idx"], how="left")
    assert j["score"].null_count() == 0
    assert set(j.filter(pl.col("parse_status") == "ok")["runs"].to_list()) <= {1}
