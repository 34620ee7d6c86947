"""Faults 1 and 3: two `spogw run` on one assets directory (the second is refused, naming the holder's pid and
the fix), and SIGKILL of the first during execution_scores of iteration 0, chosen from its progress lines;
the rerun completes, repeats no executor call already made and reproduces the undisturbed run's iteration 0
byte for byte (content hashes), leaving no temporary file."""

from __future__ import annotations

import time

import pytest

from .conftest import (Proc, cache_rows, catalog_agrees, new_calls, record, rows_lost_and_duplicated, spogw,
                       table_state, temp_files, unreadable_partitions)

pytestmark = [pytest.mark.faults, pytest.mark.model]


def test_second_launch_is_refused_then_sigkill_mid_execution_then_rerun_completes(undisturbed, tmp_path):
    root = tmp_path / "assets"
    args = ("run", "--profile", "ci", "--iterations", "1", "--assets-dir", str(root))
    first = Proc(*args)
    try:
        first.wait_line(lambda s: s.startswith("spogw run:"), timeout=300)  # printed with the lock held
        # 1. a second launch on the same directory: refused at once, naming the holder and the fix
        t0 = time.monotonic()
        second = spogw(*args, timeout=300)
        assert second.returncode == 2, second.stdout + second.stderr
        err = second.stderr
        assert f"pid {first.pid}" in err and "is locked by another run" in err and "--assets-dir" in err, err
        assert "Traceback" not in err and first.p.poll() is None
        refused_s = time.monotonic() - t0

        # 3. SIGKILL during execution_scores of iteration 0, once it has made executor calls (or finished it)
        first.wait_line(lambda s: "[0000] execution_scores" in s and "executing" in s, timeout=600)
        while (cache_rows(root) == 0 and first.p.poll() is None
               and not any("[0000] screened_groups" in s for s in first.lines)):
            time.sleep(0.05)  # polling a condition (cache rows), not a fixed wait
        phase = "after screened_groups started" if any("[0000] screened_groups" in s for s in first.lines) \
            else "during execution_scores"
        first.kill_group()
    finally:
        if first.p.poll() is None:
            first.kill_group()
    assert first.p.returncode == -9
    rows_at_kill = cache_rows(root)
    left_by_kill = temp_files(root)
    # what the killed run left: only complete partitions are visible (sampled_workflows), none half-written
    assert unreadable_partitions(root) == []
    visible = table_state(root)
    assert set(visible) <= {"sampled_workflows"}, visible
    assert not (root / "execution_scores" / "0000.parquet").exists()

    rerun = spogw(*args, timeout=900)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert "ended without finishing" in rerun.stdout  # the killed run is marked failed, with the reason
    state = table_state(root)
    want = {t: {p: v for p, v in parts.items() if p == "0000"} for t, parts in undisturbed["state"].items()}
    want = {t: parts for t, parts in want.items() if parts}
    assert state == want
    lost, dup = rows_lost_and_duplicated(state, want)
    assert temp_files(root) == []
    catalog_agrees(root)
    # executor calls: those finished before the kill are served from the cache, never made again
    rerun_new = new_calls(root, "0000")
    repeated = rows_at_kill + rerun_new - undisturbed["new_calls_it0"]
    assert repeated == 0, (rows_at_kill, rerun_new, undisturbed["new_calls_it0"])
    assert cache_rows(root) == undisturbed["cache_rows_it0"]
    record("concurrent launch", survived=True, refused_in_s=round(refused_s, 1), rows_lost=0, rows_duplicated=0)
    record("SIGKILL mid execution_scores", survived=True, kill_phase=phase, executor_calls_before_kill=rows_at_kill,
           executor_calls_rerun=rerun_new, executor_calls_repeated=repeated, temp_files_left_by_kill=left_by_kill,
           rows_lost=lost, rows_duplicated=dup)
