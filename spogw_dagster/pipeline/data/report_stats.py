"""The held-out report's statistics (no Dagster, no model): the metrics, their intervals and paired
differences over heldout_results rows, the long-format report, its text tables and the learning curve."""

from __future__ import annotations

import math
from typing import Any, Sequence

import polars as pl

from spogw_dagster.contracts import Status
from spogw_dagster.core import stats
from spogw_dagster.pipeline.data.tables import HELDOUT_SCHEMA, KIND_ORDER, REPORT_SCHEMA, relabel, typed_frame
from spogw_dagster.workflow.copies import distinct_count

# metric -> heldout column; rates get (design-effect) Wilson intervals, means a query bootstrap
RATE_METRICS = {"valid_rate": "valid", "executes_rate": "executes", "trivial_rate": "trivial",
                "near_copy_rate": "near_copy", "workflow_answer_rate": "workflow_answer"}
MEAN_METRICS = {"answer_score": "answer_score", "mean_reward": "reward"}
# the headline: the benchmark's own metric (pass@1 / exact answer); the others are diagnostics
HEADLINE_METRIC = "answer_score"
# objective_comparison's test_role: a member of the Holm family (the headline) or a diagnostic (unadjusted p)
TEST_HEADLINE, TEST_DIAGNOSTIC = "headline", "diagnostic"
COST_METRICS = {"executor_calls": "llm_calls", "cached_calls": "cached_calls", "prompt_tokens": "prompt_tokens",
                "completion_tokens": "completion_tokens"}
METRICS = ("answer_score", *RATE_METRICS, "mean_reward", "distinct_per_query", "executor_errors", *COST_METRICS)


def _complete(rows: pl.DataFrame, col: str) -> bool:
    """Whether every row has `col`: rows written before a metric existed lack it (absent, or null where
    partitions of both kinds were concatenated), and that metric is then left out, not guessed."""
    return col in rows.columns and rows[col].null_count() == 0


def _per_query(rows: pl.DataFrame, col: str) -> list[list[float]]:
    g = rows.group_by("query_id", maintain_order=True).agg(pl.col(col).cast(pl.Float64()).alias("v"))
    return [list(v) for v in g.sort("query_id")["v"].to_list()]


def paired_per_query(rows: pl.DataFrame, prev: pl.DataFrame, col: str) -> tuple[list[list[float]], list[list[float]]]:
    """Per-query lists of (this, previous) values over samples present in both, matched on (query, sample)."""
    j = rows.select("query_id", "sample_idx", pl.col(col).cast(pl.Float64()).alias("a")).join(
        prev.select("query_id", "sample_idx", pl.col(col).cast(pl.Float64()).alias("b")),
        on=["query_id", "sample_idx"], how="inner").sort(["query_id", "sample_idx"])
    g = j.group_by("query_id", maintain_order=True).agg("a", "b")
    return [list(x) for x in g["a"].to_list()], [list(x) for x in g["b"].to_list()]


