"""Steps in containers, the run side: the step image, and `spogw run` with every step in its own container.

`python -m spogw_dagster.pipeline.runs.container_steps run --profile ci` is the loop of `loop.run_loop` with the
executor of `step_executor.py` (`ContainerSteps`): each iteration one `execute_job` of the iteration job, its
steps in containers; `spogw run` itself runs steps in-process.

The image (IMAGE) is a skeleton built in seconds with no registry, made by sandboxing/images.py like the sandbox's: `docker
import` of a tar holding only this host's top-level layout; the step sees the host's /usr, the interpreter's
prefix, the repository and its venv read-only at their own paths (so no pip inside a build, and a code change
needs no rebuild), and read-write, at their own paths: the assets directory (Parquet, adapters, the call cache
`call_cache.sqlite`, `spogw.duckdb`), the Dagster instance ($DAGSTER_HOME: sqlite run/event storage and
compute logs) and our cache directory (converted models). So the engine must run on this host. docker/Dockerfile
is the self-contained image for an engine elsewhere (`docker/build_image.sh` builds it as spogw:latest; select it
with SPOGW_STEP_IMAGE=spogw:latest): its steps run the image's own Python, venv and code (at this repository's
path, checked by own_image_status), and only those three read-write directories are bound.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

import dagster as dg
from dagster._core.definitions.reconstruct import ReconstructableRepository

from spogw_dagster.pipeline.defs.sensors import JOB_NAME
from spogw_dagster.pipeline.defs.step_executor import ENV_IMAGE, ENV_SWITCH, IMAGE, REPO, STEP_LABEL
from spogw_dagster.pipeline.defs.wiring import definitions_from_env
from spogw_dagster.pipeline.runs.loop import restored_environ, run_loop
from spogw_dagster.sandboxing import images
from spogw_dagster.sandboxing.engine import DockerUnavailableError, docker, last_line
from spogw_dagster.sandboxing.images import ImageSpec, host_skeleton

SKELETON_LABEL = "org.spogw.steps.skeleton"
MODULE = "spogw_dagster.pipeline.runs.container_steps"  # what the step containers load (`defs`), even under -m


# ---------------------------------------------------------------- the image

# The host's layout with /sbin as on the host (ctypes finds libseccomp through /sbin/ldconfig) and no sandbox
# scripts (bwrap runs inside the step); /usr, the venv and the repository are bound at run time.
STEP_IMAGE = ImageSpec(tag=IMAGE, label=SKELETON_LABEL, entries=lambda: host_skeleton(host_sbin=True),
                       message="spogw step skeleton (host layout only; /usr, the venv and the repo are bound at run time)",
                       changes=(f"WORKDIR {REPO}",))


def image_status() -> tuple[bool, str]:
    return images.image_status(STEP_IMAGE)


def build_image(force: bool = False, log=print) -> str:
    """IMAGE with no registry and no build: `docker import` of the skeleton (a few hundred bytes). Idempotent."""
    return images.build_image(STEP_IMAGE, force, log)


def own_image_status(image: str) -> tuple[bool, str]:
    """A self-contained image (docker/Dockerfile, e.g. spogw:latest) is usable for this repository: it exists and
    was built with SRC = this repository's path (the code location's working directory, which the steps load
    their code from; nothing of the host's is bound for such an image)."""
    res = docker("image", "inspect", "--format", "{{.Config.WorkingDir}}", image)
    if res.returncode != 0:
        return False, (f"image {image} is missing ({last_line(res)}). Fix: docker/build_image.sh (builds spogw:latest "
                       "from docker/Dockerfile with no registry)")
    wd = res.stdout.decode().strip()
    if wd != str(REPO):
        return False, (f"image {image} was built with SRC={wd or '(none)'}, not this repository ({REPO}): the steps "
                       "load the code location from that path. Fix: docker/build_image.sh from this checkout")
    return True, "ok"


# ---------------------------------------------------------------- the loop

_DEFS: dict[tuple, Any] = {}


