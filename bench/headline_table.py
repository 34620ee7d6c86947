"""The headline over training seeds: every checkpoint of every seed against the base generator, IO and the best
static workflow on the same held-out queries (paired 95% intervals), from the assets of `spogw run --seeds`.

    spogw run --config my.yaml --seeds 0,1,2,3 --assets-dir ~/runs/seeds
    python bench/headline_table.py ~/runs/seeds [--json docs/results/headline.json]

Prints a Markdown table (one row per seed and iteration, then the mean per iteration) and, with --json, writes
the rows (seed, iteration as the partition number from 0, answer, calls_per_query, delta_vs_base,
delta_vs_io, delta_vs_best_static: each {diff, low, high, other}) atomically. The static baselines are those the
reports scored (`report.baselines`); the best is the one with the highest greedy answer score.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def collect(root: Path) -> list[dict]:
    from spogw_dagster.pipeline.data.storage import AssetStore
    from spogw_dagster.pipeline.domain.headline import checkpoint_rows

    seeds = sorted((int(p.name.split("-", 1)[1]), p) for p in root.glob("seed-*") if p.name.split("-", 1)[1].isdigit())
    if not seeds:
        raise SystemExit(f"{root}: no seed-<s> folders; pass the --assets-dir of `spogw run --seeds`")
    rows = []
    for s, p in seeds:
        rows += checkpoint_rows(AssetStore(p), s)
    return rows


def _cell(d: dict | None) -> str:
    return "n/a" if d is None else f"{d['diff']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"


def table(rows: list[dict]) -> str:
    best = sorted({r["best_static"] for r in rows if r["best_static"]})
    lines = [f"| seed | iteration | checkpoint | calls / query | Δ vs base | Δ vs IO | Δ vs best static ({', '.join(best)}) |",
             "|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["iteration"], r["seed"])):
        carried = " (parent carried forward)" if r.get("carried_forward") else ""
        lines.append(f"| {r['seed']} | {r['iteration']} | {r['answer']:.3f}{carried} | {r['calls_per_query']:.2f} | "
                     f"{_cell(r['delta_vs_base'])} | {_cell(r['delta_vs_io'])} | {_cell(r['delta_vs_best_static'])} |")
    for k in sorted({r["iteration"] for r in rows}):
        rs = [r for r in rows if r["iteration"] == k]
        mean = lambda key: statistics.fmean(r[key]["diff"] for r in rs if r[key]) if any(r[key] for r in rs) else None  # noqa: E731
        cells = [f"{m:+.3f}" if m is not None else "n/a" for m in (mean("delta_vs_base"), mean("delta_vs_io"),
                                                                      mean("delta_vs_best_static"))]
        lines.append(f"| mean of {len(rs)} | {k} | {statistics.fmean(r['answer'] for r in rs):.3f} | "
                     f"{statistics.fmean(r['calls_per_query'] for r in rs):.2f} | {' | '.join(cells)} |")
    ref = next((r for r in rows if r["delta_vs_io"]), None)
    if ref:
        others = [f"base {ref['delta_vs_base']['other']:.3f}" if ref["delta_vs_base"] else "",
                  f"IO {ref['delta_vs_io']['other']:.3f}",
                  f"{ref['best_static']} {ref['delta_vs_best_static']['other']:.3f}" if ref["delta_vs_best_static"] else ""]
        lines.append("")
        lines.append(f"On the same {ref['n_queries']} queries: " + ", ".join(o for o in others if o) + ".")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("root", type=Path, help="the --assets-dir of `spogw run --seeds`")
    ap.add_argument("--json", type=Path, default=None, help="write the rows here (e.g. docs/results/headline.json)")
    args = ap.parse_args(argv)
    rows = collect(args.root.expanduser())
    if not rows:
        raise SystemExit(f"{args.root}: no checkpoint has a held-out report yet")
    print(table(rows))
    if args.json:
        from spogw_dagster.fsutil import write_text_atomic

        args.json.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(json.dumps(rows, indent=1) + "\n", args.json)
        print(f"\nwrote {len(rows)} rows to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
