"""How each method of the comparison is configured and trained: its config (the loop's with the method's
overrides), the config it is scored with, its training examples, its adapter (trained from the parent, carried
forward when it has no data, or the loop's own checkpoint when that trained exactly the same). No Dagster:
`objective_comparison` calls it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Callable

import polars as pl

from spogw_dagster.adapter_files import STATS_FILE
from spogw_dagster.core import curation
from spogw_dagster.core.methods.catalog import method_overrides
from spogw_dagster.core.training import config_identity, data_hash, registry
from spogw_dagster.core.training.launch import fit_adapter
from spogw_dagster.pipeline.data import tables, training_inputs
from spogw_dagster.pipeline.data.checkpoints import adapter_sha256, carry_forward
from spogw_dagster.pipeline.data.comparison_store import method_adapter_dir
from spogw_dagster.pipeline.data.iteration_keys import key_to_int
from spogw_dagster.pipeline.data.storage import AssetStore
from spogw_dagster.pipeline.domain.comparison_stats import MethodRun
from spogw_dagster.pipeline.settings import SpogwConfig, deep_merge, parse_config


def scoring_config(cfg: SpogwConfig) -> SpogwConfig:
    """The config the methods are scored with: the report's, on `comparison.split` (validation by default, so
    that choosing between methods never looks at the test split). On another split than the report's, none of
    the report's held-out rows are reused (the config hash differs)."""
    if cfg.comparison.split == cfg.report.split:
        return cfg
    return parse_config(deep_merge(cfg.canonical(), {"report": {"split": cfg.comparison.split}}))


def method_config(cfg: SpogwConfig, name: str) -> SpogwConfig:
    """The loop's config with method `name`'s curation/training overrides applied (validated as any config). The
    anchors' own loss (`training.off_policy_loss`) goes only to a method that trains the GRPO family on anchors;
    the others train as their papers do (the clipped default, which they never read), and without
    `training.anchor_stop`."""
    c = cfg.comparison
    d = deep_merge(cfg.canonical(), method_overrides(
        name, cfg.curation.n, cfg.curation.t, w4s_turns=c.w4s_turns, w4s_feedback_queries=c.w4s_feedback_queries))
    if not d["generator"].get("anchors") or registry.get(d["training"]["objective"]).data != "groups":
        d["training"]["off_policy_loss"] = "clipped"
        d["training"].pop("anchor_stop", None)  # likewise the anchors' stop: such a method trains its epochs
        d["training"].pop("anchor_stop_margin", None)
    return parse_config(d)


def candidate_rows_sha256(sampled: pl.DataFrame, scores: pl.DataFrame) -> str:
    """One hash of the iteration's data every method starts from: each workflow's tokens and its score."""
    cols = ["iteration", "query_id", "sample_idx"]
    j = sampled.select(cols + ["completion_token_ids"]).join(scores.select(cols + ["status", "score"]), on=cols,
                                                             how="left").sort(cols)
    return hashlib.sha256(json.dumps(j.to_dicts(), sort_keys=True, default=str).encode()).hexdigest()


def method_examples(mcfg: SpogwConfig, cfg: SpogwConfig, sampled: pl.DataFrame, scores: pl.DataFrame,
                    sharpened: pl.DataFrame, iteration: int) -> tuple[list, pl.DataFrame, str | None]:
    """A method's training examples, the rows they used, and why there are none when its rows covered fewer than
    training.min_queries queries: the loop's sharpened groups when the method keeps the loop's curation, else
    curated again from the same scored rows with the method's curation."""
    if mcfg.curation != cfg.curation:
        cc = mcfg.curation_config()
        sharpened = curation.sharpen(curation.screen(tables.curation_input(sampled, scores), cc).groups, cc).members
    return training_inputs.iteration_training_data(mcfg.train_config(), mcfg.training.min_queries, sharpened,
                                                   sampled, scores, iteration)  # as the loop


def trained_the_same(adapter: Path, tcfg, examples_sha256: str) -> bool:
    """Whether the adapter's training record shows this config and these examples (the parent is checkpoint
    k-1 for both, by lineage)."""

    try:
        stats = json.loads((adapter / STATS_FILE).read_text())
    except (OSError, ValueError):
        return False
    same_config = (json.loads(json.dumps(config_identity(stats.get("config") or {})))
                   == json.loads(json.dumps(tcfg.identity())))  # the forward path taken is no difference
    return same_config and stats.get("hashes", {}).get("data") == examples_sha256


def train_method(cfg: SpogwConfig, name: str, frames, store: AssetStore, key: str, parent,
                 checkpoint: dict[str, Any], *, say: Callable[[str], None],
                 warn: Callable[[str], None]) -> MethodRun:
    """Method `name`'s adapter of partition `key`, from `frames` (sampled, scores, sharpened) and the parent
    adapter: the loop's own checkpoint when it trained exactly this, else trained (or, without examples, the
    parent carried forward) into its folder under `comparison/`."""
    mcfg = method_config(cfg, name)
    tcfg = mcfg.train_config()
    examples, _, narrow = method_examples(mcfg, cfg, *frames, key_to_int(key))
    common = dict(method=name, objective=tcfg.objective, n_examples=len(examples),
                  examples_sha256=data_hash(examples), seed=tcfg.seed)
    path = store.adapter_dir(key)  # this assets directory's (the row's path may name where it was written)
    if checkpoint["trained"] and trained_the_same(path, tcfg, common["examples_sha256"]):
        # the loop trained exactly this at k: same training config, data (hence seed) and parent
        say(f"{name}: the loop's lora_checkpoint[{key}] (same config and data)")
        return MethodRun(adapter=path, adapter_sha256=adapter_sha256(path), train_seconds=None,
                         reused="lora_checkpoint", **common)
    out = method_adapter_dir(store, key, name)
    if examples:
        say(f"{name}: training {tcfg.objective} on {len(examples)} examples")
        res = fit_adapter(examples, tcfg, out, base_model=cfg.generator.model,
                          previous_adapter=parent.path if parent else None, processes=cfg.training.processes)
        secs = res.stats.get("summary", {}).get("train_seconds")
    else:
        why = narrow or tcfg.spec.no_data  # the objective's own words, as lora_checkpoint says them
        warn(f"{name}: {why}; the parent policy stands in for it")
        carry_forward(out, parent.path if parent else None, tcfg, cfg.generator.model, reason=f"{name}: {why}")
        secs = None
    return MethodRun(adapter=out, adapter_sha256=adapter_sha256(out), train_seconds=secs, reused="", **common)
