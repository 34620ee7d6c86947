"""The headline: the benchmark's own answer score of the last checkpoint against the base generator and against
the best static baseline, paired on the same held-out queries and seeds; and the same over training seeds.

Every report scores its policies with the same sampler and executor seeds (they do not depend on the
iteration), so the base model's rows (π_{-1}, scored by report 0000) pair with the last checkpoint's. A static
baseline has no generator: it pairs with a policy on (query, executor seed) in greedy mode.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any, Sequence

import polars as pl

from spogw_dagster.contracts import Status
from spogw_dagster.pipeline.data import report_stats
from spogw_dagster.pipeline.data.iteration_keys import iteration_key
from spogw_dagster.pipeline.data.storage import AssetStore

METRIC = report_stats.HEADLINE_METRIC


def heldout_rows(store: AssetStore) -> pl.DataFrame | None:
    """Every partition's held-out rows (older partitions may lack newer columns: null there), or None."""
    parts = store.partitions("heldout_results")
    if not parts:
        return None
    return pl.concat([store.read_parquet("heldout_results", p) for p in parts], how="diagonal_relaxed")


def _last_checkpoint(heldout: pl.DataFrame) -> str | None:
    ck = heldout.filter(pl.col("kind") == "checkpoint")
    if ck.height == 0:
        return None
    return ck.sort(["iteration", "system"])["system"][-1]  # report k scores checkpoint k


def headline(store: AssetStore, resamples: int = 2000, seed: int = 0) -> list[dict[str, Any]]:
    """Rows (mode, against, this, other, diff, CI, pairs): the last checkpoint's answer score against the base
    generator (each mode) and against the best static baseline (greedy)."""
    heldout = heldout_rows(store)
    if heldout is None:
        return []
    this = _last_checkpoint(heldout)
    if this is None or heldout.filter(pl.col("system") == "base").height == 0:
        return []
    mine = report_stats.system_rows(heldout, this)
    out = []
    for r in report_stats.paired_comparison(mine, report_stats.system_rows(heldout, "base"), resamples=resamples, seed=seed):
        if r["metric"] == METRIC:
            out.append({"system": this, "against": "base", **r})
    best = best_baseline(heldout)
    if best is not None:
        for r in report_stats.paired_comparison(mine.filter(pl.col("mode") == "greedy"), report_stats.system_rows(heldout, best),
                                          resamples=resamples, seed=seed, generator_seeds=False):
            if r["metric"] == METRIC:
                out.append({"system": this, "against": best, **r})
    return out


def best_baseline(heldout: pl.DataFrame) -> str | None:
    """The static baseline with the highest greedy answer score (executor errors left out)."""
    b = heldout.filter((pl.col("kind") == "baseline") & (pl.col("mode") == "greedy")
                       & (pl.col("status") != Status.EXECUTOR_ERROR.value))
    if b.height == 0:
        return None
    means = b.group_by("system").agg(pl.col(METRIC).mean().alias("m")).sort(["m", "system"], descending=[True, False])
    return means["system"][0]


def headline_text(rows: Sequence[dict[str, Any]]) -> str:
    if not rows:
        return ""
    lines = [f"headline: held-out {METRIC} (the benchmark's metric), paired on the same queries and seeds "
             "(95% paired bootstrap over queries)"]
    for r in rows:
        lines.append(f"  {r['system']} vs {r['against']:<22} {r['mode']:<8} {r['a']:.3f} vs {r['b']:.3f}: "
                     f"Δ {r['diff']:+.3f} [{r['diff_ci_low']:+.3f}, {r['diff_ci_high']:+.3f}] "
                     f"over {r['n_pairs']} pairs, {r['n_queries']} queries")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# across training seeds


def seed_overrides(seed: int, shared_cache: Path) -> dict[str, Any]:
    """What one training seed changes: generator sampling, group sampling and the trainer (LoRA init, data
    order). The held-out seeds (report.seed) and the executor's seeds stay, so every seed's report scores the
    same queries with the same draws, and its base rows are the same; one call cache serves all seeds."""
    return {"generator": {"seed": seed}, "curation": {"seed": seed}, "training": {"seed": seed},
            "executor": {"cache_file": str(shared_cache)}}


