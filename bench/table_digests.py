"""Content digests of every partition of every table under one or two assets directories: two runs of the same
config and code must print the same digests (what a refactor that changes no behaviour is checked against).

    python bench/table_digests.py ASSETS_A [ASSETS_B] [--table T] [--filter EXPR] [--common-columns]

One line per (table, partition): the sha256 of its rows (sorted, as canonical JSON) with the columns that
record how long something took or where it was written left out (`VOLATILE`: wall times, training seconds,
the adapter's path); with two directories, whether they match, and the columns that differ where they do not.
Adapter weights are compared through `adapter_sha256`, which every table that names an adapter carries.
Exit status 1 when a digest differs.

To check that a change leaves some rows alone while it adds columns or changes others (e.g. the static
baselines' held-out scores): `--table heldout_results --filter "kind = 'baseline'" --common-columns` digests
only that table's rows matching the SQL expression, over the columns both directories have.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import polars as pl

# columns that differ between two identical runs: durations and the assets directory's own path
VOLATILE = {"wall_s", "train_seconds", "adapter_path"}


def digests(root: Path, table: str = "*", where: str | None = None,
            columns: set[str] | None = None) -> dict[str, tuple[str, dict[str, str]]]:
    """{"table/partition": (digest of the rows, {column: digest of that column})}, over the rows matching `where`
    (a SQL expression) and, when given, only `columns`."""
    out = {}
    for f in sorted(root.glob(f"{table}/*.parquet")):
        df = pl.read_parquet(f)
        if where:
            df = df.filter(pl.sql_expr(where))
        keep = [c for c in df.columns if c not in VOLATILE and (columns is None or c in columns)]
        rows = sorted(json.dumps(r, sort_keys=True, default=str) for r in df.select(keep).to_dicts())
        cols = {c: hashlib.sha256(json.dumps(sorted(map(str, df[c].to_list()))).encode()).hexdigest()[:12]
                for c in keep}
        out[f"{f.parent.name}/{f.stem}"] = (hashlib.sha256("\n".join(rows).encode()).hexdigest()[:16], cols)
    return out


def _columns(root: Path, table: str) -> set[str]:
    return {c for f in root.glob(f"{table}/*.parquet") for c in pl.read_parquet_schema(f)}


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--table", default="*", help="one table (default: every table)")
    ap.add_argument("--filter", dest="where", help="a SQL expression rows must match, e.g. \"kind = 'baseline'\"")
    ap.add_argument("--common-columns", action="store_true", help="compare only the columns both directories have")
    args = ap.parse_args(argv)
    if len(args.dirs) > 2:
        ap.error("one or two assets directories")
    cols = None
    if args.common_columns and len(args.dirs) == 2:
        cols = _columns(args.dirs[0], args.table) & _columns(args.dirs[1], args.table)
    a = digests(args.dirs[0], args.table, args.where, cols)
    if len(args.dirs) == 1:
        for k, (d, _) in a.items():
            print(f"{k:48s} {d}")
        return 0
    b = digests(args.dirs[1], args.table, args.where, cols)
    bad = 0
    for k in sorted(set(a) | set(b)):
        if k not in a or k not in b:
            print(f"{k:48s} only in {'the first' if k in a else 'the second'}")
            bad += 1
            continue
        (da, ca), (db, cb) = a[k], b[k]
        same = da == db
        bad += not same
        cols = "" if same else " columns: " + ", ".join(c for c in sorted(set(ca) | set(cb)) if ca.get(c) != cb.get(c))
        print(f"{k:48s} {da}  {'same' if same else 'DIFFERS ' + db}{cols}")
    print(f"{len(set(a) | set(b))} partitions, {bad} differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
