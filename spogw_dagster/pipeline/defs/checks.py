"""Partitioned asset checks (each declares `partitions_def`, so it runs once per iteration on that partition).

    sampled_workflows  m_workflows_per_query           every training query has exactly m sampled workflows
    execution_scores   scores_complete                  one score per sampled workflow, in [0, 1]; every non-ok
                                                        status carries its reason (no unexplained missing score)
    execution_scores   executor_error_rate              executor_error share of the executed workflows <=
                                                        execution.max_executor_error_rate (the asset itself fails
                                                        above it and writes nothing, so this passes on any
                                                        partition written by this code; it flags older ones)
    execution_scores   no_internal_errors               no run tripped a bug of ours (WARN: such runs are scored as
                                                        the workflow's runtime_error, never excluded; report them)
    screened_groups    groups_kept                      at least one group survived screening (WARN: an empty
                                                        iteration carries its parent policy forward)
    lora_checkpoint    loss_finite_and_adapter_reloads  every loss finite; the adapter reloads with peft and its
                                                        hash matches (blocking: the report never scores a broken
                                                        adapter)
    benchmark_report   compared_with_previous           the report pairs checkpoint k with iteration k-1 (or the base
                                                        model) and the answer score fell by at most
                                                        report.max_regression (WARN)
"""

import math
import warnings

import dagster as dg
import polars as pl

from spogw_dagster.models import load_model_and_tokenizer
from spogw_dagster.pipeline.data import report_stats
from spogw_dagster.pipeline.data.checkpoints import adapter_sha256
from spogw_dagster.pipeline.data.tables import internal_error_rows
from spogw_dagster.pipeline.defs.partitions import iteration_key, iterations
from spogw_dagster.pipeline.defs.resources import PipelineResource
from spogw_dagster.pipeline.domain.anchors import anchors_per_query
from spogw_dagster.pipeline.domain.outage import executed_error_share


def _ck(**kw):
    # partitions_def on asset checks is a Dagster "preview" feature (1.13); without it a check on iteration k
    # would load every partition (see the research notes), so we use it and silence the preview warning.
    def deco(fn):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dg.PreviewWarning)
            return dg.asset_check(partitions_def=iterations, **kw)(fn)

    return deco


@_ck(asset="sampled_workflows", description="Every training query has exactly m sampled workflows (m per "
                                            "refinement turn; plus the prompt's workflows with generator.anchors).")
def m_workflows_per_query(sampled_workflows: pl.DataFrame, pipeline: PipelineResource) -> dg.AssetCheckResult:
    cfg = pipeline.config()
    m, d = cfg.curation.m * cfg.refinement.turns + anchors_per_query(cfg), cfg.benchmark.train_queries
    counts = sampled_workflows.group_by("query_id").len()
    wrong = counts.filter(pl.col("len") != m)
    queries = counts.height
    passed = wrong.height == 0 and queries == d
    return dg.AssetCheckResult(
        passed=passed,
        description=None if passed else f"{wrong.height} queries without exactly m={m} workflows; {queries}/{d} queries",
        metadata={"m": m, "queries": queries, "expected_queries": d,
                  "wrong_queries": dg.MetadataValue.json(wrong.rows()[:10])},
    )


@_ck(asset="execution_scores", additional_ins={"sampled": dg.AssetIn("sampled_workflows")},
     description="One score in [0, 1] per sampled workflow; every non-ok status carries its reason.")
def scores_complete(execution_scores: pl.DataFrame, sampled: pl.DataFrame) -> dg.AssetCheckResult:
    key = ["iteration", "query_id", "sample_idx"]
    missing = sampled.select(key).join(execution_scores.select(key), on=key, how="anti").height
    extra = execution_scores.select(key).join(sampled.select(key), on=key, how="anti").height
    dup = execution_scores.height - execution_scores.select(key).unique().height
    bad_score = execution_scores.filter(
        pl.col("score").is_null() | pl.col("score").is_nan() | (pl.col("score") < 0) | (pl.col("score") > 1)).height
    unexplained = execution_scores.filter((pl.col("status") != "ok") & (pl.col("error").fill_null("") == "")).height
    passed = missing == extra == dup == bad_score == unexplained == 0
    return dg.AssetCheckResult(
        passed=passed,
        metadata={"missing_scores": missing, "unexpected_rows": extra, "duplicate_rows": dup,
                  "scores_out_of_range": bad_score, "failures_without_reason": unexplained},
    )


@_ck(asset="execution_scores", description="The executor_error share of the executed workflows (parse rejections "
                                           "never call the executor) stays under "
                                           "execution.max_executor_error_rate.")
def executor_error_rate(execution_scores: pl.DataFrame, pipeline: PipelineResource) -> dg.AssetCheckResult:
    limit = pipeline.config().execution.max_executor_error_rate
    errors, executed, rate = executed_error_share(execution_scores)
    return dg.AssetCheckResult(passed=errors == 0 or rate <= limit,
                               metadata={"executor_errors": errors, "executed_workflows": executed,
                                         "workflows": execution_scores.height, "rate": round(rate, 4),
                                         "threshold": limit})