def _lazy_defs():
    key = tuple(os.environ.get(k) for k in (ENV_SWITCH, "SPOGW_PROFILE", "SPOGW_CONFIG", "SPOGW_ASSETS_DIR"))
    if key not in _DEFS:
        _DEFS[key] = definitions_from_env()
    return _DEFS[key]


def _recon_job(job_name: str):
    repo = ReconstructableRepository.for_module(MODULE, "defs", working_directory=str(REPO))
    return repo.get_reconstructable_job(job_name)


def step_containers(pid: int | None = None) -> list[dict[str, str]]:
    """Our step containers (of the orchestrating process `pid`): name, id, hostname, exit code, status, image,
    step key, mounts."""
    res = docker("ps", "--all", "--filter", f"label={STEP_LABEL}" + (f"={pid}" if pid else ""),
                 "--format", "{{.ID}}")
    ids = res.stdout.decode().split() if res.returncode == 0 else []
    if not ids:
        return []
    res = docker("inspect", "--format", "{{json .}}", *ids)
    out = []
    for line in res.stdout.decode().splitlines():
        d = json.loads(line)
        out.append({"id": d["Id"], "name": d["Name"].lstrip("/"), "hostname": d["Config"]["Hostname"],
                    "image": d["Config"]["Image"], "exit_code": str(d["State"]["ExitCode"]),
                    "status": d["State"]["Status"],
                    "mounts": [{k: m.get(k) for k in ("Type", "Source", "Destination", "RW")}
                               for m in d.get("Mounts") or []],
                    "step": next((e.split("=", 1)[1] for e in d["Config"]["Env"]
                                  if e.startswith("DAGSTER_RUN_STEP_KEY=")), "")})
    return out


def remove_step_containers(pid: int | None = None) -> int:
    ids = [c["id"] for c in step_containers(pid)]
    if ids:
        docker("rm", "--force", *ids, timeout=120)
    return len(ids)


class _Reaper:
    """Removes our step containers as their steps finish, during a run, and keeps what step_containers said of
    each. With a self-contained image and the vfs storage driver every container holds a full copy of the image
    (~2 GB): kept until the end of an iteration, its twelve step containers alone fill a disk; reaped, the disk
    holds those of the steps running (SPOGW_STEP_MAX_CONCURRENT). A container goes once it has exited with code
    0 and stayed so for `grace` seconds: its step wrote its last event before exiting, and the executor checks a
    container's health only while its step has no such event (it reads the event log every fraction of a second;
    a health check of a removed container would report the step unhealthy). A container that exited non-zero
    stays for the executor's health check, and goes with the rest after the iteration."""

    def __init__(self, pid: int, grace: float = 10.0, every: float = 2.0):
        self.pid, self.grace, self.every = pid, grace, every
        self._reaped: list[dict[str, Any]] = []
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="spogw-step-reaper", daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=150)

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.sweep()
            except Exception:  # noqa: BLE001, S110 (best effort: whatever is left goes after the iteration)
                pass

    def sweep(self) -> None:
        with self._lock:
            now = time.monotonic()
            for c in step_containers(self.pid):
                if c["status"] != "exited" or c["exit_code"] != "0":
                    continue
                if (now - self._seen.setdefault(c["id"], now) >= self.grace
                        and docker("rm", "--force", c["id"], timeout=120).returncode == 0):
                    self._reaped.append(c)

    def take(self) -> list[dict[str, Any]]:
        """The step containers since the last take: those reaped and those still there (not reaped meanwhile)."""
        with self._lock:
            out, self._reaped = self._reaped + step_containers(self.pid), []
            return out


@contextlib.contextmanager
def _removing_containers(remove: bool):
    try:
        yield
    finally:  # also when a run raised: no step container of ours outlives the loop
        if remove:
            remove_step_containers(os.getpid())


