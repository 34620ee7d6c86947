"""Fault 5, the assets directory's file system: read-only, and full (a small tmpfs). Each ends in one message
naming the path and the fix, with nothing half-written; after the disk is given room, the rerun resumes and
reproduces the undisturbed run's iteration 0000. Needs root and `mount` (skips saying so otherwise)."""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

import pytest

from tests.cli import spogw

from .conftest import (catalog_agrees, record, rows_lost_and_duplicated, table_state, temp_files,
                       unreadable_partitions)

pytestmark = [pytest.mark.faults, pytest.mark.model]


@contextlib.contextmanager
def _tmpfs(where: Path, *opts: str):
    where.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(("size=2m", *opts)), "tmpfs", str(where)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_read_only_assets_directory_is_one_line_with_the_fix(tmp_path, capsys):
    from spogw_dagster.cli import main

    with _tmpfs(tmp_path / "ro", "ro") as ro:
        root = ro / "assets"
        rc = main(["run", "--profile", "ci", "--assets-dir", str(root)])
        err = capsys.readouterr().err
        assert rc == 2, err
        assert f"cannot write {root}: Read-only file system. Fix: make it writable" in err, err
        assert "--assets-dir" in err and "Traceback" not in err and not root.exists(), err
    record("assets directory on a read-only file system", survived=True, clear_error=True, rows_lost=0,
           rows_duplicated=0)


def test_full_disk_fails_cleanly_and_the_rerun_resumes_once_there_is_room(undisturbed, tmp_path):
    with _tmpfs(tmp_path / "small") as small:
        root = small / "assets"
        args = ("run", "--profile", "ci", "--iterations", "1", "--assets-dir", str(root))
        full = spogw(*args, timeout=900)
        assert full.returncode in (1, 2), full.stdout[-3000:] + full.stderr[-3000:]
        said = full.stdout + full.stderr
        assert "No space left on device" in said and "Fix: free space" in said, said[-3000:]
        failed_at = next((ln.strip().split(":")[0] for ln in full.stdout.splitlines()
                          if "No space left on device" in ln and not ln.startswith(" " * 4)), "the instance")
        # nothing half-written: no temp file, every partition there is complete
        assert temp_files(root) == [] and unreadable_partitions(root) == []
        kept = sorted(t for t, parts in table_state(root).items() if "0000" in parts)

        subprocess.run(["mount", "-o", "remount,size=256m", str(small)], check=True)  # room again
        rerun = spogw(*args, timeout=900)
        assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
        state = table_state(root)
        want = {t: {p: v for p, v in parts.items() if p == "0000"} for t, parts in undisturbed["state"].items()}
        want = {t: parts for t, parts in want.items() if parts}
        assert state == want
        lost, dup = rows_lost_and_duplicated(state, want)
        assert temp_files(root) == []
        catalog_agrees(root)
    record("assets directory out of space (2 MiB tmpfs), then room again", survived=True, failed_at=failed_at,
           partitions_kept=kept, resumed="resuming at" in rerun.stdout, rows_lost=lost, rows_duplicated=dup)
