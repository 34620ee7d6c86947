"""Checkpoints without training data: the parent policy is carried forward (a copy, or an identity LoRA at
iteration 0), through the lora_checkpoint asset and its check; and the metadata plots."""

from __future__ import annotations

import json

import dagster as dg
import polars as pl
import pytest

from spogw_dagster.core.curation import ADVANTAGE_SCHEMA
from spogw_dagster.pipeline.defs import plots
from spogw_dagster.pipeline.data import tables
from spogw_dagster.pipeline.data.checkpoints import carry_forward
from spogw_dagster.pipeline.settings import load_config
from spogw_dagster.pipeline.data.checkpoints import adapter_sha256
from spogw_dagster.pipeline.data.storage import AssetStore


def test_carry_forward_copies_the_parent_atomically(tmp_path):
    parent = tmp_path / "parent"
    parent.mkdir()
    (parent / "adapter_config.json").write_text('{"r": 4}')
    (parent / "adapter_model.safetensors").write_bytes(b"weights")
    (parent / "training_stats.json").write_text('{"trained": true}')
    out = tmp_path / "lora_checkpoint" / "0001"
    out.mkdir(parents=True)
    (out / "stale.txt").write_text("old")  # a previous materialization is replaced, not merged
    stats = carry_forward(out, parent, load_config("ci").train_config(), "smollm2", reason="nothing to train")
    assert stats["trained"] is False and stats["reason"] == "nothing to train"
    assert sorted(p.name for p in out.iterdir()) == ["adapter_config.json", "adapter_model.safetensors",
                                                     "training_stats.json"]
    assert adapter_sha256(out) == adapter_sha256(parent)
    assert json.loads((out / "training_stats.json").read_text())["trained"] is False
    assert [p.name for p in out.parent.iterdir()] == ["0001"]  # no temp or trash folders left


def test_plots_are_png_markdown():
    for md in (plots.score_histogram({"ok": [0.0, 1.0], "invalid": [0.1]}),
               plots.curve([1.0, 0.5], "loss", "loss", {"kl": [0.0, 0.1]}),
               plots.solve_rate_bars(["a", "b"], [0.5, 0.1], [0.2, 0.0], [0.8, 0.4])):
        assert md.startswith("![") and "data:image/png;base64,iVBOR" in md


@pytest.mark.model
def test_lora_checkpoint_asset_with_no_training_data_carries_the_base_policy(tmp_path):
    """Iteration 0 whose groups were all screened out: an identity LoRA (= the base model), flagged as
    untrained, which the check reloads."""
    from spogw_dagster.pipeline.defs.wiring import build_definitions
    from spogw_dagster.pipeline.defs.partitions import PARTITIONS_NAME

    store = AssetStore(tmp_path)
    store.write_parquet("sharpened_groups", "0000", pl.DataFrame(schema=ADVANTAGE_SCHEMA))
    store.write_parquet("sampled_workflows", "0000", pl.DataFrame(schema=tables.SAMPLED_SCHEMA))
    store.write_parquet("execution_scores", "0000", tables.execution_frame([]))
    defs = build_definitions("ci", assets_dir=tmp_path)
    from spogw_dagster.pipeline.defs.assets import build_assets

    from spogw_dagster.pipeline.defs.checks import loss_finite_and_adapter_reloads

    assets = build_assets(load_config("ci")) + [loss_finite_and_adapter_reloads]
    with dg.instance_for_test() as inst:
        inst.add_dynamic_partitions(PARTITIONS_NAME, ["0000"])
        res = dg.materialize(assets, selection=["lora_checkpoint"], partition_key="0000", instance=inst,
                             resources=defs.resources)
    assert res.success
    row = store.read_parquet("lora_checkpoint", "0000").row(0, named=True)
    assert row["trained"] is False and row["n_examples"] == 0 and row["optimizer_steps"] == 0
    ckpt = store.adapter_dir("0000")
    assert (ckpt / "adapter_model.safetensors").is_file()
    from safetensors.torch import load_file

    b = [t for n, t in load_file(str(ckpt / "adapter_model.safetensors")).items() if "lora_B" in n]
    assert b and all(float(t.abs().max()) == 0.0 for t in b)  # LoRA B = 0: exactly the base model
    md = res.get_asset_materialization_events()[0].materialization.metadata
    assert md["trained"].value is False
    assert [(e.check_name, e.passed) for e in res.get_asset_check_evaluations()] == [
        ("loss_finite_and_adapter_reloads", True)]


@pytest.mark.model
def test_lora_checkpoint_does_not_train_on_too_few_queries(tmp_path):
    """training.min_queries = 2 with sharpened groups of one query: nothing is trained, the parent policy (at
    iteration 0 the base) is carried forward, and the checkpoint's stats and training_rows say so."""
    from spogw_dagster.pipeline.defs.assets import build_assets
    from spogw_dagster.pipeline.defs.partitions import PARTITIONS_NAME
    from spogw_dagster.pipeline.defs.wiring import build_definitions

    store = AssetStore(tmp_path)
    sampled = [{"iteration": 0, "query_id": "q1", "sample_idx": i, "prompt": "p", "completion": f"c{i}",
                "workflow": "w", "parse_status": "ok", "completion_token_ids": [5 + i, 6], "logprobs": [-1.0, -1.5],
                "n_tokens": 2} for i in range(2)]
    sharpened = pl.DataFrame({"iteration": [0, 0], "query_id": ["q1", "q1"], "group_id": ["g0", "g0"],
                              "sample_idx": [0, 1], "score": [1.0, 0.0], "role": ["top", "bottom"], "rank": [0, 1],
                              "group_mean": [0.5, 0.5], "group_std": [0.5, 0.5], "advantage": [1.0, -1.0]},
                             schema=ADVANTAGE_SCHEMA)
    store.write_parquet("sharpened_groups", "0000", sharpened)
    store.write_parquet("sampled_workflows", "0000", tables.typed_frame(sampled, tables.SAMPLED_SCHEMA))
    store.write_parquet("execution_scores", "0000", tables.execution_frame([]))
    over = {"training": {"min_queries": 2}}
    defs = build_definitions("ci", assets_dir=tmp_path, overrides=over)
    with dg.instance_for_test() as inst:
        inst.add_dynamic_partitions(PARTITIONS_NAME, ["0000"])
        res = dg.materialize(build_assets(load_config("ci", overrides=over)), selection=["lora_checkpoint"],
                             partition_key="0000", instance=inst, resources=defs.resources)
    assert res.success
    row = store.read_parquet("lora_checkpoint", "0000").row(0, named=True)
    assert row["trained"] is False and row["n_examples"] == 0 and row["optimizer_steps"] == 0
    stats = json.loads((store.adapter_dir("0000") / "training_stats.json").read_text())
    assert stats["reason"] == "training data on 1 query only, fewer than training.min_queries = 2"
    assert store.read_parquet("training_rows", "0000").height == 0
