"""Steps in containers (issue 11): the `ci` loop, iterations 0 and 1, with `dagster_docker.docker_executor`
running every step (six assets, six checks) in its own container of the skeleton step image
(spogw_dagster/pipeline/container_steps.py), the assets, the call cache, the DuckDB catalog and the Dagster
instance on the assets directory shared with the containers. Asserted: both runs succeed; each step ran in a
container of its own (the containers, their step keys and exit codes, and the run's step-worker events);
the tables hold exactly the rows the in-process run holds (tests/test_pipeline_e2e.py's hand counts for
`ci`, and the DuckDB views); the workflows ran in the bwrap sandbox inside the step containers; no step
container is left behind.

Needs a Docker engine (the `docker_engine` fixture starts `dockerd --storage-driver=vfs` when none answers,
else skips saying why) and dagster-docker (the `dev` extra has it). The image is built here, every time it is
missing or stale: a `docker import` of a few hundred bytes, no registry, ~1 s. Wall time (and the in-process
reference, if test_pipeline_e2e wrote one) goes to test-artifacts/docker_steps_timings.json.
"""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path

import dagster as dg
import pytest

pytest.importorskip("dagster_docker", reason="steps in containers need dagster-docker: pip install -e '.[docker]'")

from spogw_dagster.pipeline import container_steps
from spogw_dagster.pipeline.catalog import query
from spogw_dagster.pipeline.storage import ASSET_NAMES, AssetStore
from tests.test_pipeline_e2e import (
    _ci_profile_is_what_the_hand_counts_assume,
    _expected_rows,
)

pytestmark = pytest.mark.model

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
KEYS = ("0000", "0001")


@pytest.fixture(scope="module")
def steps(docker_engine, tmp_path_factory):
    _ci_profile_is_what_the_hand_counts_assume()
    root = tmp_path_factory.mktemp("docker_steps") / "assets"
    home = root / ".dagster"
    saved = os.environ.get("DAGSTER_HOME")
    os.environ["DAGSTER_HOME"] = str(home)
    out = io.StringIO()
    t0 = time.monotonic()
    try:
        results = container_steps.run_loop_in_containers("ci", assets_dir=root, out=out, keep_containers=True)
        wall = time.monotonic() - t0
        left = container_steps.step_containers(os.getpid())
    finally:
        removed = container_steps.remove_step_containers(os.getpid())
        if saved is None:
            os.environ.pop("DAGSTER_HOME", None)
        else:
            os.environ["DAGSTER_HOME"] = saved
    ARTIFACTS.mkdir(exist_ok=True)
    ref = ARTIFACTS / "pipeline_ci_timings.json"
    (ARTIFACTS / "docker_steps_timings.json").write_text(json.dumps({
        "wall_s": round(wall, 1), "iterations": {r["key"]: round(r.get("wall_s", 0), 1) for r in results},
        "containers": len(left), "in_process_reference": json.loads(ref.read_text()) if ref.is_file() else None,
    }, indent=1))
    return {"root": root, "home": home, "results": results, "containers": left, "removed": removed,
            "log": out.getvalue(), "store": AssetStore(root)}


def test_both_iterations_succeed_with_steps_in_containers(steps):
    assert [(r["key"], r["status"]) for r in steps["results"]] == [(k, "ok") for k in KEYS], steps["log"][-3000:]


def test_every_step_ran_in_a_container_of_its_own(steps):
    with _instance(steps) as inst:
        for r in steps["results"]:
            ours = [c for c in steps["containers"] if c["name"] in _container_names(inst, r["run_id"])]
            plan = _step_keys(inst, r["run_id"])
            launched = [e for e in inst.all_logs(r["run_id"], of_type=dg.DagsterEventType.STEP_WORKER_STARTING)
                        if "Docker container" in (e.dagster_event.message or "")]
            assert len(launched) == len(plan) == 12, (len(launched), plan)  # 6 assets + 6 checks
            assert sorted(c["step"] for c in ours) == sorted(plan)
            assert {a for a in ASSET_NAMES} <= {c["step"] for c in ours}
            assert all(c["exit_code"] == "0" and c["image"] == container_steps.IMAGE for c in ours), ours
            assert len({c["hostname"] for c in ours}) == len(ours)  # one container per step, none reused


def test_tables_hold_the_rows_of_the_in_process_run(steps):
    store = steps["store"]
    for it, key in enumerate(KEYS):
        expect = _expected_rows(store, key)
        got = {t: store.read_parquet(t, key).height for t in expect}
        assert got == expect, (key, got, expect)
        # the catalog written from inside the containers answers for this iteration too
        for t, n in expect.items():
            if n:
                assert query(store, f"select count(*) from {t} where iteration = ?", [it]) == [(n,)], t
    # the call cache on the shared volume was written by the step containers
    assert (steps["root"] / "call_cache.sqlite").is_file()


def test_generated_code_ran_in_the_bwrap_sandbox_inside_the_step_containers(steps):
    for key in KEYS:
        iso = set(steps["store"].read_parquet("execution_scores", key)["isolation"].to_list())
        assert iso == {"bwrap"}, iso


def test_no_step_container_is_left_behind(steps):
    assert steps["removed"] == len(steps["containers"]) == 24
    assert container_steps.step_containers(os.getpid()) == []


def _instance(steps):
    return dg.DagsterInstance.from_config(str(steps["home"]))


def _step_keys(inst, run_id: str) -> list[str]:
    return sorted({e.step_key for e in inst.all_logs(run_id, of_type=dg.DagsterEventType.STEP_SUCCESS)})


def _container_names(inst, run_id: str) -> set[str]:
    from dagster_shared.serdes.utils import hash_str

    return {f"dagster-step-{hash_str(run_id + k)}" for k in _step_keys(inst, run_id)}
