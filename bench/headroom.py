"""The headroom table: static workflows side by side on the same queries, with the oracle (per query, the best of
the measured structures, at the calls of the cheapest one that reaches it) beside the best single structure.

From `spogw baseline --json` outputs (any split):

    for m in io gen_test sc3 sc3_test sc5 adaptive_sc3; do
      spogw baseline --benchmark humaneval --method $m --split validation --limit 16 \\
        --executor-model qwen2.5-coder-0.5b --concurrency 2 --json > headroom-$m.json
    done
    python bench/headroom.py headroom-io.json headroom-*.json
    python bench/headroom.py --first 16 train-io.json train-*.json   # only the first 16 queries of each

From a run's own assets (no executor call): the test split from `heldout_results` (every static baseline the
reports scored, greedy) and the train split from the anchors' rows of `execution_scores` (the prompt's own
workflows on the training queries, `generator.anchors`, each the mean of `execution.anchor_runs` runs):

    python bench/headroom.py --assets ~/runs/seeds/seed-0

Per method: pass@1 with its 95% Wilson interval, executor calls per query, and the paired difference to the
first method (the reference, IO) over the same queries with a bootstrap 95% interval over queries. Is there a
structure clearly above IO on this executor? If none is, no trained generator can find one. The oracle row is
the ceiling of choosing among these structures per query; the gap between it and the best single structure is
what a per-query choice (a trained generator) can add over the best static workflow.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# method -> query -> (score, executor calls or None where unknown)
Table = dict[str, dict[str, tuple[float, float | None]]]


def oracle(table: Table) -> dict[str, tuple[float, float | None]]:
    """Per query (those every method scored): the best score of any method, at the calls of the cheapest method
    that reaches it (None where a method reaching it has unknown calls)."""
    common = set.intersection(*(set(v) for v in table.values())) if table else set()
    out = {}
    for q in sorted(common):
        best = max(table[m][q][0] for m in table)
        calls = [table[m][q][1] for m in table if table[m][q][0] == best]
        out[q] = (best, None if any(c is None for c in calls) else min(calls))
    return out


def print_table(table: Table, title: str) -> None:
    from spogw_dagster.core import stats

    if not table:
        print(f"{title}: nothing scored")
        return
    ref_name = next(iter(table))
    ref = table[ref_name]
    rows = dict(table)
    rows["oracle"] = oracle(table)
    best = max((m for m in table), key=lambda m: sum(s for s, _ in table[m].values()) / max(1, len(table[m])))
    print(f"{title} (best single: {best})")
    print(f"{'method':<10} {'pass@1 [95% Wilson]':<24} {'calls/query':>11}  Δ vs {ref_name} (paired, 95%)")
    for name, scores in rows.items():
        if not scores:
            print(f"{name:<10} no scored query")
            continue
        common = [q for q in scores if q in ref]
        lo, hi = stats.wilson(sum(s for s, _ in scores.values()), len(scores))
        diff = ""
        if name != ref_name and common:
            m, dlo, dhi = stats.paired_bootstrap_diff([[scores[q][0]] for q in common], [[ref[q][0]] for q in common],
                                                      resamples=4000, seed=0)
            diff = f"{m:+.3f} [{dlo:+.3f}, {dhi:+.3f}] over {len(common)} queries"
        calls = [c for _, c in scores.values()]
        per_q = float("nan") if any(c is None for c in calls) else sum(calls) / len(calls)
        print(f"{name:<10} {sum(s for s, _ in scores.values()) / len(scores):.3f} [{lo:.3f}, {hi:.3f}]     "
              f"{per_q:>11.2f}  {diff}")


def from_json(files: list[str], first: int | None) -> Table:
    runs = []
    for f in dict.fromkeys(files):  # the reference first, each file once
        d = json.loads(Path(f).read_text())
        if "results" not in d:
            raise SystemExit(f"{f}: no per-query results; run `spogw baseline` with --json")
        runs.append(d)
    # with --first, only the first N of the reference's order (a run's train_queries = N)
    order = [r["query"] for r in runs[0]["results"]][:first] if first else None
    table: Table = {}
    for d in runs:
        # executor errors left out, as `spogw baseline` counts them; per-query calls where the JSON has them
        table[d["method"]] = {r["query"]: (r["score"], r.get("llm_calls")) for r in d["results"]
                              if (order is None or r["query"] in order) and r["status"] != "executor_error"}
    return table


def from_assets(root: Path) -> tuple[Table, Table]:
    """(test: every static baseline of the reports, greedy; train: the anchors' rows by their position)."""
    import polars as pl

    from spogw_dagster.pipeline.data.storage import AssetStore
    from spogw_dagster.pipeline.domain.headline import heldout_rows

    store = AssetStore(root)
    test: Table = {}
    held = heldout_rows(store)
    if held is not None:
        base = held.filter((pl.col("kind") == "baseline") & (pl.col("mode") == "greedy")
                           & (pl.col("status") != "executor_error"))
        for system in sorted(base["system"].unique().to_list(), key=lambda s: (s != "baseline:io", s)):
            rows = base.filter(pl.col("system") == system).unique(["query_id"], keep="first")
            test[system.removeprefix("baseline:")] = {q: (a, float(c)) for q, a, c in
                                                      rows.select("query_id", "answer_score", "llm_calls").iter_rows()}
    train: Table = {}
    if store.exists("sampled_workflows", "0000") and store.exists("execution_scores", "0000"):
        sampled = store.read_parquet("sampled_workflows", "0000").filter(pl.col("finish_reason") == "anchor")
        scores = store.read_parquet("execution_scores", "0000")
        key = ["query_id", "sample_idx"]
        j = sampled.select(key).join(scores.select(key + ["answer_score", "llm_calls", "runs"]), on=key)
        first = j.group_by("query_id").agg(pl.col("sample_idx").min().alias("first"))
        j = j.join(first, on="query_id").with_columns((pl.col("sample_idx") - pl.col("first")).alias("anchor"))
        for a in sorted(j["anchor"].unique().to_list()):
            rows = j.filter(pl.col("anchor") == a)
            train[f"anchor {a + 1}"] = {q: (s, c / max(1, r)) for q, s, c, r in
                                        rows.select("query_id", "answer_score", "llm_calls", "runs").iter_rows()}
    return test, train


def main(argv: list[str]) -> int:
    first = None
    if "--first" in argv:
        i = argv.index("--first")
        try:
            first = int(argv[i + 1])
        except (IndexError, ValueError):
            raise SystemExit("--first N: N, a whole number of queries, must follow --first") from None
        if first < 1:
            raise SystemExit(f"--first {first}: N must be at least 1")
        argv = argv[:i] + argv[i + 2:]
    if "--assets" in argv:
        i = argv.index("--assets")
        if i + 1 >= len(argv):
            raise SystemExit("--assets DIR: the assets directory of one run (or one seed's folder)")
        test, train = from_assets(Path(argv[i + 1]).expanduser())
        print_table(test, "test split (heldout_results, the reports' static baselines, greedy)")
        print()
        print_table(train, "train split (the anchors of execution_scores[0000], the prompt's workflows in order; "
                           "calls per run)")
        return 0
    if len(argv) < 1:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        return 2
    print_table(from_json(argv, first), "static workflows")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
