"""The benchmark report's metadata: the table, headline numbers with intervals, the split used, and the
learning curve over every stored report on the same split (a plot in the UI)."""

from __future__ import annotations

from typing import Any

import dagster as dg
import polars as pl

from spogw_dagster.pipeline.data import report_stats
from spogw_dagster.pipeline.data.storage import AssetStore
from spogw_dagster.pipeline.defs.plots import learning_curve_plot, pareto_plot

HEADLINE_METRICS = ("valid_rate", "executes_rate", "mean_reward", "answer_score", "trivial_rate")


def report_metadata(store: AssetStore, key: str, report: pl.DataFrame, split_info: dict[str, Any], prev_system: str,
                    prev_reused: bool) -> dict[str, Any]:
    return {
        "report": dg.MetadataValue.md(report_stats.report_table_text(report)),
        "split": dg.MetadataValue.json(split_info),
        "split_ids_sha256": dg.MetadataValue.text(split_info["ids_sha256"]),
        "previous_system": dg.MetadataValue.text(prev_system),
        "previous_reused_from_report": dg.MetadataValue.bool(prev_reused),
        "heldout_queries": dg.MetadataValue.int(split_info["queries"]),
        **headline_metadata(report),
        **learning_curve_metadata(store, key, report, split_info["split"]),
    }


def headline_metadata(report: pl.DataFrame) -> dict[str, Any]:
    """Each headline metric of the checkpoint, its 95% interval and its paired difference to π_{k-1}."""
    md: dict[str, Any] = {}
    for metric in HEADLINE_METRICS:
        r = report_stats.metric_row(report, "checkpoint", metric)
        if r is None:
            continue
        md[metric] = dg.MetadataValue.float(round(r["value"], 4))
        md[f"{metric}_ci95"] = dg.MetadataValue.json([round(r["ci_low"], 4), round(r["ci_high"], 4)])
        if r["diff_vs_prev"] is not None:
            md[f"{metric}_diff_vs_previous"] = dg.MetadataValue.json(
                [round(r["diff_vs_prev"], 4), round(r["diff_ci_low"], 4), round(r["diff_ci_high"], 4)])
    return md


def learning_curve_metadata(store: AssetStore, key: str, report: pl.DataFrame, split: str) -> dict[str, Any]:
    """The curve over all materialized iterations: stored reports of other partitions plus this one."""

    others = [store.read_parquet("benchmark_report", p) for p in store.partitions("benchmark_report") if p != key]
    # reports written before the long format, or on another split, are not on this curve
    others = [o for o in others if "metric" in o.columns and set(o["split"].to_list()) == {split}]
    allrep = pl.concat([*others, report], how="diagonal_relaxed")
    base = report.filter((pl.col("kind") == "baseline") & (pl.col("mode") == "greedy"))
    lines: dict[str, dict[str, float]] = {}
    for r in base.iter_rows(named=True):
        lines.setdefault(r["metric"], {})[r["system"]] = r["value"]
    return {
        "learning_curve": dg.MetadataValue.md(learning_curve_plot(report_stats.learning_curve(allrep), baselines=lines)),
        "iterations_in_curve": dg.MetadataValue.int(allrep["iteration"].n_unique()),
    }


def pareto_metadata(heldout: pl.DataFrame) -> dict[str, Any]:
    """Answer score against executor calls per query for every system this report scored greedily (the
    checkpoint, π_{k-1} and each static baseline): a table with the frontier marked, and its plot."""
    t = report_stats.pareto_table(heldout)
    if t.height == 0:
        return {}
    return {"pareto": dg.MetadataValue.md(report_stats.pareto_text(t)),
            "pareto_plot": dg.MetadataValue.md(pareto_plot(t["system"].to_list(), t["answer_score"].to_list(),
                                                           t["calls_per_query"].to_list(), t["on_frontier"].to_list()))}
