"""Storage: atomic Parquet partitions, the DuckDB catalog, the IO manager, and readers in other processes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import dagster as dg
import polars as pl
import pytest

from spogw_dagster.pipeline.data import catalog
from spogw_dagster.pipeline.data.catalog import query, refresh_catalog
from spogw_dagster.pipeline.defs.io_manager import ParquetIOManager
from spogw_dagster.pipeline.data.storage import AssetStore, write_parquet_atomic


def _frame(it: int, n: int, v: int) -> pl.DataFrame:
    return pl.DataFrame({"iteration": [it] * n, "v": [v] * n, "s": [f"row{i}" for i in range(n)]})


def test_partition_write_replaces_never_appends(tmp_path):
    store = AssetStore(tmp_path)
    store.write_parquet("execution_scores", "0000", _frame(0, 5, 1))
    store.write_parquet("execution_scores", "0000", _frame(0, 3, 2))
    assert store.read_parquet("execution_scores", "0000").height == 3
    assert store.partitions("execution_scores") == ["0000"]
    assert [p.name for p in (tmp_path / "execution_scores").iterdir()] == ["0000.parquet"]  # no temp files left
    with pytest.raises(ValueError, match="iteration"):
        store.write_parquet("execution_scores", "0001", pl.DataFrame({"x": [1]}))
    with pytest.raises(FileNotFoundError, match="materialize execution_scores for iteration 0007"):
        store.read_parquet("execution_scores", "0007")


def test_failed_write_leaves_the_old_file(tmp_path, monkeypatch):
    p = tmp_path / "t" / "0000.parquet"
    write_parquet_atomic(_frame(0, 2, 1), p)

    def boom(self, *a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(pl.DataFrame, "write_parquet", boom)
    with pytest.raises(OSError):
        write_parquet_atomic(_frame(0, 9, 9), p)
    monkeypatch.undo()
    assert pl.read_parquet(p).height == 2
    assert sorted(x.name for x in p.parent.iterdir()) == ["0000.parquet"]


def test_catalog_views_follow_new_partitions_and_tables(tmp_path):
    store = AssetStore(tmp_path)
    store.write_parquet("execution_scores", "0000", _frame(0, 2, 1))
    assert refresh_catalog(store) is True
    assert refresh_catalog(store) is False  # nothing new: the catalog is left alone
    store.write_parquet("execution_scores", "0001", _frame(1, 3, 2))
    assert query(store, "select count(*) from execution_scores") == [(2,)]  # not until the refresh
    assert refresh_catalog(store) is True
    assert query(store, "select iteration, count(*) from execution_scores group by 1 order by 1") == [(0, 2), (1, 3)]
    store.write_parquet("benchmark_report", "0000", pl.DataFrame({"iteration": [0], "solve_rate": [0.5]}))
    assert refresh_catalog(store) is True  # a new table gets its view
    assert query(store, "select solve_rate from benchmark_report") == [(0.5,)]
    views = {r[0] for r in query(store, "select view_name from catalog_info")}
    assert views == {"execution_scores", "benchmark_report"}


def test_catalog_reads_immutable_snapshots_and_collects_old_ones(tmp_path, monkeypatch):
    store = AssetStore(tmp_path)
    store.write_parquet("execution_scores", "0000", _frame(0, 2, 1))
    refresh_catalog(store)
    snaps = sorted((tmp_path / ".snapshots" / "execution_scores").iterdir())
    assert len(snaps) == 1 and snaps[0].stat().st_ino == store.parquet_path("execution_scores", "0000").stat().st_ino
    store.write_parquet("execution_scores", "0000", _frame(0, 7, 1))  # a rerun replaces the partition
    # until the catalog is refreshed, readers keep the old, complete version
    assert query(store, "select count(*) from execution_scores") == [(2,)]
    assert refresh_catalog(store) is True
    assert query(store, "select count(*) from execution_scores") == [(7,)]
    assert len(list((tmp_path / ".snapshots" / "execution_scores").iterdir())) == 2  # the old one within grace
    monkeypatch.setattr(catalog, "GRACE_S", 0.0)
    refresh_catalog(store)
    assert len(list((tmp_path / ".snapshots" / "execution_scores").iterdir())) == 1
    assert query(store, "select count(*) from execution_scores") == [(7,)]


def test_io_manager_round_trip_and_metadata(tmp_path):
    @dg.asset(partitions_def=dg.StaticPartitionsDefinition(["0000", "0001"]), io_manager_key="io_manager")
    def execution_scores(context) -> pl.DataFrame:
        return _frame(int(context.partition_key), 4, 1)

    @dg.asset(partitions_def=dg.StaticPartitionsDefinition(["0000", "0001"]), io_manager_key="io_manager")
    def screened_groups(execution_scores: pl.DataFrame) -> pl.DataFrame:
        return execution_scores.head(1)

    res = dg.materialize([execution_scores, screened_groups], partition_key="0001",
                         resources={"io_manager": ParquetIOManager(assets_dir=str(tmp_path))})
    assert res.success
    md = res.get_asset_materialization_events()[0].materialization.metadata
    assert md["dagster/row_count"].value == 4 and md["path"].value.endswith("execution_scores/0001.parquet")
    store = AssetStore(tmp_path)
    assert store.read_parquet("screened_groups", "0001").height == 1
    assert query(store, "select count(*) from screened_groups where iteration = 1") == [(1,)]


READER = textwrap.dedent("""
    import json, sys, time, duckdb
    catalog, seconds = sys.argv[1], float(sys.argv[2])
    end = time.time() + seconds
    while time.time() < end:
        try:
            con = duckdb.connect(catalog, read_only=True)
            rows = con.execute("select iteration, count(*), sum(v) from execution_scores group by 1 order by 1").fetchall()
            con.close()
            print(json.dumps({"rows": rows}), flush=True)
        except Exception as e:
            print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