def summarize_heldout(heldout: pl.DataFrame, *, iteration: int, config_hash: str, split_ids_sha256: str,
                      resamples: int = 2000, seed: int = 0) -> pl.DataFrame:
    """The long-format report: one row per (system, mode, metric) with its 95% interval and, for systems
    other than π_{k-1}, the paired difference to π_{k-1} in the same mode with a paired bootstrap interval.

    Executor-error samples are our infrastructure failing, not the workflow: they are left out of every
    metric and pair (counted in `executor_errors`)."""

    out: list[dict[str, Any]] = []
    scored_all = heldout.filter(pl.col("status") != Status.EXECUTOR_ERROR.value)
    for (system, mode), rows in heldout.group_by(["system", "mode"], maintain_order=True):
        first = rows.row(0, named=True)
        scored = rows.filter(pl.col("status") != Status.EXECUTOR_ERROR.value)
        prev = scored_all.filter((pl.col("kind") == "previous") & (pl.col("mode") == mode))
        has_prev = first["kind"] != "previous" and prev.height > 0
        base = {"iteration": iteration, "split": first["split"], "system": system, "kind": first["kind"],
                "mode": mode, "n": scored.height, "n_queries": scored["query_id"].n_unique(),
                "checkpoint_iteration": first["checkpoint_iteration"], "adapter_sha256": first["adapter_sha256"],
                "config_hash": config_hash, "split_ids_sha256": split_ids_sha256}
        for metric, col in {**RATE_METRICS, **MEAN_METRICS}.items():
            if not _complete(scored, col):
                continue
            clusters = _per_query(scored, col)
            if metric in RATE_METRICS:
                v, lo, hi, _ = stats.clustered_wilson(clusters)
                method = "wilson" if all(len(c) == 1 for c in clusters) else "wilson_deff"
            else:
                v, lo, hi = stats.cluster_bootstrap_mean(clusters, resamples=resamples, seed=seed)
                method = "cluster_bootstrap"
            row = {**base, "metric": metric, "value": v, "ci_low": lo, "ci_high": hi, "ci_method": method}
            if has_prev and _complete(prev, col):
                a, b = paired_per_query(scored, prev, col)
                if a:
                    d, dlo, dhi = stats.paired_bootstrap_diff(a, b, resamples=resamples, seed=seed)
                    row.update(diff_vs_prev=d, diff_ci_low=dlo, diff_ci_high=dhi, n_pairs=sum(map(len, a)))
            out.append(row)
        out.append({**base, "metric": "distinct_per_query", "value": distinct_per_query(rows), "ci_method": "none"})
        out.append({**base, "metric": "executor_errors", "value": float(rows.height - scored.height),
                    "ci_method": "none"})
        for metric, col in COST_METRICS.items():
            out.append({**base, "metric": metric, "value": float(rows[col].sum()), "ci_method": "none"})
    return report_frame(out)


def distinct_per_query(rows: pl.DataFrame) -> float | None:
    """Mean over queries of how many different valid workflows (names and layout normalised) were written."""

    valid = rows.filter(pl.col("valid"))
    if valid.height == 0:
        return 0.0
    per_q = valid.group_by("query_id").agg(pl.col("workflow"))["workflow"].to_list()
    return sum(distinct_count(list(w)) for w in per_q) / rows["query_id"].n_unique()


def report_frame(rows: Sequence[dict[str, Any]]) -> pl.DataFrame:
    order = {m: i for i, m in enumerate(METRICS)}
    rows = sorted(rows, key=lambda r: (KIND_ORDER.get(r["kind"], 9), r["system"], r["mode"],
                                       order.get(r["metric"], 99)))
    return typed_frame(list(rows), REPORT_SCHEMA)


def metric_row(report: pl.DataFrame, kind: str, metric: str, mode: str | None = None) -> dict[str, Any] | None:
    """The row of `metric` for the (first) system of `kind`, in `mode` (default: sampled if present)."""
    rows = report.filter((pl.col("kind") == kind) & (pl.col("metric") == metric))
    if mode is None:
        mode = "sampled" if rows.filter(pl.col("mode") == "sampled").height else "greedy"
    rows = rows.filter(pl.col("mode") == mode)
    return rows.row(0, named=True) if rows.height else None


def reusable_previous(prev_report: pl.DataFrame | None, prev_heldout: pl.DataFrame | None, system: str,
                      adapter_sha256: str, config_hash: str, iteration: int, expected_rows: int) -> pl.DataFrame | None:
    """Held-out rows of `system` (checkpoint k-1) from report k-1, relabelled to `iteration` as the previous
    system, when they were made with the same config and adapter (the seeds do not depend on k, so
    generating them again would give the same rows); else None."""
    if prev_report is None or prev_heldout is None or "metric" not in prev_report.columns:
        return None
    row = prev_report.filter((pl.col("kind") == "checkpoint") & (pl.col("system") == system))
    if row.height == 0:
        return None
    r = row.row(0, named=True)
    if r["adapter_sha256"] != adapter_sha256 or r["config_hash"] != config_hash:
        return None
    rows = prev_heldout.filter(pl.col("system") == system)
    if rows.height != expected_rows or set(HELDOUT_SCHEMA) - set(rows.columns):  # older rows lack new columns
        return None
    return relabel(rows, iteration, "previous")


def _ci(v: float | None, lo: float | None, hi: float | None, signed: bool = False) -> str:
    if v is None:
        return "-"
    f = "+.3f" if signed else ".3f"
    return f"{v:{f}} [{lo:{f}}, {hi:{f}}]" if lo is not None else f"{v:{f}}"


