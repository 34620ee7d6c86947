"""The pipeline's subcommands of `spogw` (wired into `spogw_dagster/cli.py`):

    spogw run [--iterations N] [--profile P | --config FILE] [--assets-dir DIR] [--force]
    spogw catalog [--assets-dir DIR]        rebuild assets/spogw.duckdb (e.g. after moving the folder)
    spogw evaluate [--split validation|test] [--adapter DIR] [--compare base|DIR] [--samples K] ...
                                            score the base model or a LoRA adapter (greedy and K samples per
                                            query, 95% intervals, paired differences to --compare); choose
                                            settings on the validation split, never on test
    spogw check [--profile P | --config FILE] [--assets-dir DIR]  everything a run would refuse (preflight.py)
    spogw plan [--profile P | --config FILE] [--assets-dir DIR]   the work one iteration implies, before it runs
    spogw compare A B [--assets-dir DIR]    paired difference of two systems already in heldout_results (e.g.
                                            the last checkpoint against the base model), from the stored rows

Every `spogw` invocation imports this module to build its parser, so each command imports what it runs inside
its handler: the settings, numpy and the domain modules would add ~0.8 s, dagster ~2 s more, to every start-up.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

import polars as pl

from spogw_dagster.adapter_files import ADAPTER_WEIGHTS
from spogw_dagster.benchmarks.queries import split_problems
from spogw_dagster.pipeline.data.catalog import refresh_catalog
from spogw_dagster.pipeline.data.checkpoints import adapter_sha256
from spogw_dagster.pipeline.data.storage import (
    STORAGE_ERRNOS,
    AssetStore,
    default_assets_dir,
    storage_error_text,
    storage_trouble,
    write_parquet_atomic,
)
from spogw_dagster.pipeline.runs.plan import (
    Speeds,
    format_plan,
    format_w4s_plan,
    measure_assets,
    plan_from_config,
    speeds_for_config,
    w4s_plans_from_config,
)

COMMANDS = ("run", "check", "catalog", "evaluate", "compare", "plan", "gc")


def add_config_source(parser, *, prefix: str = "", config_help: str = "YAML config file") -> None:
    """--profile or --config (one of them): where a command's settings come from."""
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--profile", default=None, help=f"{prefix}tiny (default), ci or paper")
    src.add_argument("--config", default=None, help=f"{prefix}{config_help}")


