"""`spogw run`: the iteration loop in-process, against a persistent Dagster instance.

Iteration k = one run of the `spogw_iteration` job for partition k (the six assets and their checks), the
same job the sensor launches from the UI. Runs go into the instance at $DAGSTER_HOME (default
`<assets>/.dagster`, created with a dagster.yaml that lets at most one iteration run at a time through the run
queue), so `DAGSTER_HOME=<assets>/.dagster dagster dev` shows them afterwards. An iteration whose
benchmark_report exists for the same configuration is skipped unless --force. Progress goes to the terminal;
the loop ends with a table of held-out scores per iteration.

One writer per assets directory: `data/locks.py` (the lock `spogw run` holds) and `defs/run_executors.py` (the
executors that make every other run wait for it).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TextIO

import dagster as dg
import polars as pl

from spogw_dagster.pipeline.data.checkpoints import adapter_damage
from spogw_dagster.pipeline.data.locks import assets_dir_lock
from spogw_dagster.pipeline.data.report_stats import curve_table_text
from spogw_dagster.pipeline.data.storage import AssetStore, default_assets_dir, sweep_temp_files, write_parquet_atomic
from spogw_dagster.pipeline.defs.assets import ASSET_NAMES
from spogw_dagster.pipeline.defs.assets.common import frame_data_version, parent_or_fail
from spogw_dagster.pipeline.defs.partitions import PARTITIONS_NAME, iteration_key
from spogw_dagster.pipeline.defs.run_executors import close_orphaned_runs, worker_tags
from spogw_dagster.pipeline.defs.sensors import JOB_NAME
from spogw_dagster.pipeline.defs.wiring import COMPARISON_JOB, build_definitions
from spogw_dagster.pipeline.domain.errors import StaleInputError
from spogw_dagster.pipeline.domain.headline import headline, headline_text, seed_overrides, seed_table, seed_table_text
from spogw_dagster.pipeline.domain.lineage import check_sampled_from_parent
from spogw_dagster.pipeline.profiles import HEADLINE_RUN as h
from spogw_dagster.pipeline.runs.preflight import require
from spogw_dagster.pipeline.settings import ConfigValidationError

INSTANCE_YAML = """\
# Written by `spogw run`: the persistent Dagster instance of this assets directory.
# At most one SPOGW iteration runs at a time through the run queue (UI launches, the sensor, backfills).
run_queue:
  tag_concurrency_limits:
    - key: spogw/loop
      limit: 1
telemetry:
  enabled: false
"""


@contextlib.contextmanager
def restored_environ(*keys: str):
    """The environment variables `keys` as they were before, however the block ends."""
    saved = {k: os.environ.get(k) for k in keys}
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def ensure_dagster_home(assets_dir: Path) -> Path:
    """$DAGSTER_HOME if set, else <assets>/.dagster (created with INSTANCE_YAML)."""
    home = os.environ.get("DAGSTER_HOME")
    p = Path(home).expanduser().resolve() if home else (assets_dir / ".dagster")
    p.mkdir(parents=True, exist_ok=True)
    y = p / "dagster.yaml"
    if not y.exists():
        y.write_text(INSTANCE_YAML)
    os.environ["DAGSTER_HOME"] = str(p)
    return p


@dataclass
class IterationOutcome:
    key: str
    status: str  # "ok" | "skipped" | "failed"
    wall_s: float = 0.0
    asset_s: dict[str, float] = field(default_factory=dict)
    checks: dict[str, bool] = field(default_factory=dict)
    error: str = ""
    run_id: str = ""
    asset_peak_mb: dict[str, float] = field(default_factory=dict)  # each step's own peak RSS (`peak_rss_mb`)

    def peak(self) -> tuple[str, float] | None:
        """The step with the highest peak resident memory, and that peak in MiB."""
        return max(self.asset_peak_mb.items(), key=lambda kv: kv[1]) if self.asset_peak_mb else None


def _asset_metric(result, name: str) -> dict[str, float]:
    """A float metadata entry of each asset the run materialized (`wall_s`, `peak_rss_mb`)."""
    out: dict[str, float] = {}
    for ev in result.get_asset_materialization_events():
        md = ev.materialization.metadata
        if name in md:
            out[ev.asset_key.to_user_string()] = float(md[name].value)
    return out


def peak_sentence(outcomes: list["IterationOutcome"]) -> str | None:
    """The run's peak resident memory: the highest step peak. Each step resets the kernel's high-water mark as
    it starts (so that its own peak can be recorded), so `/usr/bin/time` around a run sees only the last step's."""
    peaks = [(o.key, *p) for o in outcomes if (p := o.peak()) is not None]
    if not peaks:
        return None
    key, asset, mb = max(peaks, key=lambda t: t[2])
    return (f"peak memory of this process: {mb / 1024:.1f} GiB, in {asset}[{key}] (each step's `peak_rss_mb`; "
            "`/usr/bin/time` around `spogw run` reports only the last step's, since each step resets the counter)")


