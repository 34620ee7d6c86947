"""Whose answer is it, by the rule that judges only the code the tests run, against the rule that counted every
token: the rows whose origin changes, on the static workflows and on any stored run's workflows.

    python bench/provenance_rescore.py --limit 40 --executor-model qwen2.5-coder-0.5b \\
        --cache-path ~/.cache/spogw/rescore-calls.sqlite [--methods io,gen_test,...] \\
        [--workflows ASSETS/heldout_results/0000.parquet ...]

Each workflow runs once per query (a static one with run seed 0, a stored one with the seed its run used, so that
run's call cache serves it: pass its `call_cache.sqlite` as --cache-path), in the sandbox, on the first
`--limit` queries of the split; each answer is judged by both rules from the same run (`workflow.provenance`:
`code_origin` now, `whole_text_origin` before). Prints one line per row whose origin changes (with what the
hidden tests say of the answer), then per method: rows, origins by each rule, changed rows, and the executor
share of the credited answers (lowest, 5th percentile) against the threshold. `--workflows` adds the `workflow`
column of stored tables (heldout_results, sampled_workflows) as extra methods, one row per (query, workflow).
The call cache makes a rerun free. Exit status 1 when a static workflow's row changes origin.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

DEFAULT_METHODS = "io,cot,cot_sc,self_refine,multipersona,gen_test,sc3,sc3_test,sc5"


def _anchors() -> dict[str, str]:
    """The anchored prompt's workflows (what the `answers` generator copies and builds on) as whole workflows."""
    from spogw_dagster.workflow.template import WORKFLOW_HEADER, shown_workflows

    return {f"anchor{i}": WORKFLOW_HEADER + body for i, body in enumerate(shown_workflows("code", "anchored"), 1)}


def _stored(paths: list[str]) -> dict[str, list[tuple[str, str, int]]]:
    """{"<file>:<system>": [(query_id, workflow, run seed), ...]} from stored tables (valid rows only); the run
    seed is the one the pipeline ran the row with (heldout_results' exec_seed), so its call cache serves it."""
    import polars as pl

    from spogw_dagster.seeds import derive_seed

    out: dict[str, list[tuple[str, str, int]]] = {}
    for p in paths:
        df = pl.read_parquet(p)
        missing = {"query_id", "workflow"} - set(df.columns)
        if missing:
            raise SystemExit(f"{p}: no {', '.join(sorted(missing))} column: pass a heldout_results or "
                             f"sampled_workflows partition")
        if "parse_status" in df.columns:
            df = df.filter(pl.col("parse_status") == "ok")
        sys_col = "system" if "system" in df.columns else None
        for r in df.iter_rows(named=True):
            key = f"{Path(p).parent.name}/{Path(p).stem}:{r[sys_col] if sys_col else 'sampled'}"
            seed = derive_seed(r["exec_seed"], 0) if r.get("exec_seed") is not None else 0
            out.setdefault(key, []).append((r["query_id"], r["workflow"], seed))
    return out


async def _run(args) -> int:
    from spogw_dagster.benchmarks import score
    from spogw_dagster.benchmarks.queries import held_out_problems
    from spogw_dagster.benchmarks.verdict import CodeSandbox
    from spogw_dagster.evaluation import SCORING_LIMITS, baseline_workflow
    from spogw_dagster.executors.factory import make_executor
    from spogw_dagster.sandboxing import detect_isolation
    from spogw_dagster.workflow.runtime import execute_workflow

    problems = held_out_problems(args.benchmark, limit=args.limit)
    by_id = {p.id: p for p in problems}
    family = problems[0].family
    jobs: dict[str, list[tuple[object, str, int]]] = {}
    for m in [m for m in args.methods.split(",") if m]:
        code = baseline_workflow(family, m)
        jobs[m] = [(p, code, 0) for p in problems]
    if family == "code" and args.methods:
        for name, code in _anchors().items():
            jobs[name] = [(p, code, 0) for p in problems]
    for key, rows in _stored(args.workflows).items():
        jobs[key] = [(by_id[q], code, seed) for q, code, seed in rows if q in by_id]
    static = {m for m in jobs if ":" not in m}

    iso = detect_isolation()
    executor = make_executor(None, args.executor_model, cache_path=args.cache_path)
    sem = asyncio.Semaphore(args.concurrency)
    run_kw = {}
    if args.config:  # the run's operator settings, so that its call cache serves the stored workflows
        from spogw_dagster.pipeline.domain.jobs import operator_config, run_limits
        from spogw_dagster.pipeline.settings import load_config

        cfg = load_config(None, args.config, {})
        run_kw = {"op_cfg": operator_config(cfg), "limits": run_limits(cfg)}

    async def one(p, code, seed):
        async with sem:
            res = await execute_workflow(code, p, executor, iso, seed=seed, **run_kw)
            passed = None
            if res.status.value == "ok" and res.whole_text_origin and \
                    res.whole_text_origin.origin != res.answer_origin:
                passed = (await score(p, res.answer, sandbox=CodeSandbox(iso, SCORING_LIMITS))).score
            return p.id, res, passed

    changed_static = 0
    try:
        print(f"{'method':<24} {'rows':>4} {'executor now/before':>20} {'workflow now/before':>20} {'changed':>7} "
              f"{'share min':>9} {'share p5':>8}")
        for m, todo in jobs.items():
            results = await asyncio.gather(*(one(*job) for job in todo))
            answered = [(q, r, s) for q, r, s in results if r.status.value == "ok" and r.whole_text_origin]
            changes = [(q, r, s) for q, r, s in answered if r.whole_text_origin.origin != r.answer_origin]
            for q, r, s in changes:
                print(f"  CHANGED {m} {q}: {r.whole_text_origin.origin} -> {r.answer_origin} "
                      f"(share {r.whole_text_origin.share:.2f} -> {r.executor_share:.2f}; hidden tests: {s:g})")
            now = [r.answer_origin for _, r, _ in answered]
            before = [r.whole_text_origin.origin for _, r, _ in answered]
            shares = sorted(r.executor_share for _, r, _ in answered if r.answer_origin == "executor")
            p5 = shares[int(0.05 * (len(shares) - 1))] if shares else float("nan")
            print(f"{m:<24} {len(todo):>4} {now.count('executor'):>9}/{before.count('executor'):<10} "
                  f"{now.count('workflow'):>9}/{before.count('workflow'):<10} {len(changes):>7} "
                  f"{(shares[0] if shares else float('nan')):>9.2f} {p5:>8.2f}", flush=True)
            changed_static += len(changes) if m in static else 0
    finally:
        await executor.aclose()
    print(f"RESULT static rows whose origin changed = {changed_static}")
    return 1 if changed_static else 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--benchmark", default="humaneval")
    ap.add_argument("--limit", type=int, default=40, help="the first N test queries (the headline's 40)")
    ap.add_argument("--methods", default=DEFAULT_METHODS, help="static workflows, comma-separated ('' for none)")
    ap.add_argument("--workflows", nargs="*", default=[], help="stored heldout_results / sampled_workflows parquet")
    ap.add_argument("--executor-model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--cache-path", default=str(Path.home() / ".cache/spogw/rescore-calls.sqlite"))
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--config", default=None, help="the stored run's YAML config (its operator settings)")
    return asyncio.run(_run(ap.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
