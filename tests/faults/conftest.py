"""The fault matrix's shared pieces: the real `spogw` CLI as a subprocess, one undisturbed `ci` run per session
(its table hashes are what every disturbed run must reproduce), and the data checks every case makes:
row counts and content hashes per partition, no temporary or half-written file, the DuckDB catalog opens and
agrees with the Parquet files. Figures (faults tried, rows lost / duplicated, executor calls repeated) go to
test-artifacts/fault_matrix.json."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import polars as pl
import pytest

from tests.cli import SPOGW, cli_env

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
# how a value was obtained, not what it is (timings, cache hits, reuse of an identical training run)
VOLATILE = {"wall_s", "cached_calls", "train_seconds", "reused", "latency_s", "built_at"}
FIGURES: dict[str, dict] = {}


def pytest_configure(config):
    config.addinivalue_line("markers", "faults: the fault matrix (tests/faults): crashes, locks, damaged inputs")


class Proc:
    """A `spogw` subprocess whose output lines are collected as they come (to pick kill points from them)."""

    def __init__(self, *args: str):
        self.p = subprocess.Popen([SPOGW, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  env=cli_env(), start_new_session=True)
        self.lines: list[str] = []
        self.eof = False
        self._cv = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    @property
    def pid(self) -> int:
        return self.p.pid

    def _read(self) -> None:
        for line in self.p.stdout:
            with self._cv:
                self.lines.append(line.rstrip("\n"))
                self._cv.notify_all()
        with self._cv:
            self.eof = True
            self._cv.notify_all()

    def wait_line(self, pred, timeout: float = 600) -> str:
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cv:
            while True:
                for line in self.lines[seen:]:
                    if pred(line):
                        return line
                seen = len(self.lines)
                if self.eof:
                    raise AssertionError("process ended before the expected line:\n" + self.text())
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError("timed out waiting for a line:\n" + self.text())
                self._cv.wait(left)

    def text(self) -> str:
        return "\n".join(self.lines)

    def kill_group(self) -> None:
        """SIGKILL the process, then whatever it started (the sandbox's children), then reap it."""
        with _suppress():
            os.kill(self.p.pid, signal.SIGKILL)
        self.p.wait(30)
        with _suppress():
            os.killpg(self.p.pid, signal.SIGKILL)


class _suppress:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return exc[0] is not None and issubclass(exc[0], (ProcessLookupError, PermissionError))


# ------------------------------------------------------------------ the data checks


def _frame_hash(df: pl.DataFrame, root: Path, also: tuple[Path, ...] = ()) -> str:
    f = df.drop([c for c in df.columns if c in VOLATILE])
    if "metric" in f.columns:
        f = f.filter(~pl.col("metric").is_in(["cached_calls"]))
    # absolute paths name the assets directory (or, in rows a copy kept, the one copied): compare them relative
    for r in (root, *also):
        f = f.with_columns([pl.col(c).str.replace_all(str(r), "<assets>", literal=True)
                            for c, t in f.schema.items() if t == pl.String])
    h = hashlib.sha256(repr([(c, str(t)) for c, t in f.schema.items()]).encode())
    if f.width and f.height:  # order-insensitive: the multiset of row hashes
        h.update(sorted(f.hash_rows(seed=0, seed_1=1, seed_2=2, seed_3=3).to_list()).__repr__().encode())
    return h.hexdigest()[:16]


def table_state(root: Path, partitions: tuple[str, ...] | None = None,
                also: tuple[Path, ...] = ()) -> dict[str, dict[str, tuple[int, str]]]:
    """{table: {partition: (rows, content hash)}} for every table of the assets directory, plus each
    adapter's weights hash under lora_checkpoint_adapter. `also`: assets directories this one was copied from
    (their paths in its rows count as its own)."""
    from spogw_dagster.pipeline.data.storage import AssetStore

    store = AssetStore(root)
    out: dict[str, dict[str, tuple[int, str]]] = {}
    for t in store.tables():
        for part in store.partitions(t):
            if partitions is None or part in partitions:
                df = store.read_parquet(t, part)
                out.setdefault(t, {})[part] = (df.height, _frame_hash(df, store.root, also))
    d = store.table_dir("lora_checkpoint")
    for a in sorted(d.iterdir()) if d.is_dir() else []:
        if a.is_dir() and (partitions is None or a.name in partitions) and (a / "adapter_model.safetensors").is_file():
            w = hashlib.sha256((a / "adapter_model.safetensors").read_bytes()).hexdigest()[:16]
            out.setdefault("lora_checkpoint_adapter", {})[a.name] = (1, w)
    return out


def temp_files(root: Path) -> list[str]:
    """Temporary or half-written entries: what atomic writes and folder swaps use (never a final name)."""
    bad = []
    for p in root.rglob("*"):
        rel = p.relative_to(root)
        if rel.parts[0] == ".dagster":
            continue
        if p.name.startswith((".tmp", ".trash")) or p.name.endswith(".part"):
            bad.append(str(rel))
    return sorted(bad)


def unreadable_partitions(root: Path) -> list[str]:
    from spogw_dagster.pipeline.data.storage import AssetStore

    store = AssetStore(root)
    return [f"{t}[{p}]" for t in store.tables() for p in store.partitions(t) if not store.readable(t, p)]


def catalog_agrees(root: Path) -> None:
    """The catalog opens read-only and every view holds per iteration exactly the rows of the Parquet files."""
    import duckdb

    from spogw_dagster.pipeline.data.storage import AssetStore

    store = AssetStore(root)
    con = duckdb.connect(str(store.catalog_path), read_only=True)
    try:
        views = {r[0] for r in con.execute("select view_name from duckdb_views() where not internal").fetchall()}
        for t in store.tables():
            parts = store.partitions(t)
            files = {int(p): store.read_parquet(t, p).height for p in parts}
            if not parts:
                assert t not in views, t
                continue
            assert t in views, (t, views)
            got = dict(con.execute(f"select iteration, count(*) from {t} group by 1").fetchall())
            assert got == {k: v for k, v in files.items() if v}, (t, got, files)
    finally:
        con.close()


def cache_rows(root: Path, before: float | None = None) -> int:
    p = root / "call_cache.sqlite"
    if not p.exists():
        return 0
    con = sqlite3.connect(f"file:{p}?mode=ro", uri=True)
    try:
        if before is None:
            return int(con.execute("select count(*) from calls").fetchone()[0])
        return int(con.execute("select count(*) from calls where created_at <= ?", (before,)).fetchone()[0])
    except sqlite3.OperationalError:  # being created by the writer: no table yet
        return 0
    finally:
        con.close()


def new_calls(root: Path, partition: str) -> int:
    """Executor calls that went to the executor (cache misses) in the latest materialization of each asset of
    `partition`, from the assets directory's own Dagster instance (where `spogw run` records them)."""
    import dagster as dg
    from dagster._core.instance.ref import InstanceRef

    from spogw_dagster.pipeline.defs.assets import ASSET_NAMES

    total = 0
    with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(root / ".dagster"))) as inst:
        for a in ASSET_NAMES:
            recs = inst.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=dg.AssetKey(a), asset_partitions=[partition]), limit=1).records
            if recs:
                md = recs[0].asset_materialization.metadata
                if "executor_new_calls" in md:
                    total += int(md["executor_new_calls"].value)
    return total


