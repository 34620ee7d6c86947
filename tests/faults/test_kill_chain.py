"""Fault 1: SIGKILL of `spogw run` inside each kind of asset, one kill after another on the same assets
directory, each kill point chosen from the run's own progress lines (never a sleep):

1. during sampling (sampled_workflows[0000] has started generating);
2. mid-epoch in training (lora_checkpoint[0000]'s optimizer step 1 has started, and not finished);
3. during the report (benchmark_report[0000] is generating held-out workflows).

Each rerun marks the killed run failed, sweeps the temporary files, keeps the assets the killed run finished
(it resumes at the first asset that is not materialized with the current code and inputs: `loop.resume_index`)
and goes on; the last one completes both iterations. Asserted after every kill: only complete partitions are
visible, none of the killed asset. At the end: every table and adapter equals the undisturbed run's (rows and
content hashes), no temporary file is left, the catalog agrees with the Parquet files, the executor calls made
over all runs equal the undisturbed run's (none repeated), and the finished assets were not run again."""

from __future__ import annotations

import pytest

from .conftest import (Proc, all_new_calls, cache_rows, catalog_agrees, record, rows_lost_and_duplicated, spogw,
                       table_state, temp_files, unreadable_partitions)

pytestmark = [pytest.mark.faults, pytest.mark.model]

ORDER = ("sampled_workflows", "execution_scores", "screened_groups", "sharpened_groups", "lora_checkpoint",
         "benchmark_report")


def _kill_at(args: tuple[str, ...], marker) -> Proc:
    p = Proc(*args)
    try:
        p.wait_line(marker, timeout=900)
    finally:
        p.kill_group()
    assert p.p.returncode == -9, p.text()[-3000:]
    return p


def test_sigkill_while_sampling_training_and_reporting_then_the_rerun_resumes(undisturbed, tmp_path):
    root = tmp_path / "assets"
    args = ("run", "--profile", "ci", "--assets-dir", str(root))
    kills = [
        ("sampling", lambda s: "[0000] sampled_workflows" in s and "sampling" in s, set()),
        ("training, mid-epoch", lambda s: "[0000] lora_checkpoint" in s and "optimizer step 1/" in s and "started" in s,
         {"sampled_workflows", "execution_scores", "screened_groups", "sharpened_groups"}),
        ("report", lambda s: "[0000] benchmark_report" in s and "generating" in s,
         {"sampled_workflows", "execution_scores", "screened_groups", "sharpened_groups", "lora_checkpoint"}),
    ]
    figures, outputs = {}, []
    for i, (phase, marker, visible_after) in enumerate(kills):
        p = _kill_at(args, marker)
        outputs.append(p.text())
        if i:  # this run started after a kill: it said so, and resumed where the killed one stopped
            assert "ended without finishing" in p.text(), p.text()[-3000:]
            kept = kills[i - 1][2]
            if kept:
                first = ORDER[len(kept)]
                assert f"resuming at {first}" in p.text(), p.text()[-3000:]
                for a in kept:  # finished assets were not run again
                    assert f"[0000] {a:<17}" not in p.text(), (a, p.text()[-3000:])
        assert unreadable_partitions(root) == []
        state = table_state(root)
        have = {t for t, parts in state.items() if "0000" in parts} - {"lora_checkpoint_adapter"}
        # the killed asset is absent; what finished before it is there (lora_checkpoint has its table and adapter)
        assert have == visible_after, (phase, have)
        figures[phase] = {"temp_files_left_by_kill": len(temp_files(root)), "cache_rows_at_kill": cache_rows(root)}

    last = spogw(*args, timeout=900)
    assert last.returncode == 0, last.stdout[-3000:] + last.stderr[-3000:]
    assert "ended without finishing" in last.stdout and "resuming at benchmark_report" in last.stdout, last.stdout
    state = table_state(root)
    assert state == undisturbed["state"]
    lost, dup = rows_lost_and_duplicated(state, undisturbed["state"])
    assert temp_files(root) == []
    catalog_agrees(root)
    # executor calls: every call any run made is counted in the materialization that made it (the kills landed
    # before any executor call of the killed asset); all of them together are the undisturbed run's calls
    made = all_new_calls(root)
    assert all_new_calls(undisturbed["root"]) == undisturbed["cache_rows"]  # the count is what the cache holds
    assert cache_rows(root) == undisturbed["cache_rows"]
    repeated = made - undisturbed["cache_rows"]
    assert repeated == 0, (made, undisturbed["cache_rows"])
    for phase, f in figures.items():
        record(f"SIGKILL of `spogw run` during {phase}, then rerun", survived=True, rows_lost=lost,
               rows_duplicated=dup, executor_calls_repeated=repeated, **f)
