"""Faults 2 and 4, each on a private copy of the undisturbed run's assets and a real in-process Dagster run of
the `spogw_iteration` job (cheap: one asset of one partition): a replaced parent adapter (provenance), a
damaged Parquet partition, a damaged call cache, a partition key that is not an iteration; and through the
CLI entry point, a bad YAML file, an unknown profile and out-of-range values. Each must fail with a message
naming the file or field and the fix, and change no partition (hashes as before), leaving no temp file."""

from __future__ import annotations

import json
import shutil

import dagster as dg
import polars as pl
import pytest

from spogw_dagster.pipeline.runs.loop import _failure_message
from spogw_dagster.pipeline.defs.partitions import PARTITIONS_NAME
from spogw_dagster.pipeline.defs.sensors import JOB_NAME
from spogw_dagster.pipeline.data.storage import AssetStore
from spogw_dagster.pipeline.defs.wiring import build_definitions

from tests.cli import spogw

from .conftest import (catalog_agrees, copy_assets, record, rows_lost_and_duplicated, table_state, temp_files,
                       unreadable_partitions)

pytestmark = [pytest.mark.faults, pytest.mark.model]


def _materialize(root, key: str, assets: list[str], tmp_path):
    job = build_definitions("ci", assets_dir=root).resolve_job_def(JOB_NAME)
    (tmp_path / "home").mkdir(exist_ok=True)
    with dg.instance_for_test(temp_dir=str(tmp_path / "home")) as inst:
        inst.add_dynamic_partitions(PARTITIONS_NAME, [key])
        return job.execute_in_process(partition_key=key, instance=inst, raise_on_error=False,
                                      asset_selection=[dg.AssetKey(a) for a in assets])


def _unchanged_except(root, ref: dict, skip: set[tuple[str, str]] = frozenset()) -> None:
    got = table_state(root)
    want = {t: {p: v for p, v in parts.items() if (t, p) not in skip} for t, parts in ref.items()}
    got = {t: {p: v for p, v in parts.items() if (t, p) not in skip} for t, parts in got.items()}
    assert got == want
    assert temp_files(root) == []


def test_training_refuses_samples_from_another_parent_adapter(undisturbed, tmp_path):
    root = copy_assets(undisturbed["root"], tmp_path / "assets")
    store = AssetStore(root)
    # checkpoint 0 replaced by a different adapter (e.g. rematerialized with other settings) after iteration 1
    # sampled from it: same shapes, other weights
    from safetensors.torch import load_file, save_file

    w = store.adapter_dir("0000") / "adapter_model.safetensors"
    tensors = load_file(str(w))
    save_file({k: v + 0.01 for k, v in tensors.items()}, str(w))
    # ... and its row says so, as a rematerialization writes it (a folder its row does not match is *damaged*:
    # test_damaged_adapter_is_refused_and_spogw_run_retrains_it)
    from spogw_dagster.pipeline.data.checkpoints import adapter_sha256

    row = store.read_parquet("lora_checkpoint", "0000")
    store.write_parquet("lora_checkpoint", "0000", row.with_columns(
        adapter_sha256=pl.lit(adapter_sha256(store.adapter_dir("0000")))))
    ref = table_state(root)
    res = _materialize(root, "0001", ["lora_checkpoint"], tmp_path)
    assert not res.success
    msg = _failure_message(res)
    assert msg.startswith("lora_checkpoint:"), msg
    assert "sampled_workflows[0001] was sampled from the adapter" in msg and "lora_checkpoint[0000]" in msg, msg
    assert "Rematerialize sampled_workflows[0001]" in msg and "Not training" in msg, msg
    _unchanged_except(root, ref)  # the adapter, lora_checkpoint[0001] and training_rows[0001] untouched
    record("provenance: parent adapter replaced", survived=True, refused=True, rows_lost=0, rows_duplicated=0)