# the answer score first: it is the measure; the rest say why it moved (or did not)
CURVE_METRICS = ("answer_score", "valid_rate", "executes_rate", "trivial_rate", "near_copy_rate",
                 "workflow_answer_rate", "mean_reward", "distinct_per_query")


def report_table_text(report: pl.DataFrame) -> str:
    """Markdown: per system and mode the metrics with 95% intervals, then the paired differences."""
    head = "| system | mode | n | " + " | ".join(CURVE_METRICS) + " | executor calls (cached) |"
    lines = [head, "|" + "---|" * (len(CURVE_METRICS) + 4)]
    diffs = []
    for (system, mode), g in report.group_by(["system", "mode"], maintain_order=True):
        m = {r["metric"]: r for r in g.iter_rows(named=True)}
        cells = [_ci(m[x]["value"], m[x]["ci_low"], m[x]["ci_high"]) if x in m else "-" for x in CURVE_METRICS]
        calls = f"{int(m['executor_calls']['value'])} ({int(m['cached_calls']['value'])})" if "executor_calls" in m else "-"
        n = m.get("valid_rate", {}).get("n", "-")
        lines.append(f"| {system} | {mode} | {n} | " + " | ".join(cells) + f" | {calls} |")
        if any(m[x]["diff_vs_prev"] is not None for x in CURVE_METRICS if x in m):
            diffs.append(f"| {system} | {mode} | " + " | ".join(
                _ci(m[x]["diff_vs_prev"], m[x]["diff_ci_low"], m[x]["diff_ci_high"], True) if x in m else "-"
                for x in CURVE_METRICS) + " |")
    if diffs:
        lines += ["", "paired difference to π_{k-1} (same queries and seeds; bootstrap over queries, 95%)", "",
                  "| system | mode | " + " | ".join(CURVE_METRICS) + " |", "|" + "---|" * (len(CURVE_METRICS) + 2)]
        lines += diffs
    return "\n".join(lines)


def learning_curve(reports: pl.DataFrame) -> pl.DataFrame:
    """Checkpoint rows of every iteration plus the base model (π_{-1}, the previous system of iteration 0) as
    step -1: what the learning-curve plot and `spogw run`'s table read."""
    ck = reports.filter(pl.col("kind") == "checkpoint").with_columns(pl.col("iteration").alias("step"))
    base = reports.filter((pl.col("kind") == "previous") & (pl.col("system") == "base")
                          & (pl.col("iteration") == reports["iteration"].min())) \
        .with_columns(pl.lit(-1, dtype=pl.Int64()).alias("step"))
    return pl.concat([base, ck], how="diagonal_relaxed").sort(["step", "mode", "metric"])


def curve_table_text(reports: pl.DataFrame) -> str:
    """`spogw run`'s final table: per iteration and system the held-out metrics with 95% intervals and the
    checkpoint's paired difference to π_{k-1}."""
    names = {"answer_score": "answer score", "valid_rate": "valid", "executes_rate": "executes",
             "near_copy_rate": "near copy", "workflow_answer_rate": "own answer", "mean_reward": "mean reward"}
    w = 26
    lines = [f"{'iter':>4}  {'system':<16} {'mode':<8}" + "".join(f"{v:>{w}}" for v in names.values())]
    order = pl.col("kind").replace_strict(KIND_ORDER, default=9)
    for (it, _, system, mode), g in reports.sort(["iteration", order, "system", "mode"]).group_by(
            ["iteration", order.alias("o"), "system", "mode"], maintain_order=True):
        m = {r["metric"]: r for r in g.iter_rows(named=True)}
        lines.append(f"{it:>4}  {system:<16} {mode:<8}" + "".join(
            f"{_ci(m[x]['value'], m[x]['ci_low'], m[x]['ci_high']) if x in m else '-':>{w}}" for x in names))
        if g["kind"][0] == "checkpoint" and any(m[x]["diff_vs_prev"] is not None for x in names if x in m):
            lines.append(f"{'':>4}  {'  Δ vs previous':<16} {mode:<8}" + "".join(
                f"{_ci(m[x]['diff_vs_prev'], m[x]['diff_ci_low'], m[x]['diff_ci_high'], True) if x in m else '-':>{w}}"
                for x in names))
    return "\n".join(lines)