def _failure_message(result) -> str:
    msgs = []
    for ev in result.all_events:
        if ev.is_step_failure:
            data = ev.step_failure_data
            err = data.error if data else None
            text = ""
            if data is not None and data.user_failure_data is not None and data.user_failure_data.description:
                text = data.user_failure_data.description
            elif err is not None:
                text = _user_error_text(err)
            msgs.append(f"{ev.step_key}: {text}")
    return "\n".join(msgs) or "run failed (see the Dagster event log)"


def _user_error_text(err) -> str:
    """The first error in the chain that is not Dagster's wrapper (the asset's own message, which names the
    file and the fix), then its root cause in brackets: never just the root cause, which for a wrapped error
    (e.g. sqlite3's "file is not a database") names neither."""
    cause = err
    while cause.cls_name and cause.cls_name.startswith("Dagster") and cause.cause is not None:
        cause = cause.cause
    text = f"{cause.cls_name}: {cause.message.strip()}" if cause.cls_name else cause.message.strip()
    root = cause
    while root.cause is not None:
        root = root.cause
    if root is not cause:
        text += f" (caused by {root.cls_name}: {root.message.strip()})"
    return text


def run_loop(
    profile: str | None = None,
    config_file: str | None = None,
    iterations: int | None = None,
    assets_dir: str | os.PathLike[str] | None = None,
    force: bool = False,
    out: TextIO | None = None,
    instance=None,
    log_level: str = "WARNING",
    overrides: dict | None = None,
    steps: "InProcessSteps | None" = None,
) -> list[IterationOutcome]:
    """The loop: each iteration one run of the iteration job, executed by `steps` (InProcessSteps, the
    default; container_steps.ContainerSteps runs every step in its own container)."""
    # sys.stdout at call time, not at import: a default bound at import writes past whatever replaced it since
    out = out or sys.stdout
    overrides = {**(overrides or {}), **({"iterations": iterations} if iterations is not None else {})}
    root = Path(assets_dir).expanduser().resolve() if assets_dir else default_assets_dir()
    cfg = require(profile, config_file, overrides or None, assets_dir=root)  # what `spogw check` prints
    steps = steps or InProcessSteps()
    # the run points DAGSTER_HOME at its instance (ensure_dagster_home); the caller's comes back after, so a
    # later loop in this process (the next seed, another assets directory) gets its own
    with assets_dir_lock(root, steps.command), restored_environ("DAGSTER_HOME"):
        return _run_loop_locked(cfg, root, config_file, force, out, instance, log_level, steps)


class InProcessSteps:
    """How `spogw run` executes an iteration's run: every step in this process (`execute_in_process`, which
    replaces the code location's locking executor, so the run never waits for the lock `spogw run` holds)."""

    command = "spogw run"

    @contextlib.contextmanager
    def session(self, cfg, root: Path, config_file, say: Callable[[str], None]):
        yield self

    def execute(self, defs, instance, key: str, selection, tags: dict[str, str], run_config: dict):
        return defs.resolve_job_def(JOB_NAME).execute_in_process(
            partition_key=key, instance=instance, raise_on_error=False, asset_selection=selection,
            tags={**tags, **worker_tags()}, run_config=run_config)

    def finished(self, key: str, result) -> str:
        """What to add to the iteration's last line (a container count, say); '' for nothing."""
        return ""


