"""Where materialized assets live, and atomic writes.

Layout under the assets directory (default ./assets, or SPOGW_ASSETS_DIR):

    <table>/<partition>.parquet          one Parquet file per table (an asset or a side table) and iteration
                                         partition: the folders that hold such files are the tables (`tables()`;
                                         the asset names are the Dagster definitions', `pipeline/defs/assets`)
    lora_checkpoint/<partition>/         the PEFT adapter folder of that iteration
    heldout_results/<partition>.parquet  per-query rows behind benchmark_report (a side table)
    splits/                              the benchmark splits used (JSON)
    call_cache.sqlite                    the executor call cache (reruns are served from it)
    spogw.duckdb                         the DuckDB catalog: one view per table over the Parquet files
    .dagster/                            the persistent Dagster instance `spogw run` uses by default

Writes are atomic: a file is written to a temporary name in the same directory (which never ends in
.parquet, so the catalog's globs never see it), fsynced, then renamed over the target with os.replace. A
reader sees the old file or the new one, never half of one; a re-materialization replaces its partition.

A partition file that is damaged anyway (truncated or overwritten outside the pipeline, a bad disk) is never
read as data: `read_parquet` raises `DamagedPartitionError` naming the file and the fix (rematerialize that
partition), and `readable` tells the loop not to count such a partition as done.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path

import polars as pl

from spogw_dagster.fsutil import atomic_path, pid_alive
from spogw_dagster.pipeline.data.iteration_keys import KEY_WIDTH

CATALOG_FILE = "spogw.duckdb"


class DamagedPartitionError(RuntimeError):
    """A partition file exists but is not readable Parquet."""


def damaged_message(table: str, partition: str, path: Path, err: BaseException) -> str:
    return (f"{table}[{partition}] is damaged: {path} is not readable Parquet ({type(err).__name__}: "
            f"{str(err).strip().splitlines()[0] if str(err).strip() else 'no detail'}). It was changed outside the "
            f"pipeline (the pipeline only ever renames complete files into place). Rematerialize {table} for "
            f"iteration {partition} and the assets after it (`spogw run --force`, or in the UI); deleting the file "
            f"first is safe.")


def default_assets_dir() -> Path:
    return Path(os.environ.get("SPOGW_ASSETS_DIR") or (Path.cwd() / "assets")).expanduser().resolve()


class AssetStore:
    """Paths and atomic IO for one assets directory."""

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root).expanduser().resolve()

    def table_dir(self, table: str) -> Path:
        return self.root / table

    def parquet_path(self, table: str, partition: str) -> Path:
        return self.table_dir(table) / f"{partition}.parquet"

    def adapter_dir(self, partition: str) -> Path:
        return self.table_dir("lora_checkpoint") / partition

    @property
    def catalog_path(self) -> Path:
        return self.root / CATALOG_FILE

    def write_parquet(self, table: str, partition: str, df: pl.DataFrame) -> Path:
        if "iteration" not in df.columns:
            raise ValueError(f"table {table!r} must carry an 'iteration' column (got {df.columns})")
        path = self.parquet_path(table, partition)
        write_parquet_atomic(df, path)
        return path

    def read_parquet(self, table: str, partition: str) -> pl.DataFrame:
        path = self.parquet_path(table, partition)
        if not path.is_file():
            raise FileNotFoundError(
                f"{table}[{partition}] has no data at {path}; materialize {table} for iteration {partition} first")
        try:
            return pl.read_parquet(path)
        except (pl.exceptions.PolarsError, OSError) as e:
            raise DamagedPartitionError(damaged_message(table, partition, path, e)) from e

    def readable(self, table: str, partition: str) -> bool:
        """The partition file exists and its Parquet footer reads (cheap: no data is read)."""
        try:
            pl.read_parquet_schema(self.parquet_path(table, partition))
            return True
        except (pl.exceptions.PolarsError, OSError):
            return False

    def exists(self, table: str, partition: str) -> bool:
        return self.parquet_path(table, partition).is_file()

    def tables(self) -> list[str]:
        """The tables of this assets directory: every folder directly under it that holds iteration partitions
        (`<k>.parquet`, k an iteration key) and whose name can name a view. Not the hidden folders, the adapters'
        or the splits', nor `report_cache/` (Parquet files named by content, not by iteration)."""
        if not self.root.is_dir():
            return []
        return sorted(d.name for d in self.root.iterdir() if d.is_dir() and d.name.isidentifier()
                      and any(_is_partition_key(p) for p in self.partitions(d.name)))

    def partitions(self, table: str) -> list[str]:
        d = self.table_dir(table)
        return sorted(p.stem for p in d.glob("*.parquet")) if d.is_dir() else []