def score_distribution(scores: Sequence[float], bins: int = 5) -> dict[str, int]:
    """Counts of scores in equal-width bins over [0, 1] (the last bin includes 1.0)."""
    out: dict[str, int] = {}
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        label = f"[{lo:.1f},{hi:.1f}{']' if b == bins - 1 else ')'}"
        out[label] = 0
    for s in scores:
        if s is None or (isinstance(s, float) and math.isnan(s)):
            continue
        b = min(bins - 1, max(0, int(float(s) * bins)))
        out[list(out)[b]] += 1
    return out


def paired_comparison(a: pl.DataFrame, b: pl.DataFrame, *, resamples: int = 2000, seed: int = 0,
                      generator_seeds: bool = True) -> list[dict[str, Any]]:
    """System A against system B on the same held-out queries and seeds: per mode and metric, both values and
    the mean paired difference A - B with a paired bootstrap 95% interval over queries.

    `a` and `b` are heldout_results rows of one system each. Samples pair on (mode, query_id, sample_idx);
    a pair whose sampler or executor seeds differ is not a pair, and is an error (the comparison would be
    between different draws). `generator_seeds=False` pairs a policy with a static baseline, which has no
    generator: then only the executor seeds must agree. Executor-error samples are left out, as in the report."""

    key = ["mode", "query_id", "sample_idx"]
    ok = pl.col("status") != Status.EXECUTOR_ERROR.value
    metrics = {m: c for m, c in {**RATE_METRICS, **MEAN_METRICS}.items() if _complete(a, c) and _complete(b, c)}
    cols = key + ["seed", "exec_seed", *metrics.values()]
    j = a.filter(ok).select(cols).join(b.filter(ok).select(cols), on=key, how="inner", suffix="_b")
    differs = pl.col("exec_seed") != pl.col("exec_seed_b")
    if generator_seeds:
        differs = differs | (pl.col("seed").fill_null(-1) != pl.col("seed_b").fill_null(-1))
    bad = j.filter(differs)
    if bad.height:
        r = bad.row(0, named=True)
        raise ValueError(f"{bad.height} samples have different seeds in the two systems (first: {r['mode']} "
                         f"{r['query_id']} #{r['sample_idx']}): they are not paired; compare systems scored with "
                         "the same report seed and sample count")
    out = []
    for mode in sorted(j["mode"].unique().to_list()):
        m = j.filter(pl.col("mode") == mode).sort(["query_id", "sample_idx"])
        g = m.group_by("query_id", maintain_order=True)
        for metric, col in metrics.items():
            per_q = g.agg(pl.col(col).cast(pl.Float64()).alias("a"), pl.col(f"{col}_b").cast(pl.Float64()).alias("b"))
            xa, xb = [list(x) for x in per_q["a"].to_list()], [list(x) for x in per_q["b"].to_list()]
            d, lo, hi = stats.paired_bootstrap_diff(xa, xb, resamples=resamples, seed=seed)
            n = sum(map(len, xa))
            out.append({"mode": mode, "metric": metric, "a": sum(map(sum, xa)) / n, "b": sum(map(sum, xb)) / n,
                        "diff": d, "diff_ci_low": lo, "diff_ci_high": hi, "n_pairs": n, "n_queries": len(xa)})
    return out


def system_rows(heldout: pl.DataFrame, system: str) -> pl.DataFrame:
    """The held-out rows of `system` from the first report partition that scored it (a policy reused as
    π_{k-1} by the next report carries the same rows)."""
    rows = heldout.filter(pl.col("system") == system)
    if rows.height == 0:
        known = ", ".join(sorted(heldout["system"].unique().to_list())) or "(none)"
        raise ValueError(f"no held-out results for system {system!r}; systems in heldout_results: {known}")
    first = rows["iteration"].min()
    return rows.filter(pl.col("iteration") == first)


