"""The pipeline's subcommands of `spogw` (wired into `spogw_dagster/cli.py`):

    spogw run [--iterations N] [--profile P | --config FILE] [--assets-dir DIR] [--force]
    spogw catalog [--assets-dir DIR]        rebuild assets/spogw.duckdb (e.g. after moving the folder)
"""

from __future__ import annotations

import argparse
import sys

COMMANDS = ("run", "catalog")


def add_pipeline_commands(sub) -> None:
    run = sub.add_parser("run", help="run the SPOGW loop (the Dagster assets, in-process, one iteration at a time)",
                         description="Run iterations 0..N-1 of the SPOGW loop in-process against a persistent "
                                     "Dagster instance ($DAGSTER_HOME, default <assets>/.dagster), then print the "
                                     "held-out scores per iteration.")
    src = run.add_mutually_exclusive_group()
    src.add_argument("--profile", default=None, help="tiny (default), ci or paper")
    src.add_argument("--config", default=None, help="YAML config file (may start from `profile: tiny`)")
    run.add_argument("--iterations", type=int, default=None, help="number of iterations (default: the config's)")
    run.add_argument("--assets-dir", default=None, help="where assets live (default: $SPOGW_ASSETS_DIR or ./assets)")
    run.add_argument("--force", action="store_true", help="rerun iterations whose report already exists")
    run.add_argument("--log-level", default="WARNING", help="Dagster console log level (default WARNING)")
    cat = sub.add_parser("catalog", help="rebuild the DuckDB catalog of the assets directory")
    cat.add_argument("--assets-dir", default=None)


def run_pipeline_command(args: argparse.Namespace) -> int:
    from .config import ConfigValidationError

    try:
        if args.cmd == "catalog":
            from .catalog import refresh_catalog
            from .storage import AssetStore, default_assets_dir

            store = AssetStore(args.assets_dir or default_assets_dir())
            refresh_catalog(store, force=True)
            print(f"rebuilt {store.catalog_path}")
            return 0
        from .loop import run_loop

        if args.iterations is not None and args.iterations < 1:
            raise ConfigValidationError("--iterations must be >= 1")
        outcomes = run_loop(args.profile, args.config, args.iterations, args.assets_dir, force=args.force,
                            log_level=args.log_level.upper())
        return 1 if any(o.status == "failed" for o in outcomes) else 0
    except ConfigValidationError as e:
        print(f"spogw: {e}", file=sys.stderr)
        return 2
