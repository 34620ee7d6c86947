"""Faults 1 and 3: SIGKILL of `spogw run` inside each kind of asset, one kill after another on the same assets
directory, each kill point chosen from the run's own progress lines or the call cache (never a sleep):

0. while the first run holds the lock, a second `spogw run` on the same directory is refused at once, naming
   the holder's pid and the fix;
1. during sampling (sampled_workflows[0000] has started generating);
2. mid-way through execution_scores[0000] (some executor calls made: rows in the call cache);
3. mid-epoch in training (lora_checkpoint[0000]'s optimizer step 1 has started, and not finished);
4. during the report (benchmark_report[0000] is generating held-out workflows).

Each rerun marks the killed run failed, sweeps the temporary files, keeps the assets the killed run finished
(it resumes at the first asset that is not materialized with the current code and inputs: `loop.resume_index`)
and goes on; the last one completes both iterations. Asserted after every kill: only complete partitions are
visible, none of the killed asset. At the end: every table and adapter equals the undisturbed run's (rows and
content hashes), no temporary file is left, the catalog agrees with the Parquet files, the executor calls made
over all runs (those of finished materializations plus those the killed execution_scores made, which the call
cache kept) equal the undisturbed run's (none repeated), and the finished assets were not run again."""

from __future__ import annotations

import time

import pytest

from tests.cli import spogw

from .conftest import (Proc, all_new_calls, cache_rows, catalog_agrees, record, rows_lost_and_duplicated,
                       table_state, temp_files, unreadable_partitions)

pytestmark = [pytest.mark.faults, pytest.mark.model]

ORDER = ("sampled_workflows", "execution_scores", "screened_groups", "sharpened_groups", "lora_checkpoint",
         "benchmark_report")


def _kill_at(args: tuple[str, ...], marker, root, refuse_second: bool = False) -> tuple[Proc, float | None]:
    p = Proc(*args)
    refused_s = None
    try:
        if refuse_second:
            p.wait_line(lambda s: s.startswith("spogw run:"), timeout=300)  # printed with the lock held
            t0 = time.monotonic()
            second = spogw(*args, timeout=300)
            refused_s = time.monotonic() - t0
            err = second.stderr
            assert second.returncode == 2, second.stdout + err
            assert f"pid {p.pid}" in err and "is locked by another run" in err and "--assets-dir" in err, err
            assert "Traceback" not in err and p.p.poll() is None
        p.wait_line(marker, timeout=900)
        if marker is EXECUTING:  # some executor calls made (or the asset already over: then kill at once)
            while cache_rows(root) == 0 and p.p.poll() is None and "[0000] screened_groups" not in p.text():
                time.sleep(0.05)  # polling a condition, not a fixed wait
    finally:
        p.kill_group()
    assert p.p.returncode == -9, p.text()[-3000:]
    return p, refused_s


def EXECUTING(s: str) -> bool:
    return "[0000] execution_scores" in s and "executing" in s


def test_sigkill_inside_each_kind_of_asset_then_the_rerun_resumes(undisturbed, tmp_path):
    root = tmp_path / "assets"
    args = ("run", "--profile", "ci", "--assets-dir", str(root))
    kills = [
        ("sampling", lambda s: "[0000] sampled_workflows" in s and "sampling" in s, set()),
        ("execution_scores, some executor calls made", EXECUTING, {"sampled_workflows"}),
        ("training, mid-epoch", lambda s: "[0000] lora_checkpoint" in s and "optimizer step 1/" in s and "started" in s,
         {"sampled_workflows", "execution_scores", "screened_groups", "sharpened_groups"}),
        ("report", lambda s: "[0000] benchmark_report" in s and "generating" in s,
         {"sampled_workflows", "execution_scores", "screened_groups", "sharpened_groups", "lora_checkpoint",
          "training_rows"}),  # lora_checkpoint's side table, written after its adapter
    ]
    figures, outputs, killed_calls, kept = {}, [], 0, set()
    for i, (phase, marker, visible_after) in enumerate(kills):
        before = cache_rows(root)
        p, refused_s = _kill_at(args, marker, root, refuse_second=i == 0)
        if refused_s is not None:
            record("second `spogw run` on the same assets directory", survived=True, refused_in_s=round(refused_s, 1),
                   rows_lost=0, rows_duplicated=0)
        outputs.append(p.text())
        if i:  # this run started after a kill: it said so, and resumed where the killed one stopped
            assert "ended without finishing" in p.text(), p.text()[-3000:]
            if kept:
                first = ORDER[len(kept - {"training_rows"})]
                assert f"resuming at {first}" in p.text(), p.text()[-3000:]
                for a in kept & set(ORDER):  # finished assets were not run again
                    assert f"[0000] {a:<17}" not in p.text(), (a, p.text()[-3000:])
        assert unreadable_partitions(root) == []
        state = table_state(root)
        have = {t for t, parts in state.items() if "0000" in parts} - {"lora_checkpoint_adapter"}
        if marker is EXECUTING and "execution_scores" in have:  # it was over before the first call was cached
            phase = "just after execution_scores"
            visible_after = set(ORDER[:len(have)])
        elif marker is EXECUTING:  # the calls the killed step made: in the cache, in no materialization
            killed_calls = cache_rows(root) - before
        # the killed asset is absent; what finished before it is there (lora_checkpoint has its table and adapter)
        assert have == visible_after, (phase, have)
        kept = have
        figures[phase] = {"temp_files_left_by_kill": len(temp_files(root)), "cache_rows_at_kill": cache_rows(root)}
    for phase in figures:
        if phase.startswith("execution_scores"):
            figures[phase]["executor_calls_before_kill"] = killed_calls

    last = spogw(*args, timeout=900)
    assert last.returncode == 0, last.stdout[-3000:] + last.stderr[-3000:]
    assert "ended without finishing" in last.stdout and "resuming at benchmark_report" in last.stdout, last.stdout
    state = table_state(root)
    assert state == undisturbed["state"]
    lost, dup = rows_lost_and_duplicated(state, undisturbed["state"])
    assert temp_files(root) == []
    catalog_agrees(root)
    # executor calls: every call any run made is counted in the materialization that made it, or (the killed
    # execution_scores) in the cache rows it left; all of them together are the undisturbed run's calls
    made = all_new_calls(root) + killed_calls
    assert all_new_calls(undisturbed["root"]) == undisturbed["cache_rows"]  # the count is what the cache holds
    assert cache_rows(root) == undisturbed["cache_rows"]
    repeated = made - undisturbed["cache_rows"]
    assert repeated == 0, (made, undisturbed["cache_rows"])
    for phase, f in figures.items():
        record(f"SIGKILL of `spogw run` during {phase}, then rerun", survived=True, rows_lost=lost,
               rows_duplicated=dup, executor_calls_repeated=repeated, **f)