class ContainerSteps:
    """How the loop executes an iteration's run with every step in its own container: the iteration job of the
    code location `MODULE` (built from the environment this sets: SPOGW_STEP_EXECUTOR=docker, the assets
    directory and the config), run by `dg.execute_job` through the docker executor of `step_executor.py`."""

    command = "spogw run (steps in containers)"

    def __init__(self, keep_containers: bool = False):
        self.keep_containers = keep_containers
        self.containers: dict[str, list[dict[str, Any]]] = {}  # what step_containers said, per iteration
        self._reaper: _Reaper | None = None

    @contextlib.contextmanager
    def session(self, cfg, root: Path, config_file, say):
        # the step containers read these; the caller's environment is restored after
        with restored_environ(ENV_SWITCH, "SPOGW_ASSETS_DIR", "SPOGW_CONFIG", "SPOGW_PROFILE"):
            os.environ.update({ENV_SWITCH: "docker", "SPOGW_ASSETS_DIR": str(root)})
            if config_file:
                os.environ["SPOGW_CONFIG"] = str(Path(config_file).resolve())
                os.environ.pop("SPOGW_PROFILE", None)
            else:
                os.environ["SPOGW_PROFILE"] = cfg.profile
                os.environ.pop("SPOGW_CONFIG", None)
            if os.environ.get(ENV_IMAGE):
                ok, why = own_image_status(os.environ[ENV_IMAGE])
                if not ok:
                    raise DockerUnavailableError(why)
            else:
                say(build_image(log=say))
            self._recon = _recon_job(JOB_NAME)
            reaper = contextlib.nullcontext(None) if self.keep_containers else _Reaper(os.getpid())
            with _removing_containers(not self.keep_containers), reaper as self._reaper:
                yield self

    def execute(self, defs, instance, key: str, selection, tags: dict[str, str], run_config: dict):
        return dg.execute_job(self._recon, instance, asset_selection=selection, run_config=run_config,
                              tags={"dagster/partition": key, **tags, "spogw/pid": str(os.getpid())})

    def finished(self, key: str, result) -> str:
        found = self._reaper.take() if self._reaper else step_containers(os.getpid())
        self.containers[key] = found
        if not self.keep_containers:
            remove_step_containers(os.getpid())
        return f"{len(found)} step containers ({os.environ.get(ENV_IMAGE) or IMAGE})"


def run_loop_in_containers(profile: str | None = None, config_file: str | None = None, iterations: int | None = None,
                           assets_dir: str | os.PathLike[str] | None = None, force: bool = False,
                           out: TextIO | None = None, keep_containers: bool = False) -> list[dict[str, Any]]:
    """`spogw run` with every step in its own container (`ContainerSteps`), against the persistent instance of
    the assets dir. Returns one dict per iteration: key, status, wall_s, run_id, containers (what
    step_containers said of those its steps ran in). Step containers are removed as their steps finish
    (_Reaper) and at the end of each iteration, unless keep_containers (then the caller removes them:
    remove_step_containers)."""
    steps = ContainerSteps(keep_containers)
    outcomes = run_loop(profile, config_file, iterations, assets_dir, force=force, out=out, steps=steps)
    return [{"key": o.key, "status": o.status, "wall_s": o.wall_s, "run_id": o.run_id,
             "containers": steps.containers.get(o.key, [])} for o in outcomes]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m spogw_dagster.pipeline.runs.container_steps",
                                description="Steps in containers: build the step image, or run the loop with "
                                            "every asset step in its own container.")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build-image", help=f"import {IMAGE} (no registry; seconds)")
    r = sub.add_parser("run", help="the loop, each step in a container (docker_executor)")
    r.add_argument("--profile", default=None)
    r.add_argument("--config", default=None)
    r.add_argument("--iterations", type=int, default=None)
    r.add_argument("--assets-dir", default=None)
    r.add_argument("--force", action="store_true")
    a = p.parse_args(argv)
    if a.cmd == "build-image":
        print(build_image())
        return 0
    t0 = time.monotonic()
    res = run_loop_in_containers(a.profile or (None if a.config else "tiny"), a.config, a.iterations,
                                 a.assets_dir, a.force)
    print(f"total wall time {time.monotonic() - t0:.1f} s")
    return 0 if all(r["status"] != "failed" for r in res) else 1


def __getattr__(name: str):  # `defs` (what the step containers load) is built on first access, from the env
    if name == "defs":
        return _lazy_defs()
    raise AttributeError(name)


if __name__ == "__main__":
    sys.exit(main())