def _run_loop_locked(cfg, root: Path, config_file, force: bool, out: TextIO, instance,
                     log_level: str, steps: InProcessSteps) -> list[IterationOutcome]:
    store = AssetStore(root)
    own_instance = instance is None
    if own_instance:
        home = ensure_dagster_home(root)
        instance = dg.DagsterInstance.get()
    else:
        home = Path(instance.root_directory) if getattr(instance, "root_directory", None) else None
    defs = build_definitions(assets_dir=root, config=cfg)
    interrupted = close_orphaned_runs(instance)

    def say(msg: str) -> None:
        print(msg, file=out, flush=True)

    swept = sweep_temp_files(root)  # under the lock: only a killed writer can have left these
    if swept:
        say(f"removed {len(swept)} temporary file(s) an interrupted run left behind: "
            + ", ".join(str(p.relative_to(root)) for p in swept[:5]) + (" ..." if len(swept) > 5 else ""))
    say(f"spogw run: profile {cfg.profile}, {cfg.iterations} iteration(s), config {cfg.hash[:12]}, "
        f"benchmark {cfg.benchmark.name} (d={cfg.benchmark.train_queries}, held-out={cfg.benchmark.heldout_queries}), "
        f"m={cfg.curation.m} n={cfg.curation.n} t={cfg.curation.t}, objective {cfg.training.objective}")
    source = f"SPOGW_CONFIG={Path(config_file).resolve()}" if config_file else f"SPOGW_PROFILE={cfg.profile}"
    say(f"  assets: {root}\n  Dagster instance: {home}\n  the UI on this run, from the repo root: "
        f"DAGSTER_HOME={home} {source} SPOGW_ASSETS_DIR={root} dagster dev")
    for run_id, pid in interrupted:
        say(f"  run {run_id[:8]} (pid {pid}) ended without finishing (killed?): marked failed in the instance; "
            "the assets it finished are kept, the rest is rerun")
    outcomes: list[IterationOutcome] = []
    try:
        with _progress_to(out), steps.session(cfg, root, config_file, say):
            for k in range(cfg.iterations):
                key = iteration_key(k)
                damaged = None
                if not force and _already_reported(store, key, cfg.hash):
                    damaged = damaged_assets(store, key)
                    if not damaged:
                        say(f"iteration {key}: benchmark_report exists for this config; skipped (use --force to rerun)")
                        outcomes.append(IterationOutcome(key, "skipped"))
                        continue
                    say(f"iteration {key}: benchmark_report exists, but {', '.join(f'{a}[{key}]' for a in damaged)} "
                        "is missing, damaged or stale: rerunning the iteration from there")
                if not instance.has_dynamic_partition(PARTITIONS_NAME, key):
                    instance.add_dynamic_partitions(PARTITIONS_NAME, [key])
                start = 0 if force else resume_index(instance, defs, store, key, damaged)
                if start:
                    say(f"iteration {key}: {', '.join(ASSET_NAMES[:start])} already materialized with this code and "
                        f"config (an interrupted run's finished work): resuming at {ASSET_NAMES[start]}")
                outcomes.append(_run_iteration(steps, defs, instance, key, log_level, say, start=start))
                if outcomes[-1].status == "failed":
                    break
        if peak := peak_sentence(outcomes):
            say(peak)
        say("")
        say(summary_table(store, cfg.iterations))
        if pointer := headline_pointer(cfg.profile):
            say("")
            say(pointer)
    finally:
        if own_instance:
            instance.dispose()
    return outcomes


@contextlib.contextmanager
def _progress_to(out: TextIO):
    """The assets' progress lines (logger spogw.progress) go to `out` while the loop runs."""
    progress = logging.getLogger("spogw.progress")
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("  %(asctime)s %(message)s", "%H:%M:%S"))
    progress.addHandler(handler)
    progress.setLevel(logging.INFO)
    progress.propagate = False
    try:
        yield
    finally:
        progress.removeHandler(handler)


def damaged_assets(store: AssetStore, key: str) -> list[str]:
    """The assets of iteration `key` whose partition is missing or unreadable, or stale in a way no config hash
    shows: sampled_workflows sampled from another adapter than the one now at k-1, lora_checkpoint's adapter
    folder not the one its row records."""

    return [a for a in ASSET_NAMES if not store.readable(a, key)
            or (a == "sampled_workflows" and not _sampled_from_current_parent(store, key))
            or (a == "lora_checkpoint" and adapter_damage(store, key) is not None)]


def _sampled_from_current_parent(store: AssetStore, key: str) -> bool:
    try:
        check_sampled_from_parent(key, parent_or_fail(store, key), store.read_parquet("sampled_workflows", key))
    except (dg.Failure, StaleInputError):  # no parent (parent_or_fail), or another parent than the one sampled
        return False
    return True


