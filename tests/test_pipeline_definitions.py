"""The Dagster layer without a model: definitions load, partitions, the checkpoint lookup (fail fast), the
sensor's decisions and the code location module."""

from __future__ import annotations

import importlib
import json

import dagster as dg
import pytest

from spogw_dagster.pipeline.settings import load_config
from spogw_dagster.pipeline.defs.wiring import build_definitions
from spogw_dagster.pipeline.data.checkpoints import MissingCheckpointError, parent_checkpoint
from spogw_dagster.pipeline.defs.partitions import (
    PARTITIONS_NAME,
    iteration_key,
    iterations,
    key_to_int,
    previous_key,
)
from spogw_dagster.pipeline.defs.sensors import JOB_NAME, next_iteration
from spogw_dagster.pipeline.data.storage import AssetStore
from spogw_dagster.pipeline.defs.assets import ASSET_NAMES, ON_DEMAND_ASSETS

SIX = ["sampled_workflows", "execution_scores", "screened_groups", "sharpened_groups", "lora_checkpoint",
       "benchmark_report"]


def test_definitions_load_with_six_partitioned_assets_checks_job_and_sensor(tmp_path):
    defs = build_definitions("ci", assets_dir=tmp_path)
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    # the loop's six, plus the assets materialized on demand (objective_comparison)
    assert set(SIX) == set(ASSET_NAMES) and keys == set(ASSET_NAMES) | set(ON_DEMAND_ASSETS)
    for name in SIX:
        node = graph.get(dg.AssetKey(name))
        assert node.partitions_def == iterations
        assert node.code_version and len(node.code_version) == 16
    # lineage inside an iteration (the k-1 edge is imperative, see data/checkpoints.py)
    assert {p.to_user_string() for p in graph.get(dg.AssetKey("screened_groups")).parent_keys} == {
        "sampled_workflows", "execution_scores"}
    assert {p.to_user_string() for p in graph.get(dg.AssetKey("lora_checkpoint")).parent_keys} == {
        "sharpened_groups", "sampled_workflows", "execution_scores"}  # score_dpo / rwr read every scored candidate
    checks = {k.name: k for k in graph.asset_check_keys}
    assert set(checks) == {"m_workflows_per_query", "scores_complete", "executor_error_rate", "no_internal_errors",
                           "groups_kept", "loss_finite_and_adapter_reloads", "compared_with_previous"}
    for key in checks.values():
        assert graph.get(key).partitions_def == iterations  # partitioned checks
    job = defs.resolve_job_def(JOB_NAME)
    assert job.partitions_def == iterations and job.tags["spogw/loop"] == "iteration"
    assert defs.resolve_sensor_def("next_iteration_sensor") is not None


def test_code_location_module_reads_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SPOGW_PROFILE", "ci")
    monkeypatch.setenv("SPOGW_ASSETS_DIR", str(tmp_path))
    import spogw_dagster.definitions as mod

    mod = importlib.reload(mod)
    res = mod.defs.resolve_job_def(JOB_NAME)
    assert res.name == JOB_NAME
    pipeline = mod.defs.resources["pipeline"]
    assert pipeline.assets_dir == str(tmp_path.resolve()) and pipeline.config().profile == "ci"


def test_partition_keys():
    assert iteration_key(0) == "0000" and iteration_key(12) == "0012"
    assert key_to_int("0012") == 12 and previous_key("0000") is None and previous_key("0010") == "0009"
    for bad in ("12", "abcd", "00001"):
        with pytest.raises(ValueError):
            key_to_int(bad)
    with pytest.raises(ValueError):
        iteration_key(-1)


def _fake_adapter(folder):
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text("{}")
    (folder / "adapter_model.safetensors").write_bytes(b"weights")


