"""The headroom table: static workflows side by side on the same queries, from `spogw baseline --json` outputs.

    for m in io gen_test sc3 sc3_test sc5; do
      spogw baseline --benchmark humaneval --method $m --split validation --limit 16 \\
        --executor-model qwen2.5-coder-0.5b --concurrency 2 --json > headroom-$m.json
    done
    python bench/headroom.py headroom-io.json headroom-*.json

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
    ref_scores = {r["query"]: r["score"] for r in ref["results"]}
    print(f"{'method':<10} {'pass@1 [95% Wilson]':<24} {'calls/query':>11}  Δ vs {ref['method']} (paired, 95%)")
    for d in runs:
        scores = {r["query"]: r["score"] for r in d["results"]}
        common = sorted(set(scores) & set(ref_scores))
        lo, hi = d["ci95"]
        diff = ""
        if d is not ref and common:
            m, dlo, dhi = stats.paired_bootstrap_diff([[scores[q]] for q in common], [[ref_scores[q]] for q in common],
                                                      resamples=4000, seed=0)
            diff = f"{m:+.3f} [{dlo:+.3f}, {dhi:+.3f}] over {len(common)} queries"
        print(f"{d['method']:<10} {d['solve_rate']:.3f} [{lo:.3f}, {hi:.3f}]     {d['llm_calls'] / d['n']:>11.2f}  {diff}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