def resume_index(instance, defs, store: AssetStore, key: str, damaged: list[str] | None = None) -> int:
    """How many assets of the chain (ASSET_NAMES, in order) iteration `key` can keep: each has a readable
    partition whose content is the data version its latest materialization in `instance` recorded, made by the
    current code version (config section and source closure; `versions.py`) from the latest materialization of
    each of its inputs (Dagster's input event pointers); sampled_workflows must have been sampled from the
    adapter now at k-1, lora_checkpoint's adapter must be the bytes its row records. The first that fails this,
    and everything after it, is rerun. A partition file with no such record (a copied directory, a kill
    between the file and its event) counts as not materialized. `damaged`: `damaged_assets(store, key)`, when
    the caller has it already."""
    damaged = set(damaged_assets(store, key) if damaged is None else damaged)
    latest: dict[str, int] = {}  # storage id of each kept asset's latest materialization
    pointer = "dagster/input_event_pointer/"
    for i, name in enumerate(ASSET_NAMES):
        akey = dg.AssetKey(name)
        if name in damaged:  # unreadable, sampled from another parent, or an adapter not the recorded bytes
            return i
        frame = store.read_parquet(name, key)
        recs = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=akey, asset_partitions=[key]),
                                               limit=1).records
        if not recs:
            return i
        tags = recs[0].asset_materialization.tags or {}
        if tags.get("dagster/code_version") != defs.get_assets_def(akey).code_versions_by_key.get(akey):
            return i
        inputs = {t[len(pointer):]: v for t, v in tags.items() if t.startswith(pointer)}
        if any(str(latest.get(up)) != v for up, v in inputs.items()):  # made from an older upstream
            return i
        recorded = tags.get("dagster/data_version")
        if recorded is None or frame_data_version(frame).value != recorded:  # the file is what was recorded
            return i
        latest[name] = recs[0].storage_id
    return len(ASSET_NAMES)


def _run_iteration(steps: InProcessSteps, defs, instance, key: str, log_level: str, say: Callable[[str], None],
                   start: int = 0) -> IterationOutcome:
    """Materialize one partition of the six assets (from ASSET_NAMES[start] on) with `steps`; print each
    asset's time and the checks."""
    say(f"iteration {key}: running {' -> '.join(ASSET_NAMES[start:])}")
    t0 = time.monotonic()
    result = steps.execute(
        defs, instance, key, [dg.AssetKey(a) for a in ASSET_NAMES[start:]] if start else None,
        {"spogw/iteration": key, "spogw/launched_by": steps.command},
        {"loggers": {"console": {"config": {"log_level": log_level}}}})
    wall = time.monotonic() - t0
    extra = steps.finished(key, result)  # after the time: removing step containers is not the iteration's
    o = IterationOutcome(key, "ok" if result.success else "failed", wall,
                         _asset_metric(result, "wall_s"), run_id=result.run_id,
                         checks={e.check_name: e.passed for e in result.get_asset_check_evaluations()},
                         asset_peak_mb=_asset_metric(result, "peak_rss_mb"))
    for a in ASSET_NAMES:
        if a in o.asset_s:
            mb = o.asset_peak_mb.get(a)
            say(f"  {a:<18} {o.asset_s[a]:8.1f} s" + (f"  {mb / 1024:5.1f} GiB peak" if mb is not None else ""))
    failed_checks = [c for c, ok in o.checks.items() if not ok]
    say(f"  checks: {len(o.checks) - len(failed_checks)}/{len(o.checks)} passed"
        + (f" (failed: {', '.join(failed_checks)})" if failed_checks else ""))
    if not result.success:
        o.error = _failure_message(result)
        if any(t in o.error for t in ("No space left on device", "Read-only file system", "Disk quota exceeded")):
            o.error += ("\nFix: free space on the assets directory's file system (or pass --assets-dir elsewhere) "
                        "and run again: completed partitions are kept and the rerun resumes")
        say(f"iteration {key} FAILED after {o.wall_s:.1f} s:\n  " + o.error.replace("\n", "\n  "))
    else:
        say(f"iteration {key}: done in {o.wall_s:.1f} s" + (f", {extra}" if extra else "")
            + f" (run {result.run_id[:8]})")
    return o


def _already_reported(store: AssetStore, key: str, config_hash: str) -> bool:
    if not store.exists("benchmark_report", key):
        return False
    try:
        rep = store.read_parquet("benchmark_report", key)
    except Exception:
        return False
    return rep.height > 0 and set(rep["config_hash"].to_list()) == {config_hash}


def summary_table(store: AssetStore, iterations: int) -> str:
    """Held-out metrics per iteration with 95% intervals (checkpoint, π_{k-1}, baselines; greedy and sampled)
    and the checkpoint's paired difference to π_{k-1}."""
    rows = []
    for k in range(iterations):
        key = iteration_key(k)
        if store.exists("benchmark_report", key):
            rep = store.read_parquet("benchmark_report", key)
            if "metric" in rep.columns:  # reports written before the long format are skipped
                rows.append(rep)
    if not rows:
        return "no benchmark_report yet"
    rep = pl.concat(rows, how="diagonal_relaxed")
    split = ", ".join(sorted(set(rep["split"].to_list())))
    try:
        head = headline_text(headline(store))
    except ValueError as e:  # e.g. systems scored with other seeds: the table above still stands
        head = f"headline: not computed ({e})"
    return "\n".join([f"held-out scores per iteration ({split} split; 95% intervals: Wilson with the query design "
                      "effect for rates, query bootstrap for means; Δ: paired bootstrap over queries)", "",
                      curve_table_text(rep)] + (["", head] if head else []))