def add_pipeline_commands(sub) -> None:
    run = sub.add_parser("run", help="run the SPOGW loop (the Dagster assets, in-process, one iteration at a time)",
                         description="Run iterations 0..N-1 of the SPOGW loop in-process against a persistent "
                                     "Dagster instance ($DAGSTER_HOME, default <assets>/.dagster), then print the "
                                     "held-out scores per iteration.")
    add_config_source(run, config_help="YAML config file (may start from `profile: tiny`)")
    run.add_argument("--iterations", type=int, default=None, help="number of iterations (default: the config's)")
    run.add_argument("--assets-dir", default=None, help="where assets live (default: $SPOGW_ASSETS_DIR or ./assets)")
    run.add_argument("--force", action="store_true", help="rerun iterations whose report already exists")
    run.add_argument("--seeds", default=None,
                     help="comma-separated training seeds, e.g. 0,1,2: the loop once per seed in <assets>/seed-<s> "
                          "(same held-out queries and draws), then the answer score's mean and spread over seeds")
    run.add_argument("--log-level", default="WARNING", help="Dagster console log level (default WARNING)")
    chk = sub.add_parser("check", help="preflight: everything a run would refuse (config, splits, models, executor, "
                                       "sandbox, assets directory), each problem with its fix; exit 0 when none",
                         description="Check what `spogw run` checks before it starts, without running anything: the "
                                     "config and its ${VAR}s, the benchmark's split sizes and data files, the "
                                     "generator and executor models, the executor endpoint's reachability, the "
                                     "sandbox, and the assets directory. Exit 0 when all pass, 2 otherwise.")
    add_config_source(chk)
    chk.add_argument("--assets-dir", default=None, help="default: $SPOGW_ASSETS_DIR or ./assets")
    chk.add_argument("--json", action="store_true", help="print the findings as JSON")
    cat = sub.add_parser("catalog", help="rebuild the DuckDB catalog of the assets directory")
    cat.add_argument("--assets-dir", default=None)
    gc = sub.add_parser("gc", help="remove adapters and leftovers no partition references",
                        description="Remove lora_checkpoint adapter folders whose table row is gone, comparison "
                                    "adapters no objective_comparison table lists, and temp files of killed "
                                    "writers. Tables and caches are kept.")
    gc.add_argument("--assets-dir", default=None, help="default: $SPOGW_ASSETS_DIR or ./assets")
    gc.add_argument("--dry-run", action="store_true", help="list what would go, remove nothing")
    ev = sub.add_parser("evaluate", help="score the base model or a LoRA adapter on the validation (or test) split",
                        description="Generate workflows for the split's queries from a policy (greedy and K samples "
                                    "at the training temperature, the report's seeds), execute and score them, and "
                                    "print valid / executes / trivial rates, mean reward and answer score with 95% "
                                    "intervals, and the paired difference to --compare. Settings (temperature, lr, "
                                    "epochs, d, m, ladder weights) are chosen on the validation split.")
    add_config_source(ev)
    ev.add_argument("--split", choices=["validation", "test"], default="validation")
    ev.add_argument("--adapter", default=None, help="LoRA adapter folder to score (default: the base model)")
    ev.add_argument("--compare", default=None,
                    help="a second policy for paired differences: 'base' or an adapter folder")
    ev.add_argument("--samples", type=int, default=None, help="samples per query (default: report.samples)")
    ev.add_argument("--temperature", type=float, default=None,
                    help="sampling temperature (default: report.sample_temperature, else the generator's)")
    ev.add_argument("--no-greedy", action="store_true", help="skip the greedy mode")
    ev.add_argument("--limit", type=int, default=None,
                    help="first N queries of the split (default: benchmark.validation_queries or all for "
                         "validation, benchmark.heldout_queries for test)")
    ev.add_argument("--baselines", action="store_true", help="also score the config's static baselines")
    ev.add_argument("--assets-dir", default=None, help="executor call cache and baseline cache live here")
    ev.add_argument("--out", default=None, help="write the per-sample rows (heldout_results columns) to this Parquet")
    ev.add_argument("--json", action="store_true", help="print the report rows as JSON")
    cmp = sub.add_parser("compare", help="paired difference of two systems in heldout_results, or train and compare "
                                         "methods side by side on one iteration (--iteration)",
                         description="Two forms. `spogw compare A B`: pair two systems' stored held-out samples on "
                                     "(mode, query, sample) — they must share sampler and executor seeds, as every "
                                     "report's systems do — and print each metric for both with the paired "
                                     "difference A - B and its 95% paired bootstrap interval over queries, e.g. "
                                     "`spogw compare spogw@0002 base`. `spogw compare --iteration K --methods "
                                     "spogw,grpo,score_dpo,rwr`: materialize objective_comparison[K] (each method "
                                     "trained from lora_checkpoint(K-1) on iteration K's data with the same seeds, "
                                     "scored on the report's held-out queries) and print its table.")
    cmp.add_argument("a", nargs="?", help="system label as in heldout_results.system, e.g. spogw@0002")
    cmp.add_argument("b", nargs="?", help="the system to compare against, e.g. base or spogw@0000")
    cmp.add_argument("--iteration", type=int, default=None, help="train and compare methods on this iteration")
    cmp.add_argument("--methods", "--objectives", dest="methods", default=None,
                     help="comma-separated methods (default: comparison.methods; --objectives is its old name), e.g. spogw,grpo,score_dpo,rwr,"
                          "spogw_beta0,spogw_ref_previous,spogw_no_screening,spogw_no_sharpening")
    add_config_source(cmp, prefix="with --iteration: ")
    cmp.add_argument("--assets-dir", default=None, help="default: $SPOGW_ASSETS_DIR or ./assets")
    cmp.add_argument("--split", default=None, choices=("test", "validation"),
                     help="A B: only rows of this split; with --iteration: the split the methods are scored on "
                          "(default comparison.split, validation; test once, for the final table)")
    cmp.add_argument("--resamples", type=int, default=2000)
    cmp.add_argument("--json", action="store_true", help="print the rows as JSON")
    add_plan_parser(sub)