def test_parent_checkpoint_lookup(tmp_path):
    store = AssetStore(tmp_path)
    assert parent_checkpoint(store, "0000") is None  # the base model
    with pytest.raises(MissingCheckpointError) as ei:
        parent_checkpoint(store, "0001")
    msg = str(ei.value)
    assert "lora_checkpoint[0000] is missing" in msg and "Materialize iteration 0000 first" in msg
    (tmp_path / "lora_checkpoint" / "0000").mkdir(parents=True)
    (tmp_path / "lora_checkpoint" / "0000" / "adapter_config.json").write_text("{}")
    with pytest.raises(MissingCheckpointError, match="lacks adapter_model.safetensors"):
        parent_checkpoint(store, "0001")
    (tmp_path / "lora_checkpoint" / "0000" / "adapter_model.safetensors").write_bytes(b"weights")
    p = parent_checkpoint(store, "0001")
    assert p.partition == "0000" and p.iteration == 0 and len(p.sha256) == 64
    assert json.dumps(p.as_metadata())
    # the table row records other bytes than the folder holds: damaged (or replaced behind the pipeline's back)
    import hashlib

    import polars as pl

    recorded = hashlib.sha256(b"the weights training wrote").hexdigest()
    store.write_parquet("lora_checkpoint", "0000", pl.DataFrame({"iteration": [0], "adapter_sha256": [recorded]}))
    with pytest.raises(MissingCheckpointError) as ei:
        parent_checkpoint(store, "0001")
    msg = str(ei.value)
    assert "lora_checkpoint[0000] is damaged" in msg and f"not the {recorded[:16]}" in msg, msg
    assert hashlib.sha256(b"weights").hexdigest()[:16] in msg and "Rematerialize lora_checkpoint[0000]" in msg
    store.write_parquet("lora_checkpoint", "0000", pl.DataFrame({"iteration": [0], "adapter_sha256": [p.sha256]}))
    assert parent_checkpoint(store, "0001").sha256 == p.sha256  # the bytes it recorded: fine again


def test_materializing_iteration_1_without_checkpoint_0_fails_fast_and_writes_nothing(tmp_path):
    defs = build_definitions("ci", assets_dir=tmp_path)
    job = defs.resolve_job_def(JOB_NAME)
    with dg.instance_for_test() as inst:
        inst.add_dynamic_partitions(PARTITIONS_NAME, ["0000", "0001"])
        res = job.execute_in_process(partition_key="0001", instance=inst, raise_on_error=False)
        assert not res.success
        failure = next(e for e in res.all_events if e.is_step_failure)
        assert failure.step_key == "sampled_workflows"
        assert "lora_checkpoint[0000] is missing" in failure.step_failure_data.user_failure_data.description
        assert res.get_asset_materialization_events() == []
        assert not inst.get_materialized_partitions(dg.AssetKey("sampled_workflows"))
    assert [p for p in tmp_path.rglob("*") if p.is_file() and "0001" in p.name] == []


def test_sensor_decisions():
    # the sensor continues a started loop; iteration 0000 is launched by whoever starts it
    key, why = next_iteration([], set(), 2)
    assert key is None and why.startswith("no iteration yet: materialize iteration 0000")
    assert next_iteration(["0000"], set(), 2)[0] is None
    assert next_iteration(["0000"], {"0000"}, 2)[0] == "0001"
    assert next_iteration(["0001", "0000"], {"0000", "0001"}, 2) == (None, "done: 2 iteration(s) reported")
    assert next_iteration(["0000", "0001"], {"0000"}, 3) == (None, "waiting for benchmark_report[0001]")


def test_sensor_against_an_instance(tmp_path):
    defs = build_definitions("ci", assets_dir=tmp_path)
    sensor = defs.resolve_sensor_def("next_iteration_sensor")
    with dg.instance_for_test() as inst:
        res = sensor(dg.build_sensor_context(instance=inst, definitions=defs))
        assert isinstance(res, dg.SkipReason) and "no iteration yet" in res.skip_message
        inst.add_dynamic_partitions(PARTITIONS_NAME, ["0000"])
        res = sensor(dg.build_sensor_context(instance=inst, definitions=defs))
        assert isinstance(res, dg.SkipReason) and "waiting for benchmark_report[0000]" in res.skip_message
        inst.report_runless_asset_event(dg.AssetMaterialization("benchmark_report", partition="0000"))
        res = sensor(dg.build_sensor_context(instance=inst, definitions=defs))
        assert [r.partition_key for r in res.run_requests] == ["0001"]
        assert res.run_requests[0].run_key.startswith("iteration-0001-")
        # never two iterations at once: an active run of the iteration job blocks the next request
        inst.add_run(dg.DagsterRun(job_name=JOB_NAME, run_id="a" * 36, status=dg.DagsterRunStatus.STARTED))
        res = sensor(dg.build_sensor_context(instance=inst, definitions=defs))
        assert isinstance(res, dg.SkipReason) and "still active" in res.skip_message
    # ... nor while a one-asset run (a UI launch, `dg launch`) is active
    with dg.instance_for_test() as inst:
        inst.add_dynamic_partitions(PARTITIONS_NAME, ["0000"])
        inst.report_runless_asset_event(dg.AssetMaterialization("benchmark_report", partition="0000"))
        inst.add_run(dg.DagsterRun(job_name="__ASSET_JOB", run_id="b" * 36, status=dg.DagsterRunStatus.STARTING))
        res = sensor(dg.build_sensor_context(instance=inst, definitions=defs))
        assert isinstance(res, dg.SkipReason) and "__ASSET_JOB is still active" in res.skip_message