def test_damaged_parquet_partition_is_named_with_the_fix(undisturbed, tmp_path):
    root = copy_assets(undisturbed["root"], tmp_path / "assets")
    store = AssetStore(root)
    path = store.parquet_path("execution_scores", "0000")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # damaged outside the pipeline (in place: the catalog's link too)
    ref = table_state(root, partitions=("0001",))
    assert unreadable_partitions(root) == ["execution_scores[0000]"]
    res = _materialize(root, "0000", ["screened_groups"], tmp_path)
    assert not res.success
    msg = _failure_message(res)
    assert "execution_scores[0000] is damaged" in msg and str(path) in msg, msg
    assert "Rematerialize execution_scores for iteration 0000" in msg and "Traceback" not in msg, msg
    assert table_state(root, partitions=("0001",)) == ref
    assert store.readable("screened_groups", "0000") and temp_files(root) == []
    # `spogw catalog` still builds: the damaged file is left out, every other partition is queryable
    from spogw_dagster.cli import main

    assert main(["catalog", "--assets-dir", str(root)]) == 0
    path.unlink()  # what the message says is safe; the catalog then agrees with the files again
    assert main(["catalog", "--assets-dir", str(root)]) == 0
    catalog_agrees(root)
    record("truncated Parquet partition", survived=True, clear_error=True, rows_lost=0, rows_duplicated=0)


def test_damaged_call_cache_is_named_with_the_fix(undisturbed, tmp_path):
    root = copy_assets(undisturbed["root"], tmp_path / "assets")
    for p in root.glob("call_cache.sqlite*"):
        p.unlink()
    (root / "call_cache.sqlite").write_bytes(b"not a database, a damaged one " * 200)
    ref = table_state(root)
    res = _materialize(root, "0000", ["execution_scores"], tmp_path)
    assert not res.success
    msg = _failure_message(res)
    assert f"call cache {root / 'call_cache.sqlite'} cannot be opened" in msg and "delete the file" in msg, msg
    _unchanged_except(root, ref)
    record("corrupt call cache", survived=True, clear_error=True, rows_lost=0, rows_duplicated=0)


