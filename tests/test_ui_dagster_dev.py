"""The Dagster UI for real: `dagster dev` from the repo root (workspace.yaml, the `ci` profile, a temporary
DAGSTER_HOME and assets directory) driven by Debian's headless Chromium through Playwright.

- Each stage's group page (/locations/spogw/asset-groups/<sampling|execution|curation|training|evaluation>)
  draws that stage's assets as graph nodes: the six of the loop (and the on-demand objective_comparison).
- A partition is materialized from the UI as a user would: select `sampled_workflows` in the graph,
  "Materialize selected…", "Add a partition" 0000 (the iteration partitions are dynamic), "Launch 1 run".
  The run succeeds (GraphQL), its Parquet file lands in the assets directory with the expected rows, and the
  materialization of partition 0000 shows in the GraphQL API and on the asset's page.

- Staleness: after execution_scores[0000] runs on that partition, rerunning sampled_workflows[0000] with the
  same config leaves it fresh; rerunning it with another generator seed (launchpad resource config) marks
  execution_scores[0000] stale, in GraphQL and as "Unsynced" on the partition's page.

- The loop's sensor is RUNNING without anyone starting it (GraphQL and the automation page), and its ticks
  launch nothing while iteration 0000 has not been started or a run is in progress (so the launch above stays
  the only run).

Screenshots go to test-artifacts/ui_*.png (not committed). Skipped only where /usr/bin/chromium is missing
(`apt-get install -y chromium`; the Python `playwright` package drives it, no browser download).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from ui_helpers import CHROMIUM, CHROMIUM_FLAGS, DagsterDev

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is missing: apt-get install -y chromium"),
]

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO / "test-artifacts"
ASSETS = ("sampled_workflows", "execution_scores", "screened_groups", "sharpened_groups", "lora_checkpoint",
          "benchmark_report")
LOCATION = "spogw"
# The UI groups assets by stage; the global lineage (/asset-groups) shows the groups collapsed, so each stage's
# group page is where its assets are nodes.
STAGES = {"sampling": ("sampled_workflows",), "execution": ("execution_scores",),
          "curation": ("screened_groups", "sharpened_groups"), "training": ("lora_checkpoint",),
          "evaluation": ("benchmark_report", "objective_comparison")}
SAMPLING_PAGE = f"/locations/{LOCATION}/asset-groups/sampling"
PARTITION = "0000"
TIMINGS: dict[str, float] = {}

RUNS_QUERY = """
query Runs($filter: RunsFilter) {
  runsOrError(filter: $filter) {
    __typename
    ... on Runs { results { runId status jobName tags { key value } assetSelection { path } } }
    ... on PythonError { message }
  }
}"""

MATERIALIZATIONS_QUERY = """
query Mat($key: AssetKeyInput!, $partitions: [String!]) {
  assetOrError(assetKey: $key) {
    __typename
    ... on Asset {
      assetMaterializations(partitions: $partitions) {
        partition runId
        metadataEntries { label ... on IntMetadataEntry { intValue } ... on PathMetadataEntry { path } }
      }
    }
  }
}"""


SENSOR_QUERY = """
query Sensor($selector: SensorSelector!) {
  sensorOrError(sensorSelector: $selector) {
    __typename
    ... on Sensor { name sensorState { status ticks(limit: 20) { status skipReason runIds } } }
    ... on PythonError { message }
  }
}"""
SENSOR = {"repositoryLocationName": LOCATION, "repositoryName": "__repository__",
          "sensorName": "next_iteration_sensor"}


@pytest.fixture(scope="module")
def dev(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ui")
    assets = tmp / "assets"
    assets.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("SPOGW_CONFIG", "DAGSTER_HOME")}
    env.update(SPOGW_PROFILE="ci", SPOGW_ASSETS_DIR=str(assets))
    ARTIFACTS.mkdir(exist_ok=True)
    server = DagsterDev(REPO, tmp / "dagster_home", env, log_path=tmp / "dagster_dev.log")
    t0 = time.monotonic()
    server.start()
    try:
        TIMINGS["dagster_dev_ready_s"] = round(server.wait_ready(), 1)
        server.assets = assets
        yield server
    finally:
        server.stop()
        TIMINGS["total_s"] = round(time.monotonic() - t0, 1)
        shutil.copyfile(tmp / "dagster_dev.log", ARTIFACTS / "ui_dagster_dev.log")
        (ARTIFACTS / "ui_timings.json").write_text(json.dumps(TIMINGS, indent=2))
        left = server.leftovers()
        assert not left, f"dagster dev left processes behind: {left}"


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    try:
        with sync_playwright() as pw:
            ctx = pw.chromium.launch_persistent_context(
                profile, executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True,
                viewport={"width": 1600, "height": 1000})
            # Dagster's "Join the community" dialog covers the page on a first visit; it stays away once seen.
            ctx.add_init_script("window.localStorage.setItem('communityNux', '\"1\"')")
            ctx.set_default_timeout(60_000)
            try:
                yield ctx
            finally:
                ctx.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)


@contextlib.contextmanager
def _screenshots_on_failure(ctx, name: str):
    """On a failure, keep a screenshot of every open page as test-artifacts/ui_FAILED_<name>_<i>.png."""
    try:
        yield
    except BaseException:
        for i, pg in enumerate(ctx.pages):
            try:
                pg.screenshot(path=str(ARTIFACTS / f"ui_FAILED_{name}_{i}.png"))
            except Exception:
                pass
        raise


def _open(ctx, dev, path: str):
    page = ctx.new_page()
    page.goto(dev.url + path, wait_until="domcontentloaded")
    return page


def _graph_node(page, name: str):
    # the lineage graph is an SVG whose nodes are HTML inside <foreignObject>; the sidebar's list is not
    return page.locator("svg foreignObject").get_by_text(name, exact=True)


def _wait_nodes(page, names=ASSETS):
    for name in names:
        _graph_node(page, name).first.wait_for(state="visible")


def test_asset_graph_shows_the_six_assets(dev, browser):
    with _screenshots_on_failure(browser, "graph"):
        t0 = time.monotonic()
        assert {a for names in STAGES.values() for a in names} >= set(ASSETS)
        for group, names in STAGES.items():
            page = _open(browser, dev, f"/locations/{LOCATION}/asset-groups/{group}")
            _wait_nodes(page, names)
            for name in names:  # each asset is exactly one node of its stage's graph
                assert _graph_node(page, name).count() == 1, (group, name)
            page.wait_for_load_state("networkidle")
            page.screenshot(path=str(ARTIFACTS / f"ui_asset_graph_{group}.png"))
            page.close()
        TIMINGS["asset_graph_s"] = round(time.monotonic() - t0, 1)


@pytest.mark.timeout(600)
def test_materialize_a_partition_from_the_ui(dev, browser):
    with _screenshots_on_failure(browser, "materialize"):
        t0 = time.monotonic()
        page = _open(browser, dev, SAMPLING_PAGE)
        mutations: list[str] = []

        def record(req):
            if "/graphql" in req.url and req.method == "POST":
                try:
                    body = req.post_data_json or {}
                except Exception:
                    return
                if isinstance(body, dict) and str(body.get("query", "")).lstrip().startswith("mutation"):
                    mutations.append(body.get("operationName") or str(body["query"]).split("(")[0])

        page.on("request", record)
        _wait_nodes(page, ["sampled_workflows"])
        _graph_node(page, "sampled_workflows").click()
        page.get_by_role("button", name="Materialize selected").click()
        launch = page.get_by_role("dialog").filter(has_text="Launch runs to materialize sampled_workflows")
        launch.wait_for()
        launch.get_by_text("Add a partition", exact=True).click()
        add = page.get_by_role("dialog").filter(has_text="Add a partition for iteration")
        add.get_by_role("textbox").fill(PARTITION)
        add.get_by_role("button", name="Save").click()
        add.wait_for(state="hidden")
        launch.get_by_text("1 partition", exact=True).wait_for()
        page.screenshot(path=str(ARTIFACTS / "ui_launch_dialog.png"))
        launch.get_by_role("button", name="Launch 1 run").click()
        launch.wait_for(state="hidden")
        TIMINGS["ui_launch_s"] = round(time.monotonic() - t0, 1)

        # the run, found through the GraphQL API by its partition tag
        deadline = time.monotonic() + 480
        run = None
        while time.monotonic() < deadline:
            runs = dev.graphql(RUNS_QUERY, {"filter": {"tags": [{"key": "dagster/partition", "value": PARTITION}]}})
            results = runs["runsOrError"]["results"]
            assert len(results) <= 1, f"more than one run launched: {results}"
            if results:
                run = results[0]
                if run["status"] in ("SUCCESS", "FAILURE", "CANCELED"):
                    break
            time.sleep(3)
        assert run is not None, f"no run for partition {PARTITION} after the UI launch:\n{dev.log_tail()}"
        TIMINGS["run_s"] = round(time.monotonic() - t0 - TIMINGS["ui_launch_s"], 1)
        run_page = _open(browser, dev, f"/runs/{run['runId']}")
        run_page.get_by_text("sampled_workflows").first.wait_for()
        run_page.wait_for_load_state("networkidle")
        run_page.screenshot(path=str(ARTIFACTS / "ui_run.png"))
        assert run["status"] == "SUCCESS", f"run {run['runId']} ended {run['status']}:\n{dev.log_tail()}"
        assert [a["path"] for a in run["assetSelection"]] == [["sampled_workflows"]]
        assert {"dagster/partition": PARTITION}.items() <= {t["key"]: t["value"] for t in run["tags"]}.items()
        assert any("Partition" in m or "Launch" in m for m in mutations), mutations

        # it landed: the Parquet file in the temporary assets directory, with m workflows per training query
        import polars as pl

        from spogw_dagster.pipeline.settings import load_config

        path = dev.assets / "sampled_workflows" / f"{PARTITION}.parquet"
        assert path.is_file(), sorted(str(p) for p in dev.assets.rglob("*"))
        df = pl.read_parquet(path)
        cfg = load_config("ci")
        assert df.height == cfg.benchmark.train_queries * cfg.curation.m
        assert df["iteration"].unique().to_list() == [0]
        # ... and only that asset: the rest of the iteration was not selected
        assert not (dev.assets / "execution_scores" / f"{PARTITION}.parquet").exists()

        mats = dev.graphql(MATERIALIZATIONS_QUERY, {"key": {"path": ["sampled_workflows"]}, "partitions": [PARTITION]})
        events = mats["assetOrError"]["assetMaterializations"]
        assert [(e["partition"], e["runId"]) for e in events] == [(PARTITION, run["runId"])]
        md = {e["label"]: e.get("intValue", e.get("path")) for e in events[0]["metadataEntries"]}
        assert md["dagster/row_count"] == df.height
        assert Path(md["path"]) == path

        # the graph shows the materialized partition; the asset's partitions page lists 0000 as materialized
        page.close()
        page = _open(browser, dev, SAMPLING_PAGE)
        _wait_nodes(page, ["sampled_workflows"])
        page.wait_for_load_state("networkidle")
        page.screenshot(path=str(ARTIFACTS / "ui_asset_graph_materialized.png"))
        page.close()
        asset_page = _open(browser, dev, f"/assets/sampled_workflows?view=partitions&partition={PARTITION}")
        asset_page.get_by_text("Materialized (1)", exact=True).wait_for()
        asset_page.get_by_text("parent_partition", exact=True).first.wait_for()  # the partition's metadata
        asset_page.get_by_text(run["runId"][:8]).first.wait_for()  # ... and the run that wrote it
        asset_page.wait_for_load_state("networkidle")
        asset_page.screenshot(path=str(ARTIFACTS / "ui_asset_partitions.png"))
        TIMINGS["ui_materialize_total_s"] = round(time.monotonic() - t0, 1)
        TIMINGS["ui_mutations"] = mutations  # type: ignore[assignment]


def test_the_loop_sensor_is_running_and_launches_nothing_on_its_own(dev, browser):
    with _screenshots_on_failure(browser, "sensor"):
        t0 = time.monotonic()
        sensor = dev.graphql(SENSOR_QUERY, {"selector": SENSOR})["sensorOrError"]
        assert sensor["__typename"] == "Sensor", sensor
        assert sensor["sensorState"]["status"] == "RUNNING"  # default_status, nobody started it
        # every tick so far skipped (no iteration started, a run active, or waiting for the report)
        ticks = sensor["sensorState"]["ticks"]
        assert all(not t["runIds"] for t in ticks), ticks
        page = _open(browser, dev, "/overview/automation")
        page.get_by_text("next_iteration_sensor").first.wait_for()
        page.wait_for_load_state("networkidle")
        page.screenshot(path=str(ARTIFACTS / "ui_sensor.png"))
        page.close()
        TIMINGS["sensor_s"] = round(time.monotonic() - t0, 1)


STALE_QUERY = """
query Stale($partition: String) {
  assetNodes(assetKeys: [{path: ["sampled_workflows"]}, {path: ["execution_scores"]}]) {
    assetKey { path }
    staleStatus(partition: $partition)
    staleCauses(partition: $partition) { key { path } partitionKey category reason }
  }
}"""

LAUNCH_MUTATION = """
mutation Launch($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on RunConfigValidationInvalid { errors { message } }
    ... on InvalidSubsetError { message }
  }
}"""

RUN_STATUS_QUERY = """
query Run($runId: ID!) { runOrError(runId: $runId) { __typename ... on Run { status } } }"""


def _launch_and_wait(dev, asset: str, run_config: dict | None = None, timeout: float = 480) -> str:
    """Launch one asset's partition 0000 as the launchpad does (the implicit asset job, the partition tag and,
    optionally, run config) and wait for it to succeed."""
    params = {"selector": {"repositoryLocationName": LOCATION, "repositoryName": "__repository__",
                           "jobName": "__ASSET_JOB", "assetSelection": [{"path": [asset]}]},
              "executionMetadata": {"tags": [{"key": "dagster/partition", "value": PARTITION}]},
              "runConfigData": run_config or {}}
    res = dev.graphql(LAUNCH_MUTATION, {"params": params})["launchRun"]
    assert res["__typename"] == "LaunchRunSuccess", res
    run_id = res["run"]["runId"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = dev.graphql(RUN_STATUS_QUERY, {"runId": run_id})["runOrError"]["status"]
        if status in ("SUCCESS", "FAILURE", "CANCELED"):
            break
        time.sleep(2)
    assert status == "SUCCESS", f"{asset} run {run_id} ended {status}:\n{dev.log_tail()}"
    return run_id


def _stale(dev) -> dict[str, tuple[str, list[dict]]]:
    nodes = dev.graphql(STALE_QUERY, {"partition": PARTITION})["assetNodes"]
    return {n["assetKey"]["path"][-1]: (n["staleStatus"], n["staleCauses"]) for n in nodes}


@pytest.mark.timeout(900)
def test_a_rerun_with_changed_data_shows_its_downstream_unsynced(dev, browser):
    """execution_scores[0000] on top of the UI-materialized sampled_workflows[0000]: both fresh. Rerunning
    sampling with the same config reproduces its rows (same data version): still fresh. Rerunning it with
    another generator seed from the launchpad's resource config (the resolved config the resource carries)
    changes the rows: execution_scores[0000] is stale because of sampled_workflows[0000]'s new data, in the
    GraphQL API and as an "Unsynced" marker on the partition's page."""
    with _screenshots_on_failure(browser, "stale"):
        t0 = time.monotonic()
        _launch_and_wait(dev, "execution_scores")
        assert {a: s for a, (s, _) in _stale(dev).items()} == {"sampled_workflows": "FRESH",
                                                                "execution_scores": "FRESH"}
        _launch_and_wait(dev, "sampled_workflows")  # same config and seeds: the same rows
        assert _stale(dev)["execution_scores"][0] == "FRESH"

        from spogw_dagster.pipeline.settings import load_config

        changed = load_config("ci", overrides={"generator": {"seed": 1}}).model_dump_json()
        _launch_and_wait(dev, "sampled_workflows",
                         {"resources": {"pipeline": {"config": {"assets_dir": str(dev.assets),
                                                                 "config_json": changed}}}})
        status, causes = _stale(dev)["execution_scores"]
        assert status == "STALE", causes
        # the cause: sampled_workflows[0000] "has a new data version"
        assert any(c["category"] == "DATA" and c["key"]["path"] == ["sampled_workflows"]
                   and c["partitionKey"] == PARTITION for c in causes), causes
        # a partitioned asset's graph node does not carry per-partition markers; its partition page does
        page = _open(browser, dev, f"/assets/execution_scores?view=partitions&partition={PARTITION}")
        page.get_by_text("Unsynced").first.wait_for()
        page.wait_for_load_state("networkidle")
        page.screenshot(path=str(ARTIFACTS / "ui_unsynced.png"))
        page.close()
        TIMINGS["stale_s"] = round(time.monotonic() - t0, 1)