def headline_pointer(profile: str) -> str:
    """Under any profile but the headline's, where the headline run is and what it costs."""
    if profile == h["profile"]:
        return ""
    return (f"the headline run (Qwen2.5-Coder-0.5B as generator and executor, where answers can move): "
            f"`{h['command']}`, {h['wall']}; its numbers: {h['where']}")


def run_seeds(profile: str | None, config_file: str | None, iterations: int | None, assets_dir, seeds: list[int],
              force: bool = False, out: TextIO | None = None, log_level: str = "WARNING") -> list[IterationOutcome]:
    """The loop once per training seed, each in `<assets>/seed-<s>` (one call cache for all), then the last
    checkpoint's answer score against the base and the best baseline per seed and across seeds
    (`<assets>/seeds_summary.parquet`)."""
    out = out or sys.stdout
    root = Path(assets_dir).expanduser().resolve() if assets_dir else default_assets_dir()
    root.mkdir(parents=True, exist_ok=True)
    outcomes: list[IterationOutcome] = []
    per_seed: dict[int, list] = {}
    for s in seeds:
        print(f"=== training seed {s} ===", file=out, flush=True)
        o = run_loop(profile, config_file, iterations, root / f"seed-{s}", force=force, out=out, log_level=log_level,
                     overrides=seed_overrides(s, root / "call_cache.sqlite"))
        outcomes += o
        if any(x.status == "failed" for x in o):
            break
        per_seed[s] = headline(AssetStore(root / f"seed-{s}"))
    if per_seed and all(per_seed.values()):
        t = seed_table(per_seed)
        write_parquet_atomic(t, root / "seeds_summary.parquet")
        print("", file=out)
        print(seed_table_text(t), file=out, flush=True)
    return outcomes


def run_comparison(profile: str | None, config_file: str | None, iteration: int, methods: list[str] | None,
                   assets_dir: str | os.PathLike[str] | None = None, out: TextIO | None = None, instance=None,
                   split: str | None = None):
    """Materialize objective_comparison for one iteration (its report must exist) against the persistent
    instance, as `spogw run` would; returns the comparison frame. `methods` overrides comparison.methods
    and `split` comparison.split."""
    out = out or sys.stdout
    over = {k: v for k, v in (("methods", methods), ("split", split)) if v}
    root = Path(assets_dir).expanduser().resolve() if assets_dir else default_assets_dir()
    cfg = require(profile, config_file, {"comparison": over} if over else None, assets_dir=root)
    store = AssetStore(root)
    key = iteration_key(iteration)
    if not store.exists("benchmark_report", key):
        raise ConfigValidationError(f"benchmark_report[{key}] does not exist under {root}: run the loop that far "
                                    f"first (spogw run --iterations {iteration + 1}) or pass --assets-dir")
    with assets_dir_lock(root, "spogw compare"), restored_environ("DAGSTER_HOME"):
        return _run_comparison_locked(cfg, root, store, key, out, instance)


def _run_comparison_locked(cfg, root: Path, store: AssetStore, key: str, out: TextIO, instance):
    own = instance is None
    if own:
        ensure_dagster_home(root)
        instance = dg.DagsterInstance.get()
    try:
        if not instance.has_dynamic_partition(PARTITIONS_NAME, key):  # another DAGSTER_HOME than the loop's
            instance.add_dynamic_partitions(PARTITIONS_NAME, [key])
        job = build_definitions(assets_dir=root, config=cfg).resolve_job_def(COMPARISON_JOB)
        print(f"spogw compare: iteration {key}, methods {', '.join(cfg.comparison.methods)}", file=out, flush=True)
        t0 = time.monotonic()
        with _progress_to(out):
            result = job.execute_in_process(partition_key=key, instance=instance, raise_on_error=False,
                                            tags={"spogw/iteration": key, "spogw/launched_by": "spogw compare"},
                                            run_config={"loggers": {"console": {"config": {"log_level": "WARNING"}}}})
        if not result.success:
            raise RuntimeError(f"objective_comparison[{key}] failed:\n  " + _failure_message(result))
        print(f"done in {time.monotonic() - t0:.1f} s", file=out, flush=True)
    finally:
        if own:
            instance.dispose()
    return store.read_parquet("objective_comparison", key)
