"""Steps in containers (issue 11): the `ci` loop, iterations 0 and 1, with `dagster_docker.docker_executor`
running every step (six assets, six checks) in its own container of the skeleton step image
(spogw_dagster/pipeline/runs/container_steps.py), the assets, the call cache, the DuckDB catalog and the Dagster
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

from spogw_dagster.pipeline.runs import container_steps
from spogw_dagster.pipeline.data.catalog import query
from spogw_dagster.pipeline.data.storage import AssetStore
from spogw_dagster.pipeline.defs.assets import ASSET_NAMES
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
            assert len(launched) == len(plan) == 13, (len(launched), plan)  # 6 assets + 7 checks
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
    assert steps["removed"] == len(steps["containers"]) == 26
    assert container_steps.step_containers(os.getpid()) == []


def _instance(steps):
    return dg.DagsterInstance.from_config(str(steps["home"]))


def _step_keys(inst, run_id: str) -> list[str]:
    return sorted({e.step_key for e in inst.all_logs(run_id, of_type=dg.DagsterEventType.STEP_SUCCESS)})


def _container_names(inst, run_id: str) -> set[str]:
    from dagster_shared.serdes.utils import hash_str

    return {f"dagster-step-{hash_str(run_id + k)}" for k in _step_keys(inst, run_id)}


# ---------------------------------------------------------------- the self-contained image (docker/Dockerfile)

OWN_IMAGE = "spogw:latest"


@pytest.fixture(scope="module")
def own_image_steps(docker_engine, tmp_path_factory):
    """The same `ci` loop with every step in a container of the self-contained image built from
    docker/Dockerfile (SPOGW_STEP_IMAGE=spogw:latest): its own Debian, Python and venv, nothing of the host's
    bound but the assets directory and $DAGSTER_HOME. CI does not build that image (a debootstrapped Debian, torch
    and the project's dependencies: minutes, and ~2 GB copied per container start by the vfs driver), so this
    skips unless the engine already holds it; build it with docker/build_image.sh."""
    ok, why = container_steps.own_image_status(OWN_IMAGE)
    if not ok:
        pytest.skip(f"{why}. (Not built by CI: docker/build_image.sh takes minutes; see docker/README.md.)")
    _ci_profile_is_what_the_hand_counts_assume()
    root = tmp_path_factory.mktemp("docker_steps_own_image") / "assets"
    home = root / ".dagster"
    saved = {k: os.environ.get(k) for k in ("DAGSTER_HOME", container_steps.ENV_IMAGE)}
    os.environ.update({"DAGSTER_HOME": str(home), container_steps.ENV_IMAGE: OWN_IMAGE})
    out = io.StringIO()
    t0 = time.monotonic()
    try:  # containers removed as their steps finish (each holds a full copy of the image under vfs)
        results = container_steps.run_loop_in_containers("ci", assets_dir=root, out=out)
        wall = time.monotonic() - t0
        left = container_steps.step_containers(os.getpid())
    finally:
        container_steps.remove_step_containers(os.getpid())
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    containers = [c for r in results for c in r.get("containers", [])]
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "docker_steps_own_image_timings.json").write_text(json.dumps({
        "image": OWN_IMAGE, "wall_s": round(wall, 1),
        "iterations": {r["key"]: round(r.get("wall_s", 0), 1) for r in results}, "containers": len(containers)},
        indent=1))
    return {"root": root, "home": home, "results": results, "containers": containers, "left": left,
            "log": out.getvalue(), "store": AssetStore(root)}


def test_own_image_both_iterations_succeed(own_image_steps):
    s = own_image_steps
    assert [(r["key"], r["status"]) for r in s["results"]] == [(k, "ok") for k in KEYS], s["log"][-3000:]


def test_own_image_every_step_ran_in_a_container_of_its_own(own_image_steps):
    s = own_image_steps
    with _instance(s) as inst:
        for r in s["results"]:
            ours = [c for c in s["containers"] if c["name"] in _container_names(inst, r["run_id"])]
            plan = _step_keys(inst, r["run_id"])
            launched = [e for e in inst.all_logs(r["run_id"], of_type=dg.DagsterEventType.STEP_WORKER_STARTING)
                        if "Docker container" in (e.dagster_event.message or "")]
            assert len(launched) == len(plan) == 13, (len(launched), plan)
            assert sorted(c["step"] for c in ours) == sorted(plan)
            assert all(c["exit_code"] == "0" and c["image"] == OWN_IMAGE for c in ours), ours
            assert len({c["hostname"] for c in ours}) == len(ours)


def test_own_image_binds_nothing_of_the_host_but_the_shared_directories(own_image_steps):
    from spogw_dagster.paths import cache_dir

    s = own_image_steps
    shared = {str(p.resolve()) for p in (s["root"], s["home"], cache_dir())}
    assert len(s["containers"]) == 26
    for c in s["containers"]:
        binds = {m["Source"]: m["RW"] for m in c["mounts"] if m["Type"] == "bind"}
        assert set(binds) <= shared and all(binds.values()), (c["step"], binds)  # no /usr, interpreter, venv, repo
        assert {m["Destination"] for m in c["mounts"] if m["Type"] == "bind"} == set(binds)  # at the same path


def test_own_image_tables_hold_the_rows_of_the_in_process_run(own_image_steps):
    store = own_image_steps["store"]
    for it, key in enumerate(KEYS):
        expect = _expected_rows(store, key)
        got = {t: store.read_parquet(t, key).height for t in expect}
        assert got == expect, (key, got, expect)
        for t, n in expect.items():
            if n:
                assert query(store, f"select count(*) from {t} where iteration = ?", [it]) == [(n,)], t
    assert (own_image_steps["root"] / "call_cache.sqlite").is_file()


def test_own_image_generated_code_ran_in_the_bwrap_sandbox(own_image_steps):
    for key in KEYS:
        iso = set(own_image_steps["store"].read_parquet("execution_scores", key)["isolation"].to_list())
        assert iso == {"bwrap"}, iso


def test_own_image_no_step_container_is_left_behind(own_image_steps):
    # removed as their steps finished (container_steps._Reaper) or at the end of their iteration
    assert len(own_image_steps["containers"]) == 26 and own_image_steps["left"] == []
    assert container_steps.step_containers(os.getpid()) == []