def test_sensor_runs_by_default_and_the_config_switch_stops_it(tmp_path):
    sensor = build_definitions("ci", assets_dir=tmp_path).resolve_sensor_def("next_iteration_sensor")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    off = build_definitions("ci", assets_dir=tmp_path, overrides={"loop": {"sensor": False}})
    assert off.resolve_sensor_def("next_iteration_sensor").default_status == dg.DefaultSensorStatus.STOPPED
    # the switch changes no asset's output: the config hash and every code version stay the same
    assert load_config("ci", overrides={"loop": {"sensor": False}}).hash == load_config("ci").hash
    on_graph, off_graph = (d.resolve_asset_graph() for d in (build_definitions("ci", assets_dir=tmp_path), off))
    assert {k: on_graph.get(k).code_version for k in on_graph.materializable_asset_keys} == {
        k: off_graph.get(k).code_version for k in off_graph.materializable_asset_keys}


def test_cli_run_and_catalog_commands(tmp_path, capsys):
    import polars as pl

    from spogw_dagster.cli import main

    assert main(["run", "--profile", "nope", "--assets-dir", str(tmp_path)]) == 2
    assert "unknown profile 'nope'" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("profile: ci\ncuration:\n  m: 2\n")
    assert main(["run", "--config", str(bad), "--assets-dir", str(tmp_path)]) == 2
    assert "set m >= n" in capsys.readouterr().err
    assert main(["run", "--profile", "ci", "--iterations", "0", "--assets-dir", str(tmp_path)]) == 2
    AssetStore(tmp_path).write_parquet("execution_scores", "0000", pl.DataFrame({"iteration": [0], "score": [1.0]}))
    assert main(["catalog", "--assets-dir", str(tmp_path)]) == 0
    assert (tmp_path / "spogw.duckdb").is_file()


def test_cli_evaluate_argument_errors(tmp_path, capsys):
    from spogw_dagster.cli import main

    a = ["evaluate", "--profile", "ci", "--assets-dir", str(tmp_path)]
    assert main(a + ["--adapter", str(tmp_path / "missing")]) == 2
    assert "holds no adapter_model.safetensors" in capsys.readouterr().err
    assert main(a + ["--limit", "17"]) == 2  # humaneval's validation split has 16 queries
    assert "the validation split of humaneval has 16" in capsys.readouterr().err
    assert main(a + ["--samples", "0", "--no-greedy"]) == 2
    assert "score nothing" in capsys.readouterr().err
    assert main(a + ["--compare", "base"]) == 2
    assert "same policy" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing generated, nothing written


def test_each_asset_is_a_decorated_function_named_after_it():
    """Findable the way Dagster users look for an asset: `@dg.asset` on `def <asset name>(` in its own module,
    and what build_assets returns is that definition (code version added), not a copy built elsewhere."""
    import ast
    import inspect

    from spogw_dagster.pipeline.defs.assets import ASSET_MODULES, build_assets

    built = {a.key.to_user_string(): a for a in build_assets(load_config("ci"))}
    for m in ASSET_MODULES:
        fns = {n.name: n for n in ast.parse(inspect.getsource(m)).body if isinstance(n, ast.FunctionDef)}
        assert m.NAME in fns, f"{m.__name__} has no function named {m.NAME}"
        decorators = [ast.unparse(d) for d in fns[m.NAME].decorator_list]
        assert decorators and decorators[0].startswith("dg.asset("), (m.NAME, decorators)
        assert getattr(m, m.NAME).key == dg.AssetKey(m.NAME)
        assert built[m.NAME].group_names_by_key[dg.AssetKey(m.NAME)] == m.GROUP
        assert built[m.NAME].code_versions_by_key[dg.AssetKey(m.NAME)]  # added by build_assets
