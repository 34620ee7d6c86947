"""The DuckDB catalog: `assets/spogw.duckdb` holds one view per table over that table's Parquet partitions.

    duckdb assets/spogw.duckdb "select iteration, status, avg(score) from execution_scores group by all"
    duckdb assets/spogw.duckdb "select step, mode, metric, value, ci_low, ci_high from learning_curve order by all"
    duckdb assets/spogw.duckdb "select objective, count(*) from training_rows group by 1"

Tables: every table the assets directory holds (`AssetStore.tables()`: each asset and side table, e.g.
`training_rows`, the rows each lora_checkpoint trained on), found from the files, so this layer names none.

Consistency while a run writes. Atomic renames alone are not enough for DuckDB: a query opens a Parquet
file more than once (schema and footer when it binds, data when it runs), so a file replaced between the
two opens is read as a mix of old footer and new data ("TProtocolException: Invalid data" — our
cross-process test caught it). So the views never name the files a run replaces. Each refresh hard-links
every current partition file into `assets/.snapshots/<table>/` under a unique name (no copy: same inode;
a copy only where hard links are refused) and points the views at those immutable names. A refresh
writes the new catalog into a temporary file and renames it over the old one, under a lock file, so:

- a reader never waits for a write lock and never sees a half-built catalog;
- a query sees, for every table, one complete version of each partition (the one current when the catalog
  it opened was built), never a half-written or a mixed file;
- a connection opened before a refresh keeps its older, still consistent view; snapshot links that no
  catalog names any more are deleted after `GRACE_S` (an hour), so a connection older than that should be
  reopened.

A partition file that is not readable Parquet (damaged outside the pipeline) is left out of the views with a
warning naming it (and listed under "damaged" in `.catalog.json`), so one bad file never breaks every query.

The IO manager refreshes the catalog after every partition it writes; `spogw catalog` rebuilds it by hand
(e.g. after moving the assets directory: the views hold absolute paths). For ad-hoc reads of the partition
files themselves use `assets/<table>/*.parquet` (what the IO manager writes; fine when no run is writing).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from spogw_dagster.pipeline.data.storage import AssetStore

log = logging.getLogger(__name__)

SIDE_FILE = ".catalog.json"
SNAP_DIR = ".snapshots"
GRACE_S = 3600.0


def _sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def view_sql(table: str, files: list[str]) -> str:
    listed = ", ".join(_sql_str(f) for f in files)
    return f"CREATE OR REPLACE VIEW {table} AS SELECT * FROM read_parquet([{listed}], union_by_name = true)"


# The checkpoint of every iteration plus the base model (step -1: π_{k-1} of the first report) in the long
# report format: `select step, mode, metric, value, ci_low, ci_high from learning_curve order by all`.
LEARNING_CURVE_SQL = """
CREATE OR REPLACE VIEW learning_curve AS
SELECT iteration AS step, * FROM benchmark_report WHERE kind = 'checkpoint'
UNION ALL BY NAME
SELECT -1 AS step, * FROM benchmark_report
WHERE kind = 'previous' AND system = 'base' AND iteration = (SELECT min(iteration) FROM benchmark_report)
"""


def _has_column(con, view: str, column: str) -> bool:
    return column in [r[0] for r in con.execute(f"DESCRIBE {view}").fetchall()]


@contextlib.contextmanager
def _lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _load_state(side: Path) -> dict[str, Any]:
    try:
        d = json.loads(side.read_text())
        return d if isinstance(d, dict) else {}
    except (OSError, ValueError):
        return {}


def _snapshot(store: AssetStore, table: str, partition: str) -> dict[str, Any]:
    """Hard-link the current partition file to a new immutable name; returns its record."""
    src = store.parquet_path(table, partition)
    d = store.root / SNAP_DIR / table
    d.mkdir(parents=True, exist_ok=True)
    snap = d / f"{partition}-{time.time_ns()}-{uuid.uuid4().hex[:8]}.parquet"
    try:
        os.link(src, snap)
    except OSError:  # no hard links here (another filesystem, a restrictive mount): copy instead
        tmp = d / f".tmp-{uuid.uuid4().hex[:8]}.part"
        shutil.copy2(src, tmp)
        os.replace(tmp, snap)
    st = snap.stat()
    return {"snap": str(snap.relative_to(store.root)), "ino": st.st_ino, "mtime_ns": st.st_mtime_ns,
            "size": st.st_size}


def _same_file(store: AssetStore, table: str, partition: str, rec: dict[str, Any] | None) -> bool:
    if not rec or not (store.root / rec["snap"]).is_file():
        return False
    try:
        st = store.parquet_path(table, partition).stat()
    except FileNotFoundError:
        return False
    return (st.st_ino, st.st_mtime_ns, st.st_size) == (rec["ino"], rec["mtime_ns"], rec["size"])


def refresh_catalog(store: AssetStore, *, force: bool = False) -> bool:
    """Bring the catalog up to date with the partition files. Returns True if it was rebuilt."""
    side = store.root / SIDE_FILE
    with _lock(store.root / ".catalog.lock"):
        old = _load_state(side)
        if old.get("root") != str(store.root):
            old = {}
        old_files: dict[str, dict[str, Any]] = old.get("files", {})
        files: dict[str, dict[str, Any]] = {}
        damaged: list[str] = []
        for table in store.tables():
            for part in store.partitions(table):
                rec = old_files.get(table, {}).get(part)
                if _same_file(store, table, part, rec):
                    files.setdefault(table, {})[part] = rec
                elif store.readable(table, part):
                    files.setdefault(table, {})[part] = _snapshot(store, table, part)
                else:  # a damaged file must not break every view: left out, and said so
                    damaged.append(str(store.parquet_path(table, part)))
        if damaged:
            log.warning("DuckDB catalog: left out %d damaged partition file(s) (not readable Parquet): %s; "
                        "rematerialize those partitions", len(damaged), ", ".join(damaged))
        changed = files != old_files
        if changed or force or not store.catalog_path.is_file():
            build_catalog(store, {t: [str(store.root / r["snap"]) for _, r in sorted(parts.items())]
                                  for t, parts in files.items()})
        # links no catalog names any more are deleted once nobody can still be reading them
        now = time.time()
        live = {r["snap"] for parts in files.values() for r in parts.values()}
        retired: dict[str, float] = {k: v for k, v in old.get("retired", {}).items() if k not in live}
        for parts in old_files.values():
            for r in parts.values():
                if r["snap"] not in live:
                    retired.setdefault(r["snap"], now)
        snap_root = store.root / SNAP_DIR
        if snap_root.is_dir():  # also orphans of a crashed refresh
            for p in snap_root.glob("*/*.parquet"):
                rel = str(p.relative_to(store.root))
                if rel not in live:
                    retired.setdefault(rel, now)
        for rel, since in list(retired.items()):
            if now - since >= GRACE_S:
                with contextlib.suppress(FileNotFoundError):
                    (store.root / rel).unlink()
                del retired[rel]
        state = {"root": str(store.root), "files": files, "retired": retired, "damaged": damaged}
        tmp = side.with_name(f".tmp-{uuid.uuid4().hex[:8]}{SIDE_FILE}.part")
        tmp.write_text(json.dumps(state, sort_keys=True))
        os.replace(tmp, side)
        return bool(changed or force)


def build_catalog(store: AssetStore, views: dict[str, list[str]]) -> Path:
    """Write a fresh catalog with one view per table over the given files, then rename it into place."""
    import duckdb  # heavy: this module loads at every `spogw` start-up

    store.root.mkdir(parents=True, exist_ok=True)
    tmp = store.root / f".tmp-{uuid.uuid4().hex[:12]}-{store.catalog_path.name}.part"
    try:
        con = duckdb.connect(str(tmp))
        try:
            con.execute("CREATE TABLE catalog_info (view_name VARCHAR, partitions INTEGER, parquet_dir VARCHAR, "
                        "built_at DOUBLE)")
            for t in sorted(views):
                if views[t]:
                    con.execute(view_sql(t, views[t]))
                    con.execute("INSERT INTO catalog_info VALUES (?, ?, ?, ?)",
                                [t, len(views[t]), str(store.table_dir(t)), time.time()])
            if views.get("benchmark_report") and _has_column(con, "benchmark_report", "metric"):
                con.execute(LEARNING_CURVE_SQL)
                con.execute("INSERT INTO catalog_info VALUES (?, ?, ?, ?)",
                            ["learning_curve", len(views["benchmark_report"]), "", time.time()])
            con.execute("CHECKPOINT")
        finally:
            con.close()
        os.replace(tmp, store.catalog_path)
    finally:
        for p in (tmp, Path(str(tmp) + ".wal")):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
    return store.catalog_path


def query(store: AssetStore, sql: str, params: list | None = None):
    """Run a read-only query against the catalog; returns a list of tuples (for tests and the CLI)."""
    import duckdb  # heavy: this module loads at every `spogw` start-up

    con = duckdb.connect(str(store.catalog_path), read_only=True)
    try:
        return con.execute(sql, params or []).fetchall()
    finally:
        con.close()
