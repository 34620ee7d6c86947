"""The loop driver: when benchmark_report(k) lands, add partition k+1 and launch its run.

The sensor is RUNNING by default (`loop.sensor: false` in the config leaves it STOPPED). It continues a loop
that has been started: iteration 0000 is materialized by whoever starts the loop (the UI, `dg launch`,
`dagster asset materialize` or `spogw run`), so opening `dagster dev` on an empty assets directory launches
nothing by itself. Iterations never run at the same time: the sensor requests nothing while any run (of the
iteration job or a one-asset launch) is queued or in progress, requests k+1 only once benchmark_report(k) is
materialized, and stops after the configured number of iterations. Each request carries a run key ("iteration-<k>-<config hash>"), so a
tick that races another cannot launch the same iteration twice, while a changed configuration can run it again.
A run whose worker process died (SIGKILL, OOM) is marked failed at the next tick (`run_executors.close_orphaned_runs`),
so it neither blocks the loop nor hides what happened; re-executing it from failure finishes its iteration.
(A multi-partition backfill from the UI would bypass this; sampled_workflows(k) then fails fast while
lora_checkpoint(k-1) is missing, so the order still holds.)
"""

from __future__ import annotations

import dagster as dg

from spogw_dagster.pipeline.defs.partitions import PARTITIONS_NAME, iteration_key, iterations, key_to_int
from spogw_dagster.pipeline.defs.run_executors import close_orphaned_runs

JOB_NAME = "spogw_iteration"
ACTIVE = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
          dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]


def next_iteration(keys: list[str], reported: set[str], max_iterations: int) -> tuple[str | None, str]:
    """Pure decision: (key to launch or None, why)."""
    keys = sorted(keys)
    if not keys:
        return None, ("no iteration yet: materialize iteration 0000 (UI, `dg launch`, `spogw run`) to start the "
                      "loop")
    last = keys[-1]
    if last not in reported:
        return None, f"waiting for benchmark_report[{last}]"
    nxt = key_to_int(last) + 1
    if nxt >= max_iterations:
        return None, f"done: {max_iterations} iteration(s) reported"
    return iteration_key(nxt), f"benchmark_report[{last}] landed: launching iteration {iteration_key(nxt)}"


def build_sensor(job: dg.UnresolvedAssetJobDefinition, max_iterations: int, config_hash: str = "",
                 running: bool = True) -> dg.SensorDefinition:
    """The sensor; `running` (the config's `loop.sensor`) is its default status: RUNNING, or STOPPED."""
    status = dg.DefaultSensorStatus.RUNNING if running else dg.DefaultSensorStatus.STOPPED

    @dg.sensor(name="next_iteration_sensor", job=job, minimum_interval_seconds=30, default_status=status,
               description=f"Launches iteration k+1 when benchmark_report(k) lands (up to {max_iterations}); "
                           "never while an iteration runs.")
    def next_iteration_sensor(context: dg.SensorEvaluationContext):
        inst = context.instance
        # a run whose worker was killed would stay "started" forever and block the loop: close it (failed,
        # with the reason) so the UI can re-execute it from failure
        for run_id, pid in close_orphaned_runs(inst):
            context.log.warning(f"run {run_id} lost its run worker (pid {pid}): marked failed; re-execute it "
                                "from failure to finish its iteration")
        # any run, not only the iteration job's: a one-asset launch from the UI or `dg launch` is one too
        active = inst.get_run_records(dg.RunsFilter(statuses=ACTIVE), limit=1)
        if active:
            run = active[0].dagster_run
            return dg.SkipReason(f"run {run.run_id} of {run.job_name} is still active")
        keys = list(inst.get_dynamic_partitions(PARTITIONS_NAME))
        reported = set(inst.get_materialized_partitions(dg.AssetKey("benchmark_report")))
        key, why = next_iteration(keys, reported, max_iterations)
        if key is None:
            return dg.SkipReason(why)
        context.log.info(why)
        return dg.SensorResult(
            run_requests=[dg.RunRequest(partition_key=key, run_key=f"iteration-{key}-{config_hash[:12]}",
                                        tags={"spogw/iteration": key})],
            dynamic_partitions_requests=[iterations.build_add_request([key])] if key not in keys else [],
        )

    return next_iteration_sensor