def comparison_cells(table: pl.DataFrame, metrics: Sequence[str]) -> tuple[str, list[dict[str, str]]]:
    """objective_comparison's table as printed (the asset's Markdown and `spogw compare`'s text share it): a
    sentence on the Holm family, and one row of text cells per (metric, mode, method) of `metrics`: method,
    mode, metric, value (its 95% interval), diff (Δ vs the reference, 95%), holm (the Holm interval), p."""
    ref = table["reference"][0] if table.height else ""
    fam = table["family_size"].max() if "family_size" in table.columns else None
    big_b = table.filter(pl.col("family_size").is_not_null())["p_resamples"].max() if fam else None
    note = (f"Holm: family-wise error 0.05 over the {fam or 0} answer-score differences of the trained methods to "
            f"{ref} ({big_b or 0} bootstrap resamples); the Holm interval is at the level of the difference's rank, "
            "p its Holm-adjusted p-value; the other metrics are diagnostics: p unadjusted, not a finding.")
    rows = []
    for r in table.filter(pl.col("metric").is_in(list(metrics))).sort(["metric", "mode", "method"]).iter_rows(named=True):
        diff = holm = p = ""
        if r["diff_vs_reference"] is not None:
            diff = f"{r['diff_vs_reference']:+.3f} [{r['diff_ci_low']:+.3f}, {r['diff_ci_high']:+.3f}]"
            if r.get("p_holm") is not None:
                holm = f"[{r['holm_ci_low']:+.3f}, {r['holm_ci_high']:+.3f}]"
            p = p_label(r)
        rows.append({"method": r["method"], "mode": r["mode"], "metric": r["metric"],
                     "value": f"{r['value']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}]",
                     "diff": diff, "holm": holm, "p": p})
    return note, rows


def p_label(row: dict[str, Any]) -> str:
    """A comparison row's p-value as printed: Holm-adjusted for a member of the headline family, unadjusted and
    labelled for a diagnostic, "" for a row without a test (`test_role`)."""
    if row.get("test_role") == TEST_HEADLINE and row.get("p_holm") is not None:
        return f"{row['p_holm']:.3f} (Holm)"
    if row.get("test_role") == TEST_DIAGNOSTIC and row.get("p_value") is not None:
        return f"{row['p_value']:.3f} (diagnostic, unadjusted)"
    return ""


PARETO_SCHEMA: dict[str, pl.DataType] = {"system": pl.String(), "kind": pl.String(), "answer_score": pl.Float64(),
                                         "calls_per_query": pl.Float64(), "n_queries": pl.Int64(),
                                         "on_frontier": pl.Boolean()}


def pareto_table(heldout: pl.DataFrame, mode: str = "greedy") -> pl.DataFrame:
    """The answer score against its cost, per system of one report (`mode` rows, executor errors left out): the
    mean answer score and the mean executor calls per query, and whether the system is on the Pareto frontier
    (no other system answers at least as well with at most as many calls, and better in one of the two).
    Sorted by calls per query."""
    rows = heldout.filter((pl.col("mode") == mode) & (pl.col("status") != Status.EXECUTOR_ERROR.value))
    if rows.height == 0:
        return pl.DataFrame(schema=PARETO_SCHEMA)
    per = (rows.group_by(["system", "kind"])
           .agg(pl.col("answer_score").mean(), pl.col("llm_calls").sum(), pl.col("query_id").n_unique().alias("n_queries"))
           .with_columns((pl.col("llm_calls") / pl.col("n_queries")).alias("calls_per_query"))
           .drop("llm_calls").sort(["calls_per_query", "system"]))
    pts = list(zip(per["answer_score"].to_list(), per["calls_per_query"].to_list()))
    front = [not any(a2 >= a and c2 <= c and (a2 > a or c2 < c) for a2, c2 in pts) for a, c in pts]
    return per.with_columns(pl.Series("on_frontier", front, dtype=pl.Boolean())).cast(PARETO_SCHEMA)  # type: ignore[arg-type]


def pareto_text(table: pl.DataFrame) -> str:
    lines = ["| system | answer score | executor calls / query | on the frontier |", "|---|---|---|---|"]
    for r in table.iter_rows(named=True):
        lines.append(f"| {r['system']} | {r['answer_score']:.3f} | {r['calls_per_query']:.2f} | "
                     f"{'yes' if r['on_frontier'] else ''} |")
    return "\n".join(lines)