def _is_partition_key(name: str) -> bool:
    return len(name) == KEY_WIDTH and name.isdigit()


# What a writer killed mid-write leaves behind (an atomic write's temp file, an adapter folder being built or
# being swapped out): `.tmp-*` files and folders, `.trash-*` folders. Never a name the catalog's globs match.
_TEMP_NAME = re.compile(r"^\.(tmp|trash)-")
_PID_IN_NAME = re.compile(r"-(\d+)-[0-9a-f]{8}$")


def sweep_temp_files(root: str | os.PathLike[str]) -> list[Path]:
    """Remove what killed writers left under the assets directory (not the Dagster instance's folder). Call it
    only while holding the assets directory's lock (`data.locks.assets_dir_lock`): a temp entry of a live writer is
    part of a write in progress. Folders that name a live pid (the trainer's) are kept regardless."""
    root = Path(root)
    removed: list[Path] = []
    if not root.is_dir():
        return removed
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        if d == root:
            dirnames[:] = [n for n in dirnames if n != ".dagster"]
        for n in list(dirnames):
            if _TEMP_NAME.match(n):
                m = _PID_IN_NAME.search(n)
                if m and (int(m.group(1)) != os.getpid() and pid_alive(int(m.group(1)))):
                    continue
                shutil.rmtree(d / n, ignore_errors=True)
                removed.append(d / n)
                dirnames.remove(n)
        for n in filenames:
            if _TEMP_NAME.match(n):
                try:
                    (d / n).unlink()
                    removed.append(d / n)
                except FileNotFoundError:
                    pass
    return sorted(removed)


def write_parquet_atomic(df: pl.DataFrame, path: str | os.PathLike[str]) -> Path:
    with atomic_path(path) as tmp:
        df.write_parquet(tmp, compression="zstd", statistics=True)
    return Path(path)


# a file cannot be written: read-only, full, over quota, or not ours (EPERM is left alone: the sandbox's own
# refusals are not storage problems)
STORAGE_ERRNOS = {errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EACCES}


def storage_error_text(e: OSError) -> str:
    """One line for an assets directory that cannot be written, with the fix; completed partitions are kept
    (every write is atomic), so the rerun resumes."""
    fix = {errno.ENOSPC: "free space there (`df -h` it; `spogw gc` removes unreferenced adapters)",
           errno.EDQUOT: "free space there or raise the quota"}.get(
        e.errno, "make it writable (mount it read-write, fix its owner or permissions)")
    verb = "access" if e.errno == errno.EACCES else "write"
    return (f"cannot {verb} {e.filename or 'the assets directory'}: {e.strerror}. Fix: {fix}, or pass --assets-dir "
            "on a writable file system with free space; nothing half-written is left, completed partitions are "
            "kept, and the rerun resumes where this stopped")


def storage_trouble(assets_dir) -> str | None:
    """Why the assets directory's file system cannot take writes now (read-only, or under 1 MiB free), with the
    fix; None when it can."""
    given = Path(assets_dir).expanduser() if assets_dir else default_assets_dir()
    p = given
    while not p.exists() and p != p.parent:  # the file system it would be created on
        p = p.parent
    try:
        st = os.statvfs(p)
    except OSError:
        return None
    if st.f_flag & os.ST_RDONLY:
        err = OSError(errno.EROFS, os.strerror(errno.EROFS), str(given))
    elif st.f_bavail * st.f_frsize < 1 << 20:
        err = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(given))
    else:
        return None
    return storage_error_text(err)
