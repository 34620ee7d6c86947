"""Data versions and staleness through Dagster's own API, on the `ci` profile with the real bundled model.

Every asset's output carries a data version of its frame's content (`assets/common.py::frame_data_version`,
attached in `assets/__init__.py::build_assets`). Iterations 0000 and 0001 as `spogw run --profile ci` leaves
them (a copy of the session's one such run, Dagster instance included); then:
- rerunning execution_scores[0001] with the same config reproduces the same rows (executor calls served from
  the cache, same seeds): the same data version, and nothing downstream is stale;
- rerunning it after changing the reward ladder (a section it reads) changes its rows: its direct children in
  0001 (screened_groups, and whatever else reads it) turn stale, naming execution_scores[0001]'s new data
  version; iteration 0000's curation and training do not. Dagster marks staleness one edge at a time: once
  screened_groups[0001] is rerun and its rows change, sharpened_groups[0001] turns stale.
"""

from __future__ import annotations

import shutil
import time

import dagster as dg
import pytest
from dagster._core.asset_graph_view.asset_graph_view import AssetGraphView, TemporalContext
from dagster._core.definitions.assets.graph.asset_graph import AssetGraph
from dagster._core.definitions.data_version import (
    CachingStaleStatusResolver,
    StaleCauseCategory,
    StaleStatus,
    extract_data_version_from_entry,
)
from dagster._time import get_current_datetime

from spogw_dagster.pipeline.defs.assets.common import frame_data_version
from spogw_dagster.pipeline.defs.partitions import PARTITIONS_NAME
from spogw_dagster.pipeline.defs.sensors import JOB_NAME
from spogw_dagster.pipeline.settings import load_config
from spogw_dagster.pipeline.data.storage import AssetStore
from spogw_dagster.pipeline.defs.assets import ASSET_NAMES
from spogw_dagster.pipeline.defs.wiring import build_definitions

pytestmark = pytest.mark.model

KEYS = ("0000", "0001")


def _resolver(defs: dg.Definitions, inst: dg.DagsterInstance) -> CachingStaleStatusResolver:
    """What the UI asks (a fresh one each time: it caches)."""
    graph: AssetGraph = defs.resolve_asset_graph()
    view = AssetGraphView(temporal_context=TemporalContext(effective_dt=get_current_datetime(), last_event_id=None),
                          instance=inst, asset_graph=graph)
    return CachingStaleStatusResolver(instance=inst, asset_graph=graph, loading_context=view)


def _status(defs, inst) -> dict[tuple[str, str], StaleStatus]:
    r = _resolver(defs, inst)
    return {(a, k): r.get_status(dg.AssetKey(a), k) for a in ASSET_NAMES for k in KEYS}


def _version(inst, asset: str, key: str) -> str | None:
    rec = inst.get_latest_data_version_record(dg.AssetKey(asset), partition_key=key)
    version = extract_data_version_from_entry(rec.event_log_entry) if rec else None
    return version.value if version else None


@pytest.fixture(scope="module")
def loop(ci_cli_run, tmp_path_factory):
    """A private copy of the session's undisturbed `spogw run --profile ci` (tests/conftest.py::ci_cli_run),
    its Dagster instance included: the same materializations and data versions a user's run leaves, without
    running the loop a second time."""
    assets = tmp_path_factory.mktemp("staleness") / "assets"
    shutil.copytree(ci_cli_run["root"], assets)
    defs = build_definitions("ci", assets_dir=assets)
    job = defs.resolve_job_def(JOB_NAME)
    with dg.DagsterInstance.from_config(str(assets / ".dagster")) as inst:
        assert set(inst.get_dynamic_partitions(PARTITIONS_NAME)) >= set(KEYS)
        yield {"assets": assets, "defs": defs, "inst": inst, "job": job, "store": AssetStore(assets)}


