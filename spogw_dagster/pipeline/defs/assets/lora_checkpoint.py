"""lora_checkpoint(k): the LoRA adapter of iteration k, trained with the configured objective (ioGRPO + mKL by
default) on the sharpened groups, continuing from lora_checkpoint(k-1). The baselines read the full scored
candidate set instead (sampled_workflows joined with execution_scores), as their papers do: score_dpo
ScoreFlow's pairs, rwr W4S's every-candidate-once (`training_inputs.training_data`). With no training data, or data
on fewer than `training.min_queries` queries, the parent policy is carried forward unchanged, so iteration k+1 still has a checkpoint to sample from. With `selection` on,
the trained adapter becomes checkpoint k only if it beats π_{k-1} on the validation split (`domain/selection.py`);
otherwise π_{k-1} is carried forward the same way and the trained adapter stays in `<k>.trained`. With
`selection.epochs` it trains once per listed length (`<k>.trained.e<N>` beside `<k>.trained`) and the best of them
on validation is the one judged.

Side table `training_rows` (one Parquet per iteration partition, a DuckDB view like heldout_results): the
rows each objective trained on, e.g. `select objective, role, count(*) from training_rows group by all`."""

import dataclasses
import time
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl

from spogw_dagster.core.training import finished_run
from spogw_dagster.core.training.launch import fit_adapter
from spogw_dagster.pipeline.data import tables, training_inputs
from spogw_dagster.pipeline.data.catalog import refresh_catalog
from spogw_dagster.pipeline.data.checkpoints import adapter_sha256, carry_forward, copy_adapter, trained_dir
from spogw_dagster.pipeline.data.storage import AssetStore
from spogw_dagster.pipeline.defs import failures
from spogw_dagster.pipeline.defs.assets.common import common_metadata, parent_or_fail, say, versioned
from spogw_dagster.pipeline.defs.partitions import iterations, key_to_int
from spogw_dagster.pipeline.defs.plots import curve
from spogw_dagster.pipeline.defs.resources import PipelineResource
from spogw_dagster.pipeline.domain import heldout as ho
from spogw_dagster.pipeline.domain import selection
from spogw_dagster.pipeline.domain.lineage import check_sampled_from_parent

NAME = "lora_checkpoint"
GROUP = "training"
KINDS = {"pytorch", "parquet"}
DESCRIPTION = ("LoRA adapter of iteration k trained with the configured objective (ioGRPO + mKL by default) on the "
               "sharpened groups, or for score_dpo / rwr on the candidates their papers keep (ScoreFlow's pairs of "
               "workflows that ran, on the answer; W4S's weighted candidates that ran and scored above 0.05), continuing from lora_checkpoint(k-1). Side table: training_rows.")
# The config sections it reads (its code version and `config_section_hash` cover them): with selection on, the
# gate runs the executor on validation, whose queries W4S's feedback may reserve (the count, from refinement or
# comparison, is in `selection`).
SECTIONS = ("generator", "training")
SECTIONS_WHEN_ON = {"selection": ("selection", "benchmark", "executor", "execution", "reward", "refinement")}
TRAINING_ROWS = "training_rows"
SELECTION_RESULTS = "selection_results"  # the validation gate's per-query rows (heldout_results' columns)


@dg.asset(group_name=GROUP, description=DESCRIPTION, kinds=KINDS, partitions_def=iterations,
          io_manager_key="io_manager")
@versioned
def lora_checkpoint(context: dg.AssetExecutionContext, pipeline: PipelineResource, sharpened_groups: pl.DataFrame,
                    sampled_workflows: pl.DataFrame, execution_scores: pl.DataFrame) -> pl.DataFrame:
    t0 = time.monotonic()
    cfg = pipeline.config()
    key = context.partition_key
    store = pipeline.store()
    parent = parent_or_fail(store, key)
    with failures.as_failure():
        check_sampled_from_parent(key, parent, sampled_workflows)
    tcfg = cfg.train_config()
    examples, used, narrow = training_inputs.iteration_training_data(
        tcfg, cfg.training.min_queries, sharpened_groups, sampled_workflows, execution_scores, key_to_int(key))
    out = store.adapter_dir(key)
    verdict = None
    if cfg.selection.enabled and examples:  # with nothing trained there is nothing to select
        stats, reused, verdict = _train_and_select(context, pipeline, tcfg, examples, key, parent)
    else:
        if examples:
            _adopt_finished_run(examples, tcfg, cfg.generator.model, out, trained_dir(store, key), parent)
        stats, reused = _train_or_carry(context, cfg, tcfg, examples, out, parent, narrow)
        # an earlier gated run's validation rows do not describe this checkpoint
        store.parquet_path(SELECTION_RESULTS, key).unlink(missing_ok=True)
    write_training_rows(store, key, used)  # after the adapter: a kill mid-training leaves neither
    row = _row(key_to_int(key), out, parent, stats, reused, len(examples), tcfg.objective, verdict)
    context.add_output_metadata({**common_metadata(cfg, NAME, t0), **_metadata(row, parent, stats),
                                 "training_rows": dg.MetadataValue.json(_rows_summary(used)),
                                 **({"selection": dg.MetadataValue.json(verdict.as_dict())} if verdict else {})})
    say(context, ("trained" if row["trained"] else f"carried forward ({narrow or 'no data'})")
        + f" on {len(examples)} examples, "
                 f"{row['optimizer_steps']} steps, last loss {row['last_loss']}"
                 + (" (identical earlier run reused)" if reused else "")
                 + ("" if verdict is None else "; " + ("kept" if verdict.keep else "not kept: parent carried forward"))
                 + f", {time.monotonic() - t0:.1f} s")
    return tables.checkpoint_frame(row)


