"""Per-run cost of scoring one HumanEval answer: the two-process verdict beside the old one-process path.

Both score the canonical solution of the same problems in the same sandbox, interleaved round by round
so that machine noise hits both alike:

  old  `code_tests.score_code_single_process` (LEGACY, forgeable): solution + tests + pass token as one
       program, one sandboxed process (`sandboxing.run_code`);
  new  `code_tests.score_code`: the solution's process and the test process, started together, every call
       of the tests relayed through the parent (`benchmarks/verdict.py`).

Prints the median (and p90) per scored answer over `--n` rounds, and the ratio new / old (target: < 2).

    python bench/scoring_overhead.py [--n 20] [--isolation auto|bwrap|docker] [--problems HumanEval/0,...]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from spogw_dagster.benchmarks import CodeSandbox, load_benchmark, score_code  # noqa: E402
from spogw_dagster.benchmarks.code_tests import score_code_single_process  # noqa: E402
from spogw_dagster.evaluation import SCORING_LIMITS  # noqa: E402
from spogw_dagster.sandboxing import detect_isolation, run_code  # noqa: E402

# HumanEval/0 (7 calls of the entry point), /32 (100 calls, floats), /53 (105 calls), /2 (3 calls)
DEFAULT_PROBLEMS = "HumanEval/0,HumanEval/2,HumanEval/32,HumanEval/53"


async def measure(problems, iso, n: int) -> dict[str, list[float]]:
    sandbox = CodeSandbox(iso, SCORING_LIMITS)

    async def old(p):
        return await score_code_single_process(p, p.answer, lambda prog: run_code(prog, iso, SCORING_LIMITS))

    async def new(p):
        return await score_code(p, p.answer, sandbox)

    times: dict[str, list[float]] = {f"{kind} {p.id}": [] for p in problems for kind in ("old", "new")}
    for p in problems:  # warm-up: imports, page cache, cgroup setup
        await old(p)
        await new(p)
    for _ in range(n):
        for p in problems:
            for kind, fn in (("old", old), ("new", new)):
                t = time.perf_counter()
                d = await fn(p)
                times[f"{kind} {p.id}"].append(time.perf_counter() - t)
                if d.score != 1.0:
                    raise RuntimeError(f"{kind} path failed the canonical solution of {p.id}: {d.detail}")
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20, help="rounds (median over them)")
    ap.add_argument("--isolation", default="auto", choices=["auto", "bwrap", "docker"])
    ap.add_argument("--problems", default=DEFAULT_PROBLEMS, help="comma-separated HumanEval task ids")
    args = ap.parse_args()
    iso = detect_isolation(args.isolation)
    by_id = {p.id: p for p in load_benchmark("humaneval")}
    problems = [by_id[pid] for pid in args.problems.split(",")]
    times = asyncio.run(measure(problems, iso, args.n))
    print(f"HumanEval scoring per answer, {iso.name} ({iso.detail}), median of {args.n} (p90):")
    print(f"    {'problem':<14}{'old (1 process)':>20}{'new (2 processes)':>22}{'new/old':>10}")
    ratios = []
    for p in problems:
        old, new = times[f"old {p.id}"], times[f"new {p.id}"]
        mo, mn = statistics.median(old), statistics.median(new)
        q = lambda xs: sorted(xs)[max(0, int(len(xs) * 0.9) - 1)]  # noqa: E731
        ratios.append(mn / mo)
        print(f"    {p.id:<14}{mo * 1e3:>9.0f} ms ({q(old) * 1e3:4.0f}){mn * 1e3:>11.0f} ms ({q(new) * 1e3:4.0f})"
              f"{mn / mo:>9.2f}x")
    print(f"    median ratio new/old: {statistics.median(ratios):.2f}x (target < 2x)")


if __name__ == "__main__":
    main()