def test_every_output_carries_the_data_version_of_its_stored_frame(loop):
    inst, store = loop["inst"], loop["store"]
    for asset in ASSET_NAMES:
        for key in KEYS:
            # the IO manager still got the frame (Output's value), and the version is that of its content
            version = _version(inst, asset, key)
            assert version == frame_data_version(store.read_parquet(asset, key)).value, (asset, key)
    assert all(s == StaleStatus.FRESH for s in _status(loop["defs"], inst).values()), _status(loop["defs"], inst)


def test_rerun_with_identical_data_marks_nothing_stale(loop):
    inst = loop["inst"]
    before = _version(inst, "execution_scores", "0001")
    n_before = len(inst.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey("execution_scores"), asset_partitions=["0001"]), limit=10).records)
    t0 = time.monotonic()
    res = loop["job"].execute_in_process(partition_key="0001", instance=inst,
                                         asset_selection=[dg.AssetKey("execution_scores")])
    assert res.success
    recs = inst.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey("execution_scores"), asset_partitions=["0001"]), limit=10).records
    assert len(recs) == n_before + 1  # it did run again ...
    rows = loop["store"].read_parquet("execution_scores", "0001")
    assert rows["cached_calls"].sum() == rows["llm_calls"].sum()  # ... from the call cache
    assert _version(inst, "execution_scores", "0001") == before  # ... and reproduced the same data
    status = _status(loop["defs"], inst)
    assert all(s == StaleStatus.FRESH for s in status.values()), status
    print(f"identical rerun of execution_scores[0001]: {time.monotonic() - t0:.1f} s")


def test_rerun_with_changed_data_marks_its_downstream_stale(loop):
    inst, assets = loop["inst"], loop["assets"]
    base = load_config("ci")
    assert base.reward.format > 0
    # a reward ladder with less credit for a workflow found in the text: the same runs, other scores
    defs = build_definitions("ci", assets_dir=assets,
                             overrides={"reward": {"format": round(base.reward.format / 2, 4)}})
    before = _version(inst, "execution_scores", "0001")
    res = defs.resolve_job_def(JOB_NAME).execute_in_process(
        partition_key="0001", instance=inst, asset_selection=[dg.AssetKey("execution_scores")])
    assert res.success
    assert _version(inst, "execution_scores", "0001") != before
    r = _resolver(defs, inst)
    assert r.get_status(dg.AssetKey("execution_scores"), "0001") == StaleStatus.FRESH
    # Dagster marks the direct children stale, each naming the new data version of execution_scores[0001]
    children = sorted(k.to_user_string() for k in defs.resolve_asset_graph().get(
        dg.AssetKey("execution_scores")).child_keys if k.to_user_string() in ASSET_NAMES)
    assert "screened_groups" in children
    for asset in children:
        assert r.get_status(dg.AssetKey(asset), "0001") == StaleStatus.STALE, asset
        causes = r.get_stale_causes(dg.AssetKey(asset), "0001")
        assert any(c.category == StaleCauseCategory.DATA and c.dependency is not None
                   and c.dependency.asset_key == dg.AssetKey("execution_scores")
                   and c.dependency.partition_key == "0001" for c in causes), (asset, causes)
    # iteration 0000's data did not change: at most a new code version (the reward section) of the two assets
    # that read it, never a data cause
    for asset in ASSET_NAMES:
        causes = r.get_stale_causes(dg.AssetKey(asset), "0000")
        assert all(c.category == StaleCauseCategory.CODE for c in causes), (asset, causes)
        if asset not in ("execution_scores", "benchmark_report"):
            assert r.get_status(dg.AssetKey(asset), "0000") == StaleStatus.FRESH, asset

    # ... and one step further once a stale child is rerun and its data changes too (new scores, new groups)
    assert r.get_status(dg.AssetKey("sharpened_groups"), "0001") == StaleStatus.FRESH
    res = defs.resolve_job_def(JOB_NAME).execute_in_process(
        partition_key="0001", instance=inst, asset_selection=[dg.AssetKey("screened_groups")])
    assert res.success
    r = _resolver(defs, inst)
    assert r.get_status(dg.AssetKey("screened_groups"), "0001") == StaleStatus.FRESH
    assert r.get_status(dg.AssetKey("sharpened_groups"), "0001") == StaleStatus.STALE