def test_damaged_adapter_is_refused_and_spogw_run_retrains_it(undisturbed, tmp_path):
    """lora_checkpoint[0000]'s weights damaged on disk (bytes flipped; the folder still loads as safetensors
    might not): whatever reads it refuses, naming the file and the fix, and `spogw run` sees the iteration is
    damaged, resumes at lora_checkpoint (the assets before it are intact, with the instance's records) and
    retrains it to the same bytes; iteration 0001, which sampled from those bytes, is kept."""
    from spogw_dagster.pipeline.data.checkpoints import MissingCheckpointError, parent_checkpoint

    root = tmp_path / "assets"
    shutil.copytree(undisturbed["root"], root)  # with its Dagster instance: what resuming reads
    store = AssetStore(root)
    w = store.adapter_dir("0000") / "adapter_model.safetensors"
    data = bytearray(w.read_bytes())
    data[-64] ^= 0xFF
    w.write_bytes(bytes(data))
    with pytest.raises(MissingCheckpointError) as e:  # what sampled_workflows[0001] (and training) would hit
        parent_checkpoint(store, "0001")
    msg = str(e.value)
    assert "lora_checkpoint[0000] is damaged" in msg and str(w) in msg and "Rematerialize lora_checkpoint[0000]" in msg
    res = _materialize(root, "0000", ["benchmark_report"], tmp_path)  # the report of that checkpoint refuses too
    assert not res.success
    msg = _failure_message(res)
    assert "(damaged or replaced): not scoring it" in msg and str(w) in msg, msg

    run = spogw("run", "--profile", "ci", "--assets-dir", str(root), timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = run.stdout
    assert "lora_checkpoint[0000] is missing, damaged or stale: rerunning the iteration from there" in out, out
    assert "resuming at lora_checkpoint" in out and "iteration 0001: benchmark_report exists" in out, out
    assert table_state(root, also=(undisturbed["root"],)) == undisturbed["state"]
    assert temp_files(root) == []
    catalog_agrees(root)
    record("corrupted adapter (lora_checkpoint[0000] weights)", survived=True, clear_error=True,
           resumed_at="lora_checkpoint", rows_lost=0, rows_duplicated=0)


def _malformed(bench: str, kind: str, fx: dict) -> bytes:
    src = fx[bench].read_text()
    if kind == "bad encoding":
        return src.encode("utf-8").replace(b'"', b'\xff"', 1).replace(b"\\xff", b"\xff").replace(
            b'\xff', bytes([0xFF]), 1)
    if kind == "wrong top-level type":
        return {"mbpp": b'"a string"\n', "drop": b"[1, 2]", "hotpotqa": b'{"not": "a list"}'}[bench]
    if bench == "mbpp":  # missing field
        rows = [json.loads(x) for x in src.splitlines() if x.strip()]
        rows[0].pop("test_list")
        return "".join(json.dumps(r) + "\n" for r in rows).encode()
    data = json.loads(src)
    if bench == "drop":
        next(iter(data.values())).pop("qa_pairs")
    else:
        data[0].pop("answer")
    return json.dumps(data).encode()


@pytest.mark.parametrize("bench,kind,expect", [
    ("mbpp", "wrong top-level type", "line 1 is a JSON str, expected a JSON object per line"),
    ("mbpp", "missing field", "has no field 'test_list'"),
    ("mbpp", "bad encoding", "is not UTF-8 text"),
    ("drop", "wrong top-level type", "holds a JSON list; expected DROP JSON"),
    ("drop", "missing field", "'qa_pairs'"),
    ("drop", "bad encoding", "is not UTF-8 text"),
    ("hotpotqa", "wrong top-level type", "holds a JSON dict"),
    ("hotpotqa", "missing field", "'answer'"),
    ("hotpotqa", "bad encoding", "is not UTF-8 text"),
])
def test_malformed_benchmark_file_is_refused_before_anything_is_written(tmp_path, capsys, bench, kind, expect):
    from spogw_dagster.benchmarks.fixtures import write_fixtures
    from spogw_dagster.cli import main

    fx = write_fixtures(tmp_path / "fixtures")
    bad = tmp_path / fx[bench].name
    bad.write_bytes(_malformed(bench, kind, fx))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"profile: ci\nbenchmark: {{name: {bench}, data_path: {bad}, train_queries: 1, heldout_queries: 1}}\n")
    root = tmp_path / "assets"
    rc = main(["run", "--config", str(cfg), "--assets-dir", str(root)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"benchmark {bench!r}" in err and str(bad) in err and expect in err and "Fix:" in err, err
    assert "Traceback" not in err and not root.exists(), err
    record(f"malformed {bench} file: {kind}", survived=True, clear_error=True, rows_lost=0, rows_duplicated=0)


def test_partition_key_that_is_not_an_iteration(undisturbed, tmp_path):
    root = copy_assets(undisturbed["root"], tmp_path / "assets")
    ref = table_state(root)
    res = _materialize(root, "latest", ["sampled_workflows"], tmp_path)
    assert not res.success
    msg = _failure_message(res)
    assert "iteration partition keys are 4 digits" in msg and "'latest'" in msg, msg
    _unchanged_except(root, ref)
    assert not list(root.rglob("*latest*"))
    record("partition key not an iteration", survived=True, clear_error=True, rows_lost=0, rows_duplicated=0)


@pytest.mark.parametrize("case,args,yaml_text,expect", [
    ("bad YAML", ["--config", "{cfg}"], "curation: {m: 4\n  n: [", ["is not valid YAML", "{cfg}"]),
    ("unknown profile", ["--profile", "nope"], None, ["unknown profile 'nope'", "choose one of tiny"]),
    ("out-of-range value", ["--config", "{cfg}"], "profile: ci\nbenchmark:\n  train_queries: 0\n",
     ["benchmark.train_queries", "greater than or equal to 1"]),
    ("inconsistent values", ["--config", "{cfg}"], "profile: ci\ncuration:\n  m: 0\n", ["m=0 < n=4", "set m >= n"]),
    ("unknown field", ["--config", "{cfg}"], "profile: ci\ncuration:\n  mm: 4\n", ["curation.mm: unknown field; valid fields here"]),
    ("iterations < 1", ["--profile", "ci", "--iterations", "0"], None, ["--iterations must be >= 1"]),
])
def test_bad_settings_are_refused_before_anything_is_written(tmp_path, capsys, case, args, yaml_text, expect):
    from spogw_dagster.cli import main

    cfg = tmp_path / "bad.yaml"
    if yaml_text is not None:
        cfg.write_text(yaml_text)
    root = tmp_path / "assets"
    argv = ["run", *[a.replace("{cfg}", str(cfg)) for a in args], "--assets-dir", str(root)]
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, (case, err)
    for e in expect:
        assert e.replace("{cfg}", str(cfg)) in err, (case, err)
    assert "Traceback" not in err and not root.exists(), (case, err)
    record(f"config: {case}", survived=True, clear_error=True, rows_lost=0, rows_duplicated=0)


def test_data_of_every_case_equals_the_reference(undisturbed):
    """The reference itself: complete, readable, no temp files, and the catalog agrees."""
    lost, dup = rows_lost_and_duplicated(undisturbed["state"], undisturbed["state"])
    assert (lost, dup) == (0, 0) and unreadable_partitions(undisturbed["root"]) == []
    record("undisturbed reference", wall_s=round(undisturbed["wall_s"], 1),
           partitions=sum(len(p) for p in undisturbed["state"].values()))
