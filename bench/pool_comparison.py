"""The methods comparison (`spogw compare --iteration K`) pooled over training seeds: one assets directory per
seed, each holding objective_comparison[K] (the same methods, queries and executor seeds; only the seed of the
run differs). For each method it prints the greedy answer score per seed and pooled, and the paired difference
to `spogw`, to the base model (π_{K-1} = the base at K = 0) and to each static baseline, with 95% intervals
from resampling queries (each query keeps its value under every seed: `core.stats`, clusters = queries).

Holm's family is the answer-score difference of each trained method to `spogw` (as in the comparison itself);
its p-values use enough resamples that the smallest attainable p is below Holm's first threshold
(`core.stats.resamples_for_family`). The differences to the base and to the baselines are reported without
correction.

The base model's rows come from the run's own tables, scored with the same executor seeds: on validation from
selection_results (the checkpoint gate's parent, `selection.enabled`), on test from heldout_results (the
report's `base`). Without them the "vs base" column is left out.

    python bench/pool_comparison.py ~/runs/seed-0 ~/runs/seed-2 --split validation [--iteration 0]

Reads parquet only; writes nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import polars as pl

from spogw_dagster.contracts import Status
from spogw_dagster.core import stats

ALPHA = 0.05
COLUMNS = ["system", "query_id", "exec_seed", "answer_score"]


def greedy_rows(path: Path, split: str, systems: list[str] | None = None) -> pl.DataFrame | None:
    """Greedy rows of `split`, executor errors left out (our infrastructure failing, not the workflow: the
    report and `spogw compare` leave them out of every metric and pair too)."""
    if not path.is_file():
        return None
    d = pl.read_parquet(path).filter((pl.col("mode") == "greedy") & (pl.col("split") == split)
                                     & (pl.col("status") != Status.EXECUTOR_ERROR))
    d = d.filter(pl.col("system").is_in(systems)) if systems is not None else d
    return d.select(COLUMNS)


def load_seed(root: Path, key: str, split: str) -> pl.DataFrame:
    """One seed's greedy rows: the comparison's methods and baselines, plus `base` where the run has it."""
    comp = greedy_rows(root / "comparison_heldout" / f"{key}.parquet", split)
    if comp is None or comp.is_empty():
        raise SystemExit(f"{root}: no comparison_heldout[{key}] rows on {split}; run `spogw compare --iteration "
                         f"{int(key)} --split {split}` with this assets directory first")
    base_table = "selection_results" if split == "validation" else "heldout_results"
    base = greedy_rows(root / base_table / f"{key}.parquet", split, ["base"])
    rows = pl.concat([comp] + ([base] if base is not None and not base.is_empty() else []))
    seeds = rows["exec_seed"].unique().to_list()
    if len(seeds) != 1:  # pairs need the same executor draws
        raise SystemExit(f"{root}: the systems were scored with executor seeds {sorted(seeds)}; pairs need one")
    return rows


def per_query(rows: list[pl.DataFrame], system: str, ids: list[str]) -> list[list[float]]:
    """[query][seed] answer scores of `system` on `ids` (queries every system answered under every seed)."""
    by_seed = [dict(r.filter(pl.col("system") == system).select("query_id", "answer_score").iter_rows())
               for r in rows]
    return [[s[q] for s in by_seed] for q in ids]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("assets_dirs", nargs="+", type=Path, help="one assets directory per training seed")
    ap.add_argument("--split", choices=["validation", "test"], default="validation")
    ap.add_argument("--iteration", type=int, default=0)
    ap.add_argument("--resamples", type=int, default=10_000)
    args = ap.parse_args(argv)
    key = f"{args.iteration:04d}"
    rows = [load_seed(d.expanduser(), key, args.split) for d in args.assets_dirs]
    systems = sorted(set.intersection(*(set(r["system"].to_list()) for r in rows)))
    if "spogw" not in systems:
        raise SystemExit("spogw is not in every seed's comparison: it is the reference; add it to --methods")
    spogw_ids = [set(r.filter(pl.col("system") == "spogw")["query_id"].to_list()) for r in rows]
    if len(set(map(frozenset, spogw_ids))) > 1:
        odd = sorted(set.union(*spogw_ids) - set.intersection(*spogw_ids))
        raise SystemExit(f"spogw: the seeds hold different queries ({odd[:5]}); compare on the same split and limit "
                         "(or one seed's executor failed on them: see its executor_error rows)")
    # the queries every system answered under every seed (an executor error leaves its query out, as in the report)
    ids = sorted(set.intersection(*(set(r.filter(pl.col("system") == s)["query_id"].to_list())
                                    for r in rows for s in systems)))
    left_out = len(set.union(*spogw_ids)) - len(ids)
    values = {s: per_query(rows, s, ids) for s in systems}
    ref, base = values["spogw"], values.get("base")
    baselines = [s for s in systems if s.startswith("baseline:")]
    methods = ["spogw"] + [s for s in systems if s not in ("spogw", "base") and s not in baselines]
    family = [m for m in methods if m != "spogw"]
    b_family = stats.resamples_for_family(len(family), args.resamples, ALPHA)
    pvals = [stats.paired_bootstrap_p(values[m], ref, resamples=b_family) for m in family]
    p_holm = dict(zip(family, stats.holm(pvals)))

    def diff(a, b) -> str:
        d, lo, hi = stats.paired_bootstrap_diff(a, b, resamples=args.resamples)
        return f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]"

    n_q = len(ref)
    print(f"{args.split}: {n_q} queries x {len(rows)} seeds" + (f" ({left_out} left out: an executor error under some "
          "seed or system)" if left_out else "") + f" ({', '.join(str(d) for d in args.assets_dirs)}); greedy "
          f"answer score; Δ: paired difference, 95% interval over queries ({args.resamples} resamples); Holm over "
          f"the {len(family)} differences to spogw at B = {b_family} (smallest attainable p {2 / (b_family + 1):.5f}"
          f" against α/m = {ALPHA / max(1, len(family)):.5f})\n")
    head = ["system", *(d.name for d in args.assets_dirs), "pooled", "Δ vs spogw", "p_holm"]
    head += (["Δ vs base"] if base else []) + [f"Δ vs {b}" for b in baselines]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for s in methods + (["base"] if base else []) + baselines:
        v = values[s]
        cells = [s, *(f"{sum(q[i] for q in v) / n_q:.3f}" for i in range(len(rows))),
                 f"{sum(sum(q) for q in v) / (n_q * len(rows)):.3f}"]
        cells += [diff(v, ref) if s != "spogw" else "", f"{p_holm[s]:.3f}" if s in p_holm else ""]
        cells += ([diff(v, base) if s != "base" else ""] if base else [])
        cells += [diff(v, values[b]) if s != b else "" for b in baselines]
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