def _adopt_finished_run(examples: list, tcfg, base_model: str, target: Path, other: Path, parent) -> None:
    """Turning selection on or off moves where training writes (`<k>.trained` or `<k>`): the identical finished
    run in the other folder is copied over instead of trained again."""
    prev = parent.path if parent else None
    if other.is_dir() and finished_run(examples, tcfg, target, base_model, prev) is None \
            and finished_run(examples, tcfg, other, base_model, prev) is not None:
        copy_adapter(other, target)


def _train_and_select(context, pipeline: PipelineResource, tcfg, examples: list, key: str, parent):
    """Train each training length the gate tries (`selection.epochs`; unset: training.epochs) beside the
    checkpoint folder, then let `_select` choose. The longest trains first and saves the shorter ones on the way
    where that is exact (`core.training.snapshots`); the others train on their own. Returns the chosen length's
    (stats, reused) and the verdict."""
    cfg, store = pipeline.config(), pipeline.store()
    lengths = cfg.selection.lengths(tcfg.epochs)
    # training.epochs trains where selection without lengths does (`<k>.trained`), the others in `.e<N>`
    folders = {e: trained_dir(store, key, None if e == tcfg.epochs else e) for e in lengths}
    configs = {e: dataclasses.replace(tcfg, epochs=e) for e in lengths}
    prev = parent.path if parent else None
    if tcfg.epochs in folders:
        _adopt_finished_run(examples, tcfg, cfg.generator.model, folders[tcfg.epochs], store.adapter_dir(key), parent)
    done_before = {e: finished_run(examples, configs[e], folders[e], cfg.generator.model, prev) is not None
                   for e in lengths}
    longest = max(lengths)
    results = {}
    for e in sorted(lengths, key=lambda e: e != longest):
        shorter = {s: folders[s] for s in lengths if s < e and not done_before[s]} if e == longest else None
        results[e] = _train_or_carry(context, cfg, configs[e], examples, folders[e], parent, snapshots=shorter)
    verdict = _select(context, pipeline, key, parent, [(e, folders[e]) for e in lengths])
    return results[verdict.epochs][0], done_before[verdict.epochs], verdict


def _select(context, pipeline: PipelineResource, key: str, parent, trained: list[tuple[int, Path]]) -> selection.Verdict:
    """The validation gate: the trained adapters (training length, folder) against π_{k-1}; the best of them on
    validation is the candidate (`selection.best_length`); copy it to the checkpoint folder if kept, else carry
    π_{k-1} forward there. The per-query rows of every policy go to the `selection_results` table."""
    cfg, store, k = pipeline.config(), pipeline.store(), key_to_int(key)
    out, base = store.adapter_dir(key), trained_dir(store, key).name
    # named after the folder: `trained@<k>` for `<k>.trained`, `trained@<k>.e<N>` for `<k>.trained.e<N>`
    cands = [ho.Policy(f"trained@{key}{folder.name.removeprefix(base)}", "checkpoint", folder, k,
                       adapter_sha256(folder)) for _, folder in trained]
    prev = ho.previous_policy(parent)
    with failures.as_failure():
        report, scored, n = selection.score_validation(pipeline, cands, prev, cfg, iteration=k,
                                                       say=lambda m: say(context, m))
    failures.fail_on_outage(cfg, scored.executed, scored.counters, asset=NAME, partition_key=key,
                            cache_path=pipeline.cache_path())
    with failures.as_failure():
        verdicts, unpaired = selection.length_verdicts(report, cfg.selection.min_delta, n,
                                                       [(e, c.system) for (e, _), c in zip(trained, cands)])
        tried = tuple((e, v.candidate, v.delta) for e, v in verdicts)
        best = selection.best_length(tried)
    # the lengths are named in what is said only when the config lists them (older reasons stay as they were)
    verdict = dataclasses.replace(verdicts[best][1], epochs=tried[best][0],
                                  tried=tried if cfg.selection.epochs is not None else ())
    for e, why in unpaired:
        context.log.warning(f"{e} epochs left out of the choice: {why}")
    best_folder = dict(trained)[verdict.epochs]
    store.write_parquet(SELECTION_RESULTS, key, scored.heldout)
    refresh_catalog(store)
    said = verdict.sentence(prev.system)
    say(context, said)
    if verdict.keep:
        copy_adapter(best_folder, out)
    else:
        carry_forward(out, parent.path if parent else None, cfg.train_config(), cfg.generator.model, reason=said)
    return verdict