def seed_table(per_seed: dict[int, list[dict[str, Any]]]) -> pl.DataFrame:
    """One row per (seed, against, mode) with the paired difference, then per (against, mode) the mean,
    standard deviation (n - 1), min and max of the difference over seeds ("seed" null)."""
    rows = [{"seed": s, "against": r["against"], "mode": r["mode"], "this": r["a"], "other": r["b"],
             "diff": r["diff"], "diff_ci_low": r["diff_ci_low"], "diff_ci_high": r["diff_ci_high"],
             "sd": None, "min": None, "max": None, "n_seeds": 1}
            for s, rs in sorted(per_seed.items()) for r in rs]
    out = list(rows)
    for key in sorted({(r["against"], r["mode"]) for r in rows}):
        ds = [r for r in rows if (r["against"], r["mode"]) == key]
        d = [r["diff"] for r in ds]
        out.append({"seed": None, "against": key[0], "mode": key[1],
                    "this": statistics.fmean(r["this"] for r in ds), "other": statistics.fmean(r["other"] for r in ds),
                    "diff": statistics.fmean(d), "diff_ci_low": None, "diff_ci_high": None,
                    "sd": statistics.stdev(d) if len(d) > 1 else math.nan, "min": min(d), "max": max(d),
                    "n_seeds": len(d)})
    schema = {"seed": pl.Int64(), "against": pl.String(), "mode": pl.String(), "this": pl.Float64(),
              "other": pl.Float64(), "diff": pl.Float64(), "diff_ci_low": pl.Float64(), "diff_ci_high": pl.Float64(),
              "sd": pl.Float64(), "min": pl.Float64(), "max": pl.Float64(), "n_seeds": pl.Int64()}
    return pl.DataFrame(out, schema=schema)


def seed_table_text(t: pl.DataFrame) -> str:
    lines = [f"{METRIC} of the last checkpoint over training seeds (Δ: paired difference; per seed its 95% paired "
             "interval; across seeds mean, sd, min and max)"]
    for r in t.iter_rows(named=True):
        who = f"seed {r['seed']}" if r["seed"] is not None else f"mean of {r['n_seeds']}"
        tail = (f"[{r['diff_ci_low']:+.3f}, {r['diff_ci_high']:+.3f}]" if r["seed"] is not None else
                f"sd {r['sd']:.3f}, min {r['min']:+.3f}, max {r['max']:+.3f}")
        lines.append(f"  {who:<10} vs {r['against']:<22} {r['mode']:<8} {r['this']:.3f} vs {r['other']:.3f}: "
                     f"Δ {r['diff']:+.3f} {tail}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# every checkpoint of every seed (docs/results/headline.json)


def _greedy_diff(rows: list[dict[str, Any]]) -> dict[str, float] | None:
    r = next((r for r in rows if r["mode"] == "greedy" and r["metric"] == METRIC), None)
    return None if r is None else {"diff": round(r["diff"], 4), "low": round(r["diff_ci_low"], 4),
                                   "high": round(r["diff_ci_high"], 4), "other": round(r["b"], 4)}


def _carried_forward(store: AssetStore, iteration: int) -> bool | None:
    """Whether checkpoint `iteration` is its parent's policy carried forward (no training data, fewer than
    `training.min_queries` queries, or the validation gate kept the parent); None where the table is absent."""
    key = iteration_key(iteration)
    if not store.exists("lora_checkpoint", key):
        return None
    row = store.read_parquet("lora_checkpoint", key).row(0, named=True)
    return (not row["trained"]) or row.get("selected") is False


def checkpoint_rows(store: AssetStore, seed: int, reference: str = "baseline:io", resamples: int = 2000
                    ) -> list[dict[str, Any]]:
    """One row per checkpoint of a seed's run (iteration = its partition number from 0): its greedy answer
    score and executor calls per query on the held-out queries, and the paired difference (95% bootstrap over
    queries) to the base generator, to `reference` (a static baseline) and to the best static baseline the
    reports scored: {diff, low, high, other} with `other` that system's score on the same pairs (None where there
    is none to pair with); and whether the checkpoint is its parent carried forward (counted, not hidden)."""
    heldout = heldout_rows(store)
    if heldout is None:
        return []
    ok = pl.col("status") != Status.EXECUTOR_ERROR.value
    best = best_baseline(heldout)
    systems = sorted(set(heldout.filter(pl.col("kind") == "checkpoint")["system"].to_list()))
    have = set(heldout["system"].to_list())
    out = []
    for system in systems:
        mine = report_stats.system_rows(heldout, system).filter(pl.col("mode") == "greedy")
        greedy = mine.filter(ok)
        row: dict[str, Any] = {"seed": seed, "iteration": int(mine["checkpoint_iteration"].max()),
                               "system": system, "n_queries": greedy["query_id"].n_unique(),
                               "answer": round(float(greedy[METRIC].mean()), 4) if greedy.height else None,
                               "calls_per_query": round(float(greedy["llm_calls"].mean()), 3) if greedy.height else None}
        for label, other, gen_seeds in (("base", "base", True), ("io", reference, False),
                                        ("best_static", best, False)):
            cmp = []
            if other in have:
                cmp = report_stats.paired_comparison(mine, report_stats.system_rows(heldout, other),
                                                     resamples=resamples, seed=0, generator_seeds=gen_seeds)
            row[f"delta_vs_{label}"] = _greedy_diff(cmp)
        row["best_static"] = best
        row["carried_forward"] = _carried_forward(store, row["iteration"])
        out.append(row)
    return out