def run_pipeline_command(args: argparse.Namespace) -> int:
    # lazy: start-up time (module doc)
    from spogw_dagster.pipeline.settings import ConfigValidationError

    try:
        if args.cmd == "catalog":
            store = AssetStore(args.assets_dir or default_assets_dir())
            refresh_catalog(store, force=True)
            print(f"rebuilt {store.catalog_path}")
            return 0
        if args.cmd == "check":
            return check_command(args)
        if args.cmd == "evaluate":
            return evaluate_command(args)
        if args.cmd == "gc":
            # lazy: start-up time (module doc)
            from spogw_dagster.pipeline.runs.cleanup import gc_command

            return gc_command(args.assets_dir, args.dry_run)
        if args.cmd == "plan":
            return plan_command(args)
        if args.cmd == "compare":
            return compare_command(args)
        # lazy: start-up time (module doc)
        from spogw_dagster.pipeline.runs.loop import run_loop

        if args.iterations is not None and args.iterations < 1:
            raise ConfigValidationError("--iterations must be >= 1")
        seeds = parse_seeds(args.seeds) if getattr(args, "seeds", None) else None
        try:
            if seeds:
                # lazy: start-up time (module doc)
                from spogw_dagster.pipeline.runs.loop import run_seeds

                outcomes = run_seeds(args.profile, args.config, args.iterations, args.assets_dir, seeds,
                                     force=args.force, log_level=args.log_level.upper())
            else:
                outcomes = run_loop(args.profile, args.config, args.iterations, args.assets_dir, force=args.force,
                                    log_level=args.log_level.upper())
        except Exception as e:  # the Dagster instance's own sqlite writes fail first on a full disk
            trouble = storage_trouble(args.assets_dir)
            if trouble is None or isinstance(e, ConfigValidationError) or (
                    isinstance(e, OSError) and e.errno in STORAGE_ERRNOS):  # those say which file: below
                raise
            print(f"spogw: {trouble} (the run stopped at {type(e).__name__}: {str(e).splitlines()[0][:200]})",
                  file=sys.stderr)
            return 2
        return 1 if any(o.status == "failed" for o in outcomes) else 0
    except ConfigValidationError as e:
        print(f"spogw: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        if e.errno not in STORAGE_ERRNOS:
            raise
        print(f"spogw: {storage_error_text(e)}", file=sys.stderr)
        return 2


def check_command(args: argparse.Namespace) -> int:
    """`spogw check`: every finding of the preflight, ok or not; 2 when any failed."""
    # lazy: start-up time (module doc)
    from spogw_dagster.pipeline.runs.preflight import preflight

    cfg, findings = preflight(args.profile, args.config, assets_dir=args.assets_dir)
    bad = [f for f in findings if not f.ok]
    if args.json:
        print(json.dumps({"ok": not bad, "profile": cfg.profile if cfg else None,
                          "findings": [asdict(f) for f in findings]}, indent=1))
    else:
        for f in findings:
            print(f.line())
        print(f"{len(bad)} problem{'s' if len(bad) != 1 else ''}" if bad else "ready to run")
    return 2 if bad else 0


def parse_seeds(text: str) -> list[int]:
    # lazy: start-up time (module doc)
    from spogw_dagster.pipeline.settings import ConfigValidationError

    try:
        seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigValidationError(f"--seeds {text!r}: give comma-separated integers, e.g. --seeds 0,1,2") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ConfigValidationError(f"--seeds {text!r}: give one or more distinct integers, e.g. --seeds 0,1,2")
    return seeds


def compare_command(args: argparse.Namespace) -> int:
    """`spogw compare A B`: paired differences between two systems' stored held-out rows; with --iteration,
    the objective comparison of that iteration."""
    if args.iteration is not None:
        return _objective_comparison(args)
    if not (args.a and args.b):
        # lazy: start-up time (module doc)
        from spogw_dagster.pipeline.settings import ConfigValidationError

        raise ConfigValidationError("spogw compare needs two systems (A B) or --iteration K")

    # lazy: start-up time (module doc)
    from spogw_dagster.pipeline.data import report_stats
    from spogw_dagster.pipeline.domain.headline import heldout_rows
    from spogw_dagster.pipeline.settings import ConfigValidationError

    store = AssetStore(args.assets_dir or default_assets_dir())
    heldout = heldout_rows(store)
    if heldout is None:
        raise ConfigValidationError(f"no heldout_results under {store.root}; materialize benchmark_report first "
                                    "(spogw run) or pass --assets-dir")
    if args.split:
        heldout = heldout.filter(pl.col("split") == args.split)
    try:
        rows = report_stats.paired_comparison(report_stats.system_rows(heldout, args.a), report_stats.system_rows(heldout, args.b),
                                        resamples=args.resamples)
    except ValueError as e:
        raise ConfigValidationError(str(e)) from None
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{args.a} vs {args.b} (paired on the same queries and seeds; 95% paired bootstrap over queries)")
    print(f"  {'mode':<8}{'metric':<15}{args.a:>14}{args.b:>14}{'A - B [95% CI]':>30}{'pairs':>7}")
    for r in rows:
        ci = f"{r['diff']:+.3f} [{r['diff_ci_low']:+.3f}, {r['diff_ci_high']:+.3f}]"
        print(f"  {r['mode']:<8}{r['metric']:<15}{r['a']:>14.3f}{r['b']:>14.3f}{ci:>30}{r['n_pairs']:>7}")
    return 0


def _objective_comparison(args: argparse.Namespace) -> int:
    # lazy: start-up time (module doc)
    from spogw_dagster.pipeline.data.report_stats import comparison_cells
    from spogw_dagster.pipeline.runs.loop import run_comparison
    from spogw_dagster.pipeline.settings import ConfigValidationError

    methods = [o.strip() for o in args.methods.split(",") if o.strip()] if args.methods else None
    table = run_comparison(args.profile, args.config, args.iteration, methods, args.assets_dir, split=args.split)
    if table.height == 0:
        raise ConfigValidationError(f"objective_comparison[{args.iteration:04d}] has no rows: no method was scored on "
                                    f"held-out queries; its materialization's metadata and log say why")
    if args.json:
        print(json.dumps(table.to_dicts(), indent=1, default=str))
        return 0
    ref = table["reference"][0]
    note, cells = comparison_cells(table, ["answer_score", "valid_rate", "executes_rate", "mean_reward"])
    print(f"methods on iteration {args.iteration:04d}'s data (same parent adapter, data and seeds), scored on "
          f"{table['split'][0]}; Δ: paired difference to {ref}, 95% paired bootstrap over queries. {note}")
    print(f"  {'method':<22}{'mode':<9}{'metric':<15}{'value [95% CI]':>24}{'Δ vs ' + ref + ' [95% CI]':>32}"
          f"{'Holm CI':>20}  p")
    for c in cells:
        print(f"  {c['method']:<22}{c['mode']:<9}{c['metric']:<15}{c['value']:>24}{c['diff']:>32}{c['holm']:>20}  {c['p']}")
    return 0


def _policy(path: str | None, kind: str):
    # lazy: start-up time (module doc)
    from spogw_dagster.pipeline.domain.heldout import Policy
    from spogw_dagster.pipeline.settings import ConfigValidationError

    if path is None or path == "base":
        return Policy("base", kind)
    p = Path(path).expanduser().resolve()
    if not (p / ADAPTER_WEIGHTS).is_file():
        raise ConfigValidationError(f"{p} holds no adapter_model.safetensors; pass a LoRA adapter folder "
                                    "(e.g. assets/lora_checkpoint/0001) or 'base'")
    return Policy(f"adapter:{p.name}", kind, p, None, adapter_sha256(p))


def evaluate_command(args: argparse.Namespace) -> int:
    """`spogw evaluate`: the report's scoring for one policy (and optionally a second one to pair with)."""
    # lazy: start-up time (module doc)
    from spogw_dagster.pipeline.data import report_stats
    from spogw_dagster.pipeline.defs.resources import PipelineResource
    from spogw_dagster.pipeline.domain import heldout as ho
    from spogw_dagster.pipeline.settings import ConfigValidationError, load_config

    report: dict = {}
    if args.samples is not None:
        report["samples"] = args.samples
    if args.temperature is not None:
        report["sample_temperature"] = args.temperature
    if args.no_greedy:
        report["greedy"] = False
    if not args.baselines:
        report["baselines"] = []
    report["split"] = args.split
    root = Path(args.assets_dir).expanduser().resolve() if args.assets_dir else default_assets_dir()
    cfg = load_config(args.profile, args.config, {"report": report})
    pipeline = PipelineResource.from_config(cfg, root)
    b = cfg.benchmark
    limit = args.limit if args.limit is not None else (b.heldout_queries if args.split == "test"
                                                       else b.validation_queries)
    if limit is not None and limit < 1:
        raise ConfigValidationError("--limit must be >= 1")
    try:
        problems, info = split_problems(b.name, args.split, limit=limit, seed=b.split_seed, path=b.data_path,
                                        reserve=cfg.reserved_validation(args.split))
    except ValueError as e:
        raise ConfigValidationError(str(e)) from None
    policies = [_policy(args.adapter, "checkpoint")]
    if args.compare is not None:
        policies.append(_policy(args.compare, "previous"))
        if policies[1].system == policies[0].system:
            raise ConfigValidationError("--compare names the same policy as --adapter; compare two different ones")
    print(f"spogw evaluate: {', '.join(p.system for p in policies)} on the {args.split} split of {b.name} "
          f"({len(problems)} queries, ids sha256 {info['ids_sha256'][:12]}), "
          f"modes {[(m, n, t) for m, n, t in ho.modes(cfg)]}", file=sys.stderr, flush=True)
    scored = ho.score(pipeline, policies, problems, cfg, iteration=0, split=args.split,
                      say=lambda m: print(f"  {m}", file=sys.stderr, flush=True))
    rep = report_stats.summarize_heldout(scored.heldout, iteration=0, config_hash=cfg.hash,
                                   split_ids_sha256=info["ids_sha256"], resamples=cfg.report.bootstrap_resamples,
                                   seed=cfg.report.seed)
    if args.out:
        write_parquet_atomic(scored.heldout, Path(args.out).expanduser())
    if args.json:
        print(json.dumps({"split": info, "report": rep.to_dicts()}, default=str))
    else:
        print(report_stats.report_table_text(rep))
    return 0


# ---------------------------------------------------------------------------------------------------
# the `spogw plan` subcommand (its numbers: plan.py)


def add_plan_parser(sub) -> None:
    p = sub.add_parser("plan", help="print the work one iteration implies (samples, executor calls, training rows, "
                                    "time), before anything runs",
                       description="From the config's sizes and limits (and averages measured in --assets-dir when "
                                   "it holds execution_scores / sampled_workflows), print one iteration's generator "
                                   "samples and tokens, executor calls and tokens, training rows before and after "
                                   "unique-workflow aggregation, and a wall-time estimate on the measured backends.")
    add_config_source(p)
    p.add_argument("--assets-dir", default=None,
                   help="measure calls per workflow and tokens from this assets directory's tables (default: "
                        "$SPOGW_ASSETS_DIR or ./assets, when it holds any)")
    p.add_argument("--first-iteration", action="store_true", help="count the base model's report rows too (k = 0)")
    p.add_argument("--generator-tps", type=float, default=None,
                   help="generator tokens/s (default: measured for the config's target, if it was)")
    p.add_argument("--executor-tps", type=float, default=None, help="executor tokens/s, all workers together")
    p.add_argument("--train-tps", type=float, default=None, help="trained tokens/s")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")


def plan_command(args: argparse.Namespace) -> int:
    # lazy: start-up time (module doc)
    from spogw_dagster.pipeline.runs.preflight import PLAN_CHECKS, PreflightError, preflight
    from spogw_dagster.pipeline.settings import ConfigValidationError

    # the checks its counts rest on, with the same text `spogw check` and `spogw run` give; unset ${VAR}s are
    # placeholders here (no count depends on them)
    cfg, findings = preflight(args.profile, args.config, checks=PLAN_CHECKS, allow_unset_env=True)
    problems = [f for f in findings if not f.ok]
    if problems:
        raise PreflightError(problems)
    unset = [f for f in findings if f.unset]
    notes = [f"{f.text}: a placeholder for this plan (no count depends on it)" for f in unset]
    root = Path(args.assets_dir).expanduser() if args.assets_dir else default_assets_dir()
    if args.assets_dir and not Path(root).is_dir():
        raise ConfigValidationError(f"--assets-dir {root} does not exist")
    measured = measure_assets(root) if Path(root).is_dir() else None
    given = {}
    for name in ("generator_tps", "executor_tps", "train_tps"):
        v = getattr(args, name)
        if v is not None and v <= 0:
            raise ConfigValidationError(f"--{name.replace('_', '-')} must be > 0")
        if v is not None:
            given[name] = v
    speeds = speeds_for_config(cfg, placeholders=frozenset(f.unset for f in unset))
    if given:
        keep = [(k, why) for k, why in speeds.unknown if k not in given]
        speeds = Speeds(**{**{k: getattr(speeds, k) for k in ("generator_tps", "executor_tps", "train_tps")}, **given},
                        source=speeds.source + "; given: " + ", ".join(f"--{k.replace('_', '-')} {v:g}"
                                                                       for k, v in given.items()),
                        unknown=tuple(keep))
    p = plan_from_config(cfg, measured, speeds, first_iteration=args.first_iteration)
    w4s = w4s_plans_from_config(cfg, p)
    if args.json:
        print(json.dumps({"profile": cfg.profile, "plan": p.as_dict(), "w4s": [asdict(w) for w in w4s],
                          "notes": notes, "measured_from": measured.source if measured else None}, default=str))
        return 0
    for n in notes:
        print(f"note: {n}", file=sys.stderr)
    print(format_plan(p, f"profile {cfg.profile}, {cfg.benchmark.name}"))
    print(f"  measured  : {measured.source}" if measured else
          f"  measured  : nothing (no execution_scores/sampled_workflows under {root}): caps are upper bounds")
    for w in w4s:
        print(format_w4s_plan(w))
    return 0
