"""`train_lora` on N processes: `fit_adapter(..., processes=N)` writes the job (examples, config, paths) to a
temporary folder and runs

    accelerate launch --multi_gpu --num_processes N -m spogw_dagster.core.training.launch JOB

which starts N copies of this module; each calls `train_lora` on the same job, and the processes train one
adapter together (`core.training.distributed`). With processes = 1 it is `train_lora` in this process. The result is
what `train_lora` returns: the adapter folder (written once, by rank 0), its stats and whether an identical
finished run was reused.

`--multi_gpu` is accelerate's name for its torchrun launcher; on a host without CUDA the processes join a gloo
group on the CPU (how the 2-process test runs), with CUDA each takes one GPU (so N must not exceed the GPUs
visible). One machine only: the job folder and the adapter are read and written on its local disk.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from spogw_dagster.adapter_files import STATS_FILE
from spogw_dagster.children import die_with_parent
from spogw_dagster.core.training.config import TrainConfig
from spogw_dagster.core.training.distributed import shutdown
from spogw_dagster.core.training.examples import TrainExample, TrainResult
from spogw_dagster.core.training.identity import finished_run
from spogw_dagster.core.training.trainer import train_lora  # the module itself: an editor follows it (the
# package re-exports it lazily, for callers that must not import torch; this module imports torch anyway)

__all__ = ["fit_adapter", "launch_command", "main"]

PROGRESS = "spogw-train-progress: "  # rank 0's progress lines on stdout, passed on to the caller
JOB_FILE, EXAMPLES_FILE, RESULT_FILE = "job.json", "examples.jsonl", "result.json"


def fit_adapter(
    examples: Sequence[TrainExample | Mapping[str, Any]],
    cfg: TrainConfig,
    output_dir: str | os.PathLike[str],
    base_model: str | os.PathLike[str],
    previous_adapter: str | os.PathLike[str] | None = None,
    processes: int = 1,
    log: Callable[[dict[str, Any]], None] | None = None,
    progress: Callable[[str], None] | None = None,
    snapshots: Mapping[int, str | os.PathLike[str]] | None = None,
) -> TrainResult:
    """Train the adapter in this process (processes = 1) or across `processes` launched by accelerate;
    `snapshots`: shorter runs to save on the way (`train_lora`)."""
    if processes < 1:
        raise ValueError(f"processes={processes}: must be at least 1")
    if processes == 1:
        return train_lora(examples, cfg, output_dir, base_model=base_model, previous_adapter=previous_adapter,
                          log=log, progress=progress, snapshots=snapshots)
    out = Path(output_dir).expanduser().resolve()
    if (done := finished_run(examples, cfg, out, base_model, previous_adapter)) is not None:
        return TrainResult(out, done, reused=True)  # no launch for a run that is already there (or bad input)
    exs = [e if isinstance(e, TrainExample) else TrainExample.from_dict(e) for e in examples]
    _check_devices(cfg, processes)
    job = Path(tempfile.mkdtemp(prefix="spogw-train-job-"))
    try:
        _write_job(job, exs, cfg, out, base_model, previous_adapter, snapshots)
        _run(launch_command(job, processes), processes, progress)
        result = json.loads((job / RESULT_FILE).read_text())
    finally:
        shutil.rmtree(job, ignore_errors=True)
    stats = json.loads((out / STATS_FILE).read_text())
    if log is not None:
        for st in stats.get("steps", []):
            log(st)
    return TrainResult(out, stats, reused=bool(result["reused"]))


def launch_command(job: Path, processes: int) -> list[str]:
    """The `accelerate launch` command that trains `job` on `processes` processes of this machine (port 0:
    accelerate picks a free one as it starts the group)."""
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            "--main_process_port", "0", "-m", "spogw_dagster.core.training.launch", str(job)]


def _check_devices(cfg: TrainConfig, processes: int) -> None:
    """One GPU per process: refuse, before launching anything, more processes than visible GPUs."""
    if cfg.device == "cpu" or not torch.cuda.is_available():
        return
    gpus = torch.cuda.device_count()
    if processes > gpus:
        raise ValueError(f"training.processes={processes} but {gpus} GPU(s) are visible (CUDA_VISIBLE_DEVICES="
                         f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); fix: processes <= {gpus}")


def _write_job(job: Path, exs: Sequence[TrainExample], cfg: TrainConfig, out: Path, base_model, previous,
               snapshots: Mapping[int, str | os.PathLike[str]] | None = None) -> None:
    with open(job / EXAMPLES_FILE, "w") as f:
        for e in exs:
            f.write(json.dumps(e.canonical()) + "\n")
    (job / JOB_FILE).write_text(json.dumps({
        "config": cfg.to_dict(), "output_dir": str(out), "base_model": str(base_model),
        "previous_adapter": None if previous is None else str(previous),
        "snapshots": {str(e): str(p) for e, p in (snapshots or {}).items()}}))


def _run(cmd: list[str], processes: int, progress: Callable[[str], None] | None) -> None:
    """Run the launcher, passing rank 0's progress lines on; on failure raise with the end of its output."""
    tail: collections.deque[str] = collections.deque(maxlen=60)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    env.setdefault("OMP_NUM_THREADS", str(max(1, cores // processes)))  # no oversubscription
    # SIGTERM when this process dies: the launcher (torch's elastic agent) then stops its workers
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                            env=env, preexec_fn=die_with_parent(signal.SIGTERM))
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            if line.startswith(PROGRESS):
                if progress is not None:
                    progress(line[len(PROGRESS):])
            else:
                tail.append(line)
        rc = proc.wait()
    except BaseException:  # interrupted (a Dagster termination, Ctrl-C) or a failing callback: stop the job
        _stop(proc)
        raise
    finally:
        if proc.stdout is not None:
            proc.stdout.close()
    if rc != 0:
        text = "\n".join(tail)
        raise RuntimeError(f"training on {processes} processes failed (accelerate launch exit {rc}); the end of its "
                           f"output:\n{text}\nfix: the error above; to rule out the launcher, set "
                           "training.processes: 1")


def _stop(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM (the elastic agent then stops its workers), SIGKILL after `grace_s`."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv: Sequence[str] | None = None) -> int:
    """One training process of a launched job (accelerate sets RANK and WORLD_SIZE)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: accelerate launch ... -m spogw_dagster.core.training.launch JOB_DIR", file=sys.stderr)
        return 2
    job = Path(args[0])
    spec = json.loads((job / JOB_FILE).read_text())
    with open(job / EXAMPLES_FILE) as f:
        exs = [TrainExample.from_dict(json.loads(line)) for line in f if line.strip()]
    res = train_lora(exs, TrainConfig.from_dict(spec["config"]), spec["output_dir"], base_model=spec["base_model"],
                     previous_adapter=spec["previous_adapter"],
                     progress=lambda msg: print(PROGRESS + msg, flush=True),
                     snapshots={int(e): p for e, p in spec.get("snapshots", {}).items()})
    if int(os.environ.get("RANK", "0")) == 0:
        (job / RESULT_FILE).write_text(json.dumps({"reused": res.reused}))
    shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
