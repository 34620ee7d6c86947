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


def plot(rows: list[dict]) -> bytes:
    """Per seed and iteration: the checkpoint's answer score beside the base, IO and the best static workflow on
    the same queries (the Δ intervals are in the table), as a PNG."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted(rows, key=lambda r: (r["seed"], r["iteration"]))
    labels = [f"seed {r['seed']}\nit {r['iteration']}" for r in rows]
    series = {"base": [r["delta_vs_base"]["other"] if r["delta_vs_base"] else None for r in rows],
              "checkpoint": [r["answer"] for r in rows],
              "IO": [r["delta_vs_io"]["other"] if r["delta_vs_io"] else None for r in rows],
              "best static": [r["delta_vs_best_static"]["other"] if r["delta_vs_best_static"] else None for r in rows]}
    fig, ax = plt.subplots(figsize=(max(4.5, 1.1 * len(rows)), 3))
    width = 0.2
    for i, (name, ys) in enumerate(series.items()):
        xs = [j + (i - 1.5) * width for j, y in enumerate(ys) if y is not None]
        ax.bar(xs, [y for y in ys if y is not None], width, label=name)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylim(0, 1)
    ax.set_ylabel("held-out answer score")
    ax.legend(fontsize=7, ncol=4, loc="upper left")
    ax.set_title(f"greedy workflows on {rows[0]['n_queries']} held-out queries, per training seed", fontsize=9)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("root", type=Path, help="the --assets-dir of `spogw run --seeds`")
    ap.add_argument("--json", type=Path, default=None, help="write the rows here (e.g. docs/results/headline.json)")
    ap.add_argument("--plot", type=Path, default=None, help="draw the per-seed scores here (a PNG)")
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
    if args.plot:
        from spogw_dagster.fsutil import write_bytes_atomic

        args.plot.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(plot(rows), args.plot)
        print(f"drew {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