""")


def test_duckdb_reader_in_another_process_sees_consistent_partitions(tmp_path):
    """While partition 0001 is rewritten over and over (and the catalog itself rebuilt), a reader process
    only ever sees the old or the new partition in full, and never an error."""
    store = AssetStore(tmp_path)
    small, big = _frame(1, 40_000, 1), _frame(1, 120_000, 2)
    store.write_parquet("execution_scores", "0000", _frame(0, 1000, 5))
    store.write_parquet("execution_scores", "0001", small)
    refresh_catalog(store)
    reader = subprocess.Popen([sys.executable, "-c", READER, str(store.catalog_path), "6"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    writes = 0
    t_end = time.time() + 6
    while time.time() < t_end:
        store.write_parquet("execution_scores", "0001", big if writes % 2 == 0 else small)
        writes += 1
        if writes % 5 == 0:
            refresh_catalog(store, force=True)  # the catalog file is replaced under the reader too
    out, err = reader.communicate(timeout=60)
    results = [json.loads(line) for line in out.splitlines() if line.strip()]
    errors = [r["error"] for r in results if "error" in r]
    assert not errors, errors[:3]
    assert len(results) >= 5 and writes >= 5, (len(results), writes, err)
    allowed = {(1, 40_000, 40_000), (1, 120_000, 240_000)}
    for r in results:
        rows = [tuple(x) for x in r["rows"]]
        assert rows[0] == (0, 1000, 5000)
        assert rows[1] in allowed, rows


def test_pid_alive_sees_zombies_and_reused_pids_as_dead():
    """What `close_orphaned_runs` relies on: a SIGKILLed worker its parent has not reaped yet (a zombie) is dead,
    and a live pid whose start time is not the recorded one is another process."""
    import os
    import signal
    import subprocess
    import time

    from spogw_dagster.fsutil import pid_alive, process_start

    child = subprocess.Popen(["sleep", "60"])
    start = process_start(child.pid)
    assert start is not None and pid_alive(child.pid) and pid_alive(child.pid, start)
    assert not pid_alive(child.pid, str(int(start) + 1))  # same pid, another start: a reused pid
    os.kill(child.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while pid_alive(child.pid) and time.monotonic() < deadline:  # not reaped: a zombie until wait()
        time.sleep(0.01)
    assert not pid_alive(child.pid)
    assert open(f"/proc/{child.pid}/stat").read().split(") ")[1][0] == "Z"  # still there, as a zombie
    child.wait()
    assert not pid_alive(child.pid) and process_start(child.pid) is None


def test_the_tables_are_the_folders_of_iteration_partitions(tmp_path):
    """The data layer names no asset: the catalog's tables are the folders that hold `<k>.parquet` partitions;
    not the report's cache (files named by content), the adapters' folders or hidden ones."""
    store = AssetStore(tmp_path)
    store.write_parquet("execution_scores", "0000", _frame(0, 2, 1))
    store.write_parquet("my_new_table", "0001", _frame(1, 1, 1))
    write_parquet_atomic(_frame(0, 1, 1), tmp_path / "report_cache" / "baseline-0123abcd.parquet")
    write_parquet_atomic(_frame(0, 1, 1), tmp_path / ".snapshots" / "0000.parquet")
    (tmp_path / "splits").mkdir()
    assert store.tables() == ["execution_scores", "my_new_table"]
    refresh_catalog(store)
    assert {r[0] for r in query(store, "select view_name from catalog_info")} == {"execution_scores", "my_new_table"}