def write_training_rows(store: AssetStore, key: str, rows: pl.DataFrame) -> Path:
    """The training_rows side table of partition `key` (replaced on a rerun), then the DuckDB catalog."""

    store.write_parquet(TRAINING_ROWS, key, rows)
    refresh_catalog(store)
    return store.parquet_path(TRAINING_ROWS, key)


def _rows_summary(rows: pl.DataFrame) -> dict[str, Any]:
    """Rows per role and the distinct candidates they use (what training_rows holds, in brief)."""
    roles = dict(sorted(rows.group_by("role").len().iter_rows())) if rows.height else {}
    return {"rows": rows.height, "by_role": roles,
            "distinct_workflows": rows.select(["query_id", "sample_idx"]).unique().height,
            "queries": rows["query_id"].n_unique()}


def _train_or_carry(context, cfg, tcfg, examples: list, out: Path, parent,
                    narrow: str | None = None, snapshots: dict | None = None) -> tuple[dict[str, Any], bool]:
    """Train on the examples with `tcfg` (saving `snapshots` on the way); without any, carry the parent adapter
    forward, saying why (`narrow`: the data covered too few queries). Returns (training stats, reused)."""

    prev = parent.path if parent else None
    if not examples:
        reason = narrow or tcfg.spec.no_data  # else the objective's own words (core.training.registry)
        context.log.warning(f"{reason}: the parent policy is carried forward unchanged as this iteration's "
                            "checkpoint")
        return carry_forward(out, prev, tcfg, cfg.generator.model, reason=reason), False
    done = finished_run(examples, tcfg, out, cfg.generator.model, prev) is not None
    say(context, ("reusing the identical finished run in " + out.name + ": " if done else "training ")
        + f"{tcfg.objective} for {tcfg.epochs} epoch(s) on {len(examples)} examples "
        f"(previous adapter: {parent.partition if parent else 'none'})")
    res = fit_adapter(examples, tcfg, out, base_model=cfg.generator.model,
                      previous_adapter=prev, processes=cfg.training.processes,
                      log=lambda st: context.log.debug(f"step {st['step']}: loss {st.get('loss')}"),
                      progress=lambda msg: say(context, msg), snapshots=snapshots)
    return res.stats, res.reused


def _row(k: int, out: Path, parent, stats: dict[str, Any], reused: bool, n_examples: int,
         objective: str, verdict: selection.Verdict | None = None) -> dict[str, Any]:
    summary = stats.get("summary", {})
    steps = stats.get("steps", [])
    return {
        "iteration": k, "adapter_path": str(out), "adapter_sha256": adapter_sha256(out),
        "parent_iteration": parent.iteration if parent else None,
        "parent_adapter_sha256": parent.sha256 if parent else None,
        "trained": n_examples > 0, "reused": reused, "n_examples": n_examples,
        "optimizer_steps": int(summary.get("optimizer_steps") or 0),
        "first_loss": summary.get("first_loss"), "last_loss": summary.get("last_loss"),
        "loss_curve": training_inputs.step_curve(steps, "loss"), "kl_curve": training_inputs.step_curve(steps, "kl"),
        "train_seconds": summary.get("train_seconds"), "run_hash": stats.get("run_hash"), "objective": objective,
        "selected": None if verdict is None else verdict.keep,
        "validation_answer": None if verdict is None else verdict.candidate,
        "validation_parent_answer": None if verdict is None else verdict.parent,
        "selected_epochs": None if verdict is None else verdict.epochs,
    }


def _metadata(row: dict[str, Any], parent, stats: dict[str, Any]) -> dict[str, Any]:
    md: dict[str, Any] = {
        "adapter_path": dg.MetadataValue.path(row["adapter_path"]),
        "adapter_sha256": dg.MetadataValue.text(row["adapter_sha256"]),
        "parent_checkpoint": dg.MetadataValue.json(parent.as_metadata() if parent else {"partition": None}),
        "trained": dg.MetadataValue.bool(row["trained"]),
        "reused_identical_run": dg.MetadataValue.bool(row["reused"]),
        "examples": dg.MetadataValue.int(row["n_examples"]),
        "optimizer_steps": dg.MetadataValue.int(row["optimizer_steps"]),
        "objective": dg.MetadataValue.text(row["objective"]),
        "training_summary": dg.MetadataValue.json({k: v for k, v in stats.get("summary", {}).items() if v is not None}),
    }
    losses, kls = row["loss_curve"], row["kl_curve"]
    if losses:
        md["loss_curve"] = dg.MetadataValue.md(curve(losses, f"iteration {row['iteration']}: training loss", "loss",
                                                     {"kl": kls} if kls else None))
        md["last_loss"] = dg.MetadataValue.float(float(losses[-1]))
    return md