def all_new_calls(root: Path, home: Path | None = None) -> int:
    """Executor calls (cache misses) of every materialization the instance at `home` (default: the assets
    directory's own) holds, all partitions, all runs (killed runs' finished assets included)."""
    import dagster as dg
    from dagster._core.instance.ref import InstanceRef

    from spogw_dagster.pipeline.defs.assets import ASSET_NAMES

    total = 0
    with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home or root / ".dagster"))) as inst:
        for a in ASSET_NAMES:
            for rec in inst.fetch_materializations(dg.AssetRecordsFilter(asset_key=dg.AssetKey(a)), limit=10_000).records:
                md = rec.asset_materialization.metadata
                if "executor_new_calls" in md:
                    total += int(md["executor_new_calls"].value)
    return total


def copy_assets(src: Path, dst: Path) -> Path:
    """A private copy of an assets directory (without its Dagster instance) for one destructive case."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".dagster"))
    return dst


def record(case: str, **figures) -> None:
    FIGURES[case] = figures


@pytest.fixture(scope="session")
def undisturbed(ci_cli_run):
    """The session's one `spogw run --profile ci` (tests/conftest.py::ci_cli_run): the reference. Never written
    to: a case that changes assets works on a copy (copy_assets)."""
    root = ci_cli_run["root"]
    rep0 = (root / "benchmark_report" / "0000.parquet").stat().st_mtime
    ref = {"root": root, "wall_s": ci_cli_run["wall_s"], "state": table_state(root),
           "cache_rows_it0": cache_rows(root, before=rep0), "cache_rows": cache_rows(root),
           "new_calls_it0": new_calls(root, "0000")}
    assert temp_files(root) == []
    catalog_agrees(root)
    return ref


def rows_lost_and_duplicated(got: dict, want: dict) -> tuple[int, int]:
    """Rows missing from / in excess of the reference, over the partitions `got` holds."""
    lost = dup = 0
    for t, parts in want.items():
        for p, (n, _) in parts.items():
            m = got.get(t, {}).get(p, (0, ""))[0]
            lost += max(0, n - m)
            dup += max(0, m - n)
    return lost, dup


def pytest_sessionfinish(session, exitstatus):
    if FIGURES:
        with _suppress_os():
            ARTIFACTS.mkdir(exist_ok=True)
            (ARTIFACTS / "fault_matrix.json").write_text(json.dumps(FIGURES, indent=2, sort_keys=True))


class _suppress_os:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return exc[0] is not None and issubclass(exc[0], OSError)
