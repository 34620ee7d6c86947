"""The comparison's table and its statistics: the report's long format over the methods, with each method's
paired difference to the reference method, what it trained on, and family-wise error control (Holm) over the
headline family. Pure frames in, frames out: `objective_comparison` calls it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from spogw_dagster.contracts import Status
from spogw_dagster.core import stats
from spogw_dagster.pipeline.data import report_stats


@dataclass
class MethodRun:
    method: str
    objective: str
    adapter: Path
    adapter_sha256: str
    n_examples: int
    examples_sha256: str
    seed: int
    train_seconds: float | None
    reused: str  # "" | "lora_checkpoint" (the loop's own checkpoint k: same config and data)
    rows_sha256: str = ""  # the candidate rows it started from: the loop's, or its own (ScoreFlow's scoring)


def comparison_frame(heldout: pl.DataFrame, runs: list[MethodRun], *, reference: str, iteration: int,
                     parent_sha256: str | None, config_hash: str, split_ids_sha256: str,
                     resamples: int, seed: int) -> pl.DataFrame:
    """The report's long format over methods (the reference labelled as the report's "previous", so each other
    system's diff is its paired difference to the reference), with what each method trained on."""
    labelled = heldout.with_columns(
        pl.when(pl.col("system") == reference).then(pl.lit("previous")).otherwise(pl.col("kind")).alias("kind"))
    rep = report_stats.summarize_heldout(labelled, iteration=iteration, config_hash=config_hash,
                                   split_ids_sha256=split_ids_sha256, resamples=resamples, seed=seed)
    rep = rep.with_columns(
        pl.when(pl.col("system") == reference).then(pl.lit("method")).otherwise(pl.col("kind")).alias("kind"),
        pl.lit(reference).alias("reference"))
    info = pl.DataFrame([{"system": r.method, "objective": r.objective, "n_examples": r.n_examples,
                          "examples_sha256": r.examples_sha256, "seed": r.seed, "train_seconds": r.train_seconds,
                          "reused": r.reused, "rows_sha256": r.rows_sha256 or None} for r in runs],
                        schema={"system": pl.String(), "objective": pl.String(), "n_examples": pl.Int64(),
                                "examples_sha256": pl.String(), "seed": pl.Int64(), "train_seconds": pl.Float64(),
                                "reused": pl.String(), "rows_sha256": pl.String()})
    out = (rep.rename({"system": "method", "diff_vs_prev": "diff_vs_reference"})
           .join(info.rename({"system": "method"}), on="method", how="left")
           .with_columns(pl.when(pl.col("kind") == "baseline").then(None).otherwise(pl.lit(parent_sha256))
                         .alias("parent_adapter_sha256")))
    return with_holm(out, labelled, reference=reference, resamples=resamples, seed=seed)


HOLM_COLUMNS = {"p_value": pl.Float64(), "p_holm": pl.Float64(), "holm_level": pl.Float64(),
                "holm_ci_low": pl.Float64(), "holm_ci_high": pl.Float64(), "family_size": pl.Int64(),
                "p_resamples": pl.Int64(), "test_role": pl.String()}
# The headline family: the benchmark's own metric (the answer score) of the trained methods, each in each mode,
# against the reference; Holm controls the family-wise error over it alone. The other metrics (validity,
# executes, trivial rates, reward) are diagnostics: an unadjusted p-value, no correction, labelled
# test_role = "diagnostic", never in the family, so they neither dilute the answer's test nor count as findings.
# The family's B is chosen so that Holm's first step can reject: a bootstrap p is at least 2/(B + 1) (two-sided;
# about 1/(B + 1) a side), so B = max(report.bootstrap_resamples, ⌈10·m/α⌉) (`stats.resamples_for_family`) puts
# the smallest attainable p near a fifth of α/m. E.g. the default methods (spogw, grpo, score_dpo, rwr) in two
# modes: m = 3 × 2 = 6, B = max(2000, 1200) = 2000, 2/2001 ≈ 0.0010 < 0.05/6 ≈ 0.0083. The family before issue
# 38 (every method × mode × metric, 72 members at B = 2000) could not reject anything: 2/2001 > 0.05/72.
FAMILY_METRIC = report_stats.HEADLINE_METRIC
HEADLINE, DIAGNOSTIC = report_stats.TEST_HEADLINE, report_stats.TEST_DIAGNOSTIC


def with_holm(table: pl.DataFrame, heldout: pl.DataFrame, *, reference: str, resamples: int, seed: int,
              alpha: float = 0.05) -> pl.DataFrame:
    """Paired-bootstrap p-values of every trained method's difference to the reference, and family-wise error
    control over the headline family: the answer score (`FAMILY_METRIC`) of each trained method in each mode
    (the static baselines' rows are context, not members). A family member gets its two-sided p-value
    (`stats.paired_bootstrap_p`, never 0), its Holm-adjusted p-value and its interval at Holm's level for its
    rank (`core.stats.holm_levels`), all with B = `stats.resamples_for_family(m, resamples)` so that the
    smallest attainable p is below α/m (with 2000 resamples and a family of 72 no difference could ever be
    significant). Diagnostics (every other metric) get an unadjusted p-value at `resamples` and no Holm
    columns; `test_role` says which a row is ("headline" or "diagnostic"; null: not tested). A member is
    significant under Holm when p_holm < α. `heldout`: the held-out rows with the reference labelled kind
    "previous"."""

    scored = heldout.filter(pl.col("status") != Status.EXECUTOR_ERROR.value)
    cols = {**report_stats.RATE_METRICS, **report_stats.MEAN_METRICS}
    rows = table.with_row_index("_i")
    tested = rows.filter(pl.col("diff_vs_reference").is_not_null() & pl.col("metric").is_in(list(cols))
                         & (pl.col("kind") == "method"))
    members, diagnostics = [], []
    for r in tested.iter_rows(named=True):
        mine = scored.filter((pl.col("system") == r["method"]) & (pl.col("mode") == r["mode"]))
        ref = scored.filter((pl.col("system") == reference) & (pl.col("mode") == r["mode"]))
        a, b = report_stats.paired_per_query(mine, ref, cols[r["metric"]])
        if not all(v is not None and math.isfinite(v) for x in (*a, *b) for v in x):
            continue  # a metric some rows lack (older partitions): no difference, not tested
        (members if r["metric"] == FAMILY_METRIC else diagnostics).append((r, a, b))
    add: dict[str, list] = {c: [None] * table.height for c in HOLM_COLUMNS}
    for r, a, b in diagnostics:
        add["p_value"][r["_i"]] = stats.paired_bootstrap_p(a, b, resamples=resamples, seed=seed)
        add["p_resamples"][r["_i"]] = resamples
        add["test_role"][r["_i"]] = DIAGNOSTIC
    big_b = stats.resamples_for_family(len(members), resamples, alpha)
    ps = [stats.paired_bootstrap_p(a, b, resamples=big_b, seed=seed) for _, a, b in members]
    adj, levels = stats.holm(ps), stats.holm_levels(ps, alpha)
    for (r, a, b), p, q, lv in zip(members, ps, adj, levels):
        _, lo, hi = stats.paired_bootstrap_diff(a, b, resamples=big_b, seed=seed, level=lv)
        for c, v in (("p_value", p), ("p_holm", q), ("holm_level", lv), ("holm_ci_low", lo), ("holm_ci_high", hi),
                     ("family_size", len(ps)), ("p_resamples", big_b), ("test_role", HEADLINE)):
            add[c][r["_i"]] = v
    return table.with_columns(*[pl.Series(c, add[c], dtype=t) for c, t in HOLM_COLUMNS.items()])