@_ck(asset="execution_scores", description="No run tripped a bug of spogw-dagster while serving an operator.")
def no_internal_errors(execution_scores: pl.DataFrame) -> dg.AssetCheckResult:
    hit = internal_error_rows(execution_scores)
    return dg.AssetCheckResult(
        passed=hit.height == 0, severity=dg.AssetCheckSeverity.WARN,
        description=None if hit.height == 0 else (
            f"{hit.height} run(s) hit an internal error (scored as the workflow's runtime_error, so no workflow "
            f"can hide behind it); first: {hit['error'][0][:300]}. Please report it with the workflow "
            f"(query {hit['query_id'][0]}, sample {hit['sample_idx'][0]})."),
        metadata={"internal_errors": hit.height},
    )


@_ck(asset="screened_groups", description="At least one group survived screening.")
def groups_kept(screened_groups: pl.DataFrame) -> dg.AssetCheckResult:
    kept = screened_groups.filter(pl.col("kept")).height
    reasons = screened_groups.filter(~pl.col("kept"))["reason"].value_counts().rows()
    return dg.AssetCheckResult(
        passed=kept > 0, severity=dg.AssetCheckSeverity.WARN,
        description=None if kept else "no group survived screening: this iteration trains nothing and carries its "
                                      "parent policy forward",
        metadata={"groups_kept": kept, "dropped": dg.MetadataValue.json(dict(reasons))},
    )


@_ck(asset="lora_checkpoint", blocking=True,
     description="Training losses are finite and the saved adapter reloads with peft (hash unchanged).")
def loss_finite_and_adapter_reloads(lora_checkpoint: pl.DataFrame, pipeline: PipelineResource) -> dg.AssetCheckResult:
    row = lora_checkpoint.row(0, named=True)
    losses = list(row["loss_curve"] or [])
    finite = all(math.isfinite(x) for x in losses)
    path = pipeline.store().adapter_dir(iteration_key(row["iteration"]))  # this assets directory's
    reloads, error = False, ""
    try:
        model, _ = load_model_and_tokenizer(pipeline.config().generator.model, adapter_path=path)
        n_lora = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
        reloads = n_lora > 0
        if not reloads:
            error = "the reloaded model has no LoRA parameters"
        del model
    except Exception as e:  # the check reports, it does not crash
        error = f"{type(e).__name__}: {e}"
    same_hash = path.is_dir() and adapter_sha256(path) == row["adapter_sha256"]
    passed = finite and reloads and same_hash
    return dg.AssetCheckResult(
        passed=passed,
        description=error or None,
        metadata={"losses": len(losses), "all_finite": finite, "reloads": reloads, "hash_matches": same_hash,
                  "trained": bool(row["trained"])},
    )


@_ck(asset="benchmark_report",
     description="The report compares checkpoint k with π_{k-1} on the same queries and seeds, and its answer score "
                 "did not fall by more than report.max_regression (paired difference, sampled mode when present).")
def compared_with_previous(benchmark_report: pl.DataFrame, pipeline: PipelineResource) -> dg.AssetCheckResult:
    tol = pipeline.config().report.max_regression
    kinds = set(benchmark_report["kind"].to_list()) if "kind" in benchmark_report.columns else set()
    ans = report_stats.metric_row(benchmark_report, "checkpoint", "answer_score") if "metric" in benchmark_report.columns \
        else None
    if ans is None or "previous" not in kinds or ans["diff_vs_prev"] is None:
        return dg.AssetCheckResult(passed=False, description="the report lacks its checkpoint or previous rows, "
                                   "or their paired difference", metadata={"kinds": sorted(kinds)})
    prev = report_stats.metric_row(benchmark_report, "previous", "answer_score", ans["mode"])
    diffs = {}
    for metric in report_stats.CURVE_METRICS:
        r = report_stats.metric_row(benchmark_report, "checkpoint", metric, ans["mode"])
        if r is not None and r["diff_vs_prev"] is not None:
            diffs[metric] = [round(r["diff_vs_prev"], 4), round(r["diff_ci_low"], 4), round(r["diff_ci_high"], 4)]
    baselines = benchmark_report.filter((pl.col("kind") == "baseline") & (pl.col("metric") == "answer_score"))
    return dg.AssetCheckResult(
        passed=ans["diff_vs_prev"] >= -tol, severity=dg.AssetCheckSeverity.WARN,
        metadata={"this": ans["system"], "previous": prev["system"] if prev else None, "mode": ans["mode"],
                  "answer_score": round(ans["value"], 4),
                  "previous_answer_score": round(prev["value"], 4) if prev else None,
                  "delta": round(ans["diff_vs_prev"], 4),
                  "delta_ci95": dg.MetadataValue.json([round(ans["diff_ci_low"], 4), round(ans["diff_ci_high"], 4)]),
                  "max_regression": tol, "paired_differences": dg.MetadataValue.json(diffs),
                  "baselines": dg.MetadataValue.json({f"{r['system']} ({r['mode']})": round(r["value"], 4)
                                                      for r in baselines.iter_rows(named=True)})},
    )


ALL_CHECKS = [m_workflows_per_query, scores_complete, executor_error_rate, no_internal_errors, groups_kept,
              loss_finite_and_adapter_reloads, compared_with_previous]
