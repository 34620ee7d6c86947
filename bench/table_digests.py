"""Content digests of every partition of every table under one or two assets directories: two runs of the same
config and code must print the same digests (what a refactor that changes no behaviour is checked against).

    python bench/table_digests.py ASSETS_A [ASSETS_B]

One line per (table, partition): the sha256 of its rows (sorted, as canonical JSON) with the columns that
record how long something took or where it was written left out (`VOLATILE`: wall times, training seconds,
the adapter's path); with two directories, whether they match, and the columns that differ where they do not.
Adapter weights are compared through `adapter_sha256`, which every table that names an adapter carries.
Exit status 1 when a digest differs.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import polars as pl

# columns that differ between two identical runs: durations and the assets directory's own path
VOLATILE = {"wall_s", "train_seconds", "adapter_path"}


def digests(root: Path) -> dict[str, tuple[str, dict[str, str]]]:
    """{"table/partition": (digest of the rows, {column: digest of that column})}."""
    out = {}
    for f in sorted(root.glob("*/*.parquet")):
        df = pl.read_parquet(f)
        keep = [c for c in df.columns if c not in VOLATILE]
        rows = sorted(json.dumps(r, sort_keys=True, default=str) for r in df.select(keep).to_dicts())
        cols = {c: hashlib.sha256(json.dumps(sorted(map(str, df[c].to_list()))).encode()).hexdigest()[:12]
                for c in keep}
        out[f"{f.parent.name}/{f.stem}"] = (hashlib.sha256("\n".join(rows).encode()).hexdigest()[:16], cols)
    return out


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    a = digests(Path(argv[0]))
    if len(argv) == 1:
        for k, (d, _) in a.items():
            print(f"{k:48s} {d}")
        return 0
    b = digests(Path(argv[1]))
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
