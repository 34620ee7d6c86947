"""The headroom table: static workflows side by side on the same queries, from `spogw baseline --json` outputs.

    for m in io gen_test sc3 sc3_test sc5; do
      spogw baseline --benchmark humaneval --method $m --split validation --limit 16 \\
        --executor-model qwen2.5-coder-0.5b --concurrency 2 --json > headroom-$m.json
    done
    python bench/headroom.py headroom-io.json headroom-*.json
    python bench/headroom.py --first 16 train-io.json train-*.json   # only the first 16 queries of each

With --first, calls per query print as nan: the JSON holds only the run's total.

Per method: pass@1 with its 95% Wilson interval, executor calls per query, and the paired difference to the
first file's method (the reference, IO) over the same queries with a bootstrap 95% interval over queries.
Is there a structure clearly above IO on this executor? If none is, no trained generator can find one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    from spogw_dagster.core import stats

    first = None
    if "--first" in argv:  # only the first N queries of the reference's order (a run's train_queries = N)
        i = argv.index("--first")
        try:
            first = int(argv[i + 1])
        except (IndexError, ValueError):
            raise SystemExit("--first N: N, a whole number of queries, must follow --first") from None
        if first < 1:
            raise SystemExit(f"--first {first}: N must be at least 1")
        argv = argv[:i] + argv[i + 2:]
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        return 2
    runs = []
    for f in dict.fromkeys(argv):  # the reference first, each file once
        d = json.loads(Path(f).read_text())
        if "results" not in d:
            raise SystemExit(f"{f}: no per-query results; run `spogw baseline` with --json")
        runs.append(d)
    ref = runs[0]
    # without --first each file's rate is over its own queries (the Δ over the common ones); with it, over the
    # first N of the reference's
    order = [r["query"] for r in ref["results"]][:first] if first else None
    ref_scores = _scored(ref, order)
    print(f"{'method':<10} {'pass@1 [95% Wilson]':<24} {'calls/query':>11}  Δ vs {ref['method']} (paired, 95%)")
    for d in runs:
        scores = _scored(d, order)
        if not scores:
            print(f"{d['method']:<10} no scored query")
            continue
        common = [q for q in (order or ref_scores) if q in scores and q in ref_scores]
        lo, hi = stats.wilson(sum(scores.values()), len(scores))
        diff = ""
        if d is not ref and common:
            m, dlo, dhi = stats.paired_bootstrap_diff([[scores[q]] for q in common], [[ref_scores[q]] for q in common],
                                                      resamples=4000, seed=0)
            diff = f"{m:+.3f} [{dlo:+.3f}, {dhi:+.3f}] over {len(common)} queries"
        calls = d["llm_calls"] / d["n"] if first is None else float("nan")  # per-query calls are not in the JSON
        print(f"{d['method']:<10} {sum(scores.values()) / len(scores):.3f} [{lo:.3f}, {hi:.3f}]     {calls:>11.2f}  {diff}")
    return 0


def _scored(run: dict, order: list[str] | None) -> dict[str, float]:
    """Query -> score over `order` (None: all the run's queries), executor errors left out (as `spogw
    baseline` counts them)."""
    return {r["query"]: r["score"] for r in run["results"]
            if (order is None or r["query"] in order) and r["status"] != "executor_error"}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
