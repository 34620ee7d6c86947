"""Steps in containers: the pipeline's steps run by `dagster_docker.docker_executor`, one container per step.

Switch: SPOGW_STEP_EXECUTOR=docker in the environment of the code location (`dagster dev`, a run worker) makes
`wiring.build_definitions` use `step_executor(root)`; unset or `in_process` keeps the in-process executor. It is
an environment switch, not a config field, on purpose: where a step runs changes no asset's output, so it stays
out of the config hash (as `loop:` does) and a switch never makes existing assets stale.
`python -m spogw_dagster.pipeline.container_steps run --profile ci` runs the loop with it (`spogw run` itself
uses `execute_in_process`, which always runs steps in-process).

The image (IMAGE) is a skeleton built in seconds with no registry, in the style of docker_sandbox.py: `docker
import` of a tar holding only this host's top-level layout; the step sees the host's /usr, the interpreter's
prefix, the repository and its venv read-only at their own paths (so no pip inside a build, and a code change
needs no rebuild), and read-write, at their own paths: the assets directory (Parquet, adapters, the call cache
`call_cache.sqlite`, `catalog.duckdb`), the Dagster instance ($DAGSTER_HOME: sqlite run/event storage and
compute logs) and our cache directory (converted models). So the engine must run on this host. docker/Dockerfile
is the self-contained image for an engine elsewhere (`docker/build_image.sh` builds it as spogw:latest; select it
with SPOGW_STEP_IMAGE=spogw:latest): its steps run the image's own Python, venv and code (at this repository's
path, checked by own_image_status), and only those three read-write directories are bound.

The sandbox inside a step container is the same bwrap sandbox as on the host (root + setpriv: a fresh uid with
no capabilities, no_new_privs, new net/pid/ipc/uts/mount namespaces, the seccomp filter of seccomp.py). bwrap
needs, in the step container: CAP_SYS_ADMIN (namespaces, mounts, pivot_root), CAP_NET_ADMIN (bringing up `lo`
in the new network namespace) and a seccomp profile that lets mount/umount2/pivot_root/unshare/chroot and clone
with namespace flags through; Docker's default profile denies pivot_root even with CAP_SYS_ADMIN. So the step
container runs with exactly those two capabilities added and `step_seccomp_profile()` (seccomp.py's deny list
minus those five syscalls and the clone flag rules). Generated code never sees these: it runs under bwrap with
all capabilities dropped and the full filter. The step container itself has no network (`network_mode: none`)
unless the executor is an HTTP endpoint (then host networking). cgroup limits are unavailable inside (the
container's cgroupfs is read-only): the sandbox falls back to rlimits there, as it says in its detail.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

ENV_SWITCH = "SPOGW_STEP_EXECUTOR"  # in_process (default) | docker
ENV_IMAGE = "SPOGW_STEP_IMAGE"  # another image (e.g. one built from docker/Dockerfile)
ENV_MAX_CONCURRENT = "SPOGW_STEP_MAX_CONCURRENT"
IMAGE = "spogw-steps:latest"
SKELETON_LABEL = "org.spogw.steps.skeleton"
STEP_LABEL = "org.spogw.step"  # on every step container: its value is the pid of the orchestrating process
REPO = Path(__file__).resolve().parents[2]
MODULE = "spogw_dagster.pipeline.container_steps"  # what the step containers load (`defs`), even under -m
# Syscalls of seccomp.py's deny list that bwrap itself needs to build the sandbox inside a step container.
BWRAP_NEEDS = ("mount", "umount2", "pivot_root", "unshare", "chroot")
# Environment passed through to the steps when set on the host (model/runtime knobs, never credentials).
_PASS_PREFIXES = ("SPOGW_", "OMP_", "MKL_", "HF_", "TRANSFORMERS_", "TOKENIZERS_", "TORCH_")
_PASS_SKIP = {"SPOGW_CACHE_DIR", "SPOGW_ASSETS_DIR"}


def mode() -> str:
    m = (os.environ.get(ENV_SWITCH) or "in_process").strip().lower().replace("-", "_")
    if m not in {"in_process", "docker"}:
        from .settings import ConfigValidationError

        raise ConfigValidationError(f"{ENV_SWITCH}={m!r}: expected in_process or docker")
    return m


# ---------------------------------------------------------------- the image

def skeleton_entries() -> list[tuple[str, str, str]]:
    """The sandbox skeleton's entries, with /sbin as on the host (ctypes finds libseccomp through
    /sbin/ldconfig) instead of the empty mount point the sandbox keeps for docker-init."""
    from .. import docker_sandbox

    drop = {"sbin", docker_sandbox.SANDBOX_DIR_INSIDE.strip("/")}  # no sandbox scripts: bwrap runs inside
    out = [e for e in docker_sandbox.skeleton_entries() if e[1] not in drop]
    out.append(("link", "sbin", os.readlink("/sbin")) if os.path.islink("/sbin") else ("dir", "sbin", ""))
    return out


def skeleton_digest() -> str:
    return hashlib.sha256(json.dumps(sorted(skeleton_entries())).encode()).hexdigest()[:16]


def _skeleton_tar() -> bytes:
    from ..docker_sandbox import tar_of

    return tar_of(skeleton_entries())


def image_status() -> tuple[bool, str]:
    from ..docker_sandbox import _tail, docker

    res = docker("image", "inspect", "--format", f'{{{{index .Config.Labels "{SKELETON_LABEL}"}}}}', IMAGE)
    if res.returncode != 0:
        return False, f"image {IMAGE} is missing ({_tail(res)})"
    if res.stdout.decode().strip() != skeleton_digest():
        return False, f"image {IMAGE} was built for another host layout"
    return True, "up to date"


def build_image(force: bool = False, log=print) -> str:
    """IMAGE with no registry and no build: `docker import` of the skeleton (a few hundred bytes). Idempotent."""
    from ..docker_sandbox import DockerUnavailableError, _tail, docker, engine_answers

    ok, why = engine_answers()
    if not ok:
        raise DockerUnavailableError(f"{why}. Fix: start one as root: `dockerd --storage-driver=vfs &`")
    if not force and image_status()[0]:
        return f"{IMAGE} is up to date"
    log(f"importing the step image {IMAGE} (host layout only; /usr, the venv and the repo are bound at run time)")
    res = docker("import", "--message", "spogw step skeleton", "--change", f"LABEL {SKELETON_LABEL}={skeleton_digest()}",
                 "--change", f"WORKDIR {REPO}", "-", IMAGE, stdin=_skeleton_tar())
    if res.returncode != 0:
        raise DockerUnavailableError(f"docker import of {IMAGE} failed: {_tail(res)}")
    return f"built {IMAGE}"


def own_image_status(image: str) -> tuple[bool, str]:
    """A self-contained image (docker/Dockerfile, e.g. spogw:latest) is usable for this repository: it exists and
    was built with SRC = this repository's path (the code location's working directory, which the steps load
    their code from; nothing of the host's is bound for such an image)."""
    from ..docker_sandbox import _tail, docker

    res = docker("image", "inspect", "--format", "{{.Config.WorkingDir}}", image)
    if res.returncode != 0:
        return False, (f"image {image} is missing ({_tail(res)}). Fix: docker/build_image.sh (builds spogw:latest "
                       "from docker/Dockerfile with no registry)")
    wd = res.stdout.decode().strip()
    if wd != str(REPO):
        return False, (f"image {image} was built with SRC={wd or '(none)'}, not this repository ({REPO}): the steps "
                       "load the code location from that path. Fix: docker/build_image.sh from this checkout")
    return True, "ok"


# ---------------------------------------------------------------- the step container

def step_seccomp_profile() -> dict:
    """seccomp.py's deny list (Docker's JSON form, as docker_sandbox.seccomp_profile) minus BWRAP_NEEDS and the
    clone-with-namespace rules: what bwrap needs to build the sandbox, which then applies the full filter."""
    from .. import docker_sandbox

    prof = docker_sandbox.seccomp_profile()
    rules = []
    for r in prof["syscalls"]:
        if r.get("args") and r["names"] == ["clone"]:
            continue
        names = [n for n in r["names"] if n not in BWRAP_NEEDS]
        if names:
            rules.append({**r, "names": names})
    return {**prof, "syscalls": rules}


def _ro_paths() -> list[str]:
    """Host paths each step needs read-only at the same path: /usr (+ real top-level dirs), the interpreter's
    prefix, the venv, the repository, the dynamic loader's cache, TLS certificates."""
    from .. import docker_sandbox

    paths = list(docker_sandbox.host_mounts())
    for p in (sys.prefix, str(REPO), "/etc/ld.so.cache", "/etc/ssl/certs"):
        if os.path.exists(p) and p not in paths:
            paths.append(p)
    return paths


def _under(path: str, dirs: list[str]) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in dirs)


def step_executor_config(root: Path) -> dict[str, Any]:
    """The docker_executor's config for the assets directory `root` (see the module docstring)."""
    from ..paths import cache_dir
    from .settings import load_config

    root = Path(root).resolve()
    home = Path(os.environ.get("DAGSTER_HOME") or root / ".dagster").resolve()
    cache = cache_dir().resolve()
    rw = [str(root)] + [str(p) for p in (home, cache) if not _under(str(p), [str(root)])]
    own_image = os.environ.get(ENV_IMAGE)  # a self-contained image (docker/Dockerfile): no host code bound
    ro = [] if own_image else [p for p in _ro_paths() if p not in rw]
    cfg_file = os.environ.get("SPOGW_CONFIG")
    if cfg_file and not _under(str(Path(cfg_file).resolve()), ro + rw):
        ro.append(str(Path(cfg_file).resolve().parent))
    env = {k: v for k, v in os.environ.items() if k.startswith(_PASS_PREFIXES) and k not in _PASS_SKIP}
    env.update({ENV_SWITCH: "docker", "SPOGW_ASSETS_DIR": str(root), "DAGSTER_HOME": str(home),
                "SPOGW_CACHE_DIR": str(cache), "HOME": "/tmp", "PYTHONUNBUFFERED": "1"})
    if not own_image:  # the step command is `dagster api execute_step ...`: the venv's, through the bind
        env["PATH"] = f"{Path(sys.prefix) / 'bin'}:/usr/local/bin:/usr/bin:/bin"
    try:  # an HTTP executor needs the network; the embedded one does not
        needs_net = bool(load_config(os.environ.get("SPOGW_PROFILE") or (None if cfg_file else "tiny"),
                                     cfg_file).executor.endpoints())
    except Exception:  # noqa: BLE001 (an unloadable config fails later, in the step, with its own message)
        needs_net = True
    volumes = {p: {"bind": p, "mode": "ro"} for p in ro}
    volumes.update({p: {"bind": p, "mode": "rw"} for p in rw})
    return {
        "image": own_image or IMAGE,
        "env_vars": [f"{k}={v}" for k, v in sorted(env.items())],
        "max_concurrent": int(os.environ.get(ENV_MAX_CONCURRENT) or 2),
        "container_kwargs": {
            "volumes": volumes,
            "network_mode": "host" if needs_net else "none",
            "user": "0:0",
            **({} if own_image else {"working_dir": str(REPO)}),
            "tmpfs": {"/tmp": "rw,mode=1777"},
            "cap_add": ["SYS_ADMIN", "NET_ADMIN"],
            "security_opt": [f"seccomp={json.dumps(step_seccomp_profile())}"],
            "labels": {STEP_LABEL: str(os.getpid())},
        },
    }


def step_executor(root: Path):
    """The docker_executor configured for `root`, or None when SPOGW_STEP_EXECUTOR is not docker."""
    if mode() != "docker":
        return None
    try:
        from dagster_docker import docker_executor
    except ImportError as e:
        from .settings import ConfigValidationError

        raise ConfigValidationError(f"{ENV_SWITCH}=docker needs dagster-docker ({e}). Fix: "
                                    "pip install -e '.[docker]'") from None
    return _locking(docker_executor, Path(root).resolve()).configured(step_executor_config(root), name="docker")


def _locking(base, root: Path):
    """`base` holding the assets directory's lock for the whole run (`locks.locking_executor`): runs launched
    from the UI, a backfill or the sensor wait in iteration order; a run this process orchestrates under its
    own lock (run_loop_in_containers) goes ahead."""
    from .locks import locking_executor

    return locking_executor(base, root, label="steps in containers", description=(
        "Each step in its own Docker container (dagster-docker), holding the assets directory's lock."))


# ---------------------------------------------------------------- the loop

_DEFS: dict[tuple, Any] = {}


def _lazy_defs():
    from .wiring import definitions_from_env

    key = tuple(os.environ.get(k) for k in (ENV_SWITCH, "SPOGW_PROFILE", "SPOGW_CONFIG", "SPOGW_ASSETS_DIR"))
    if key not in _DEFS:
        _DEFS[key] = definitions_from_env()
    return _DEFS[key]


def _recon_job(job_name: str):
    from dagster._core.definitions.reconstruct import ReconstructableRepository

    repo = ReconstructableRepository.for_module(MODULE, "defs", working_directory=str(REPO))
    return repo.get_reconstructable_job(job_name)


def step_containers(pid: int | None = None) -> list[dict[str, str]]:
    """Our step containers (of the orchestrating process `pid`): name, id, hostname, exit code, status, image,
    step key, mounts."""
    from ..docker_sandbox import docker

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
    from ..docker_sandbox import docker

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
        import threading

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
        from ..docker_sandbox import docker

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


def run_loop_in_containers(profile: str | None = None, config_file: str | None = None, iterations: int | None = None,
                           assets_dir: str | os.PathLike[str] | None = None, force: bool = False,
                           out: TextIO | None = None, keep_containers: bool = False) -> list[dict[str, Any]]:
    """`spogw run` with every step in its own container: iteration k = one `execute_job` of the iteration job
    for partition k, orchestrated here (docker_executor), against the persistent instance of the assets dir.
    Returns one dict per iteration: key, status, wall_s, run_id, containers (what step_containers said of those
    its steps ran in). Step containers are removed as their steps finish (_Reaper) and at the end of each
    iteration, unless keep_containers (then the caller removes them: remove_step_containers)."""
    from .settings import load_config
    from .storage import default_assets_dir

    out = out or sys.stdout
    cfg = load_config(profile, config_file, {"iterations": iterations} if iterations is not None else None)
    root = Path(assets_dir).expanduser().resolve() if assets_dir else default_assets_dir()
    saved = {k: os.environ.get(k) for k in (ENV_SWITCH, "SPOGW_ASSETS_DIR", "SPOGW_CONFIG", "SPOGW_PROFILE",
                                            "DAGSTER_HOME")}
    try:
        return _run_in_containers(cfg, root, config_file, force, out, keep_containers)
    finally:  # the step containers read these; leave the caller's environment as it was
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _run_in_containers(cfg, root: Path, config_file: str | None, force: bool, out: TextIO,
                       keep_containers: bool) -> list[dict[str, Any]]:
    import dagster as dg

    from .locks import assets_dir_lock
    from .loop import _already_reported, _failure_message, ensure_dagster_home, summary_table
    from .partitions import PARTITIONS_NAME, iteration_key
    from .sensors import JOB_NAME
    from .storage import AssetStore

    os.environ.update({ENV_SWITCH: "docker", "SPOGW_ASSETS_DIR": str(root)})
    if config_file:
        os.environ["SPOGW_CONFIG"] = str(Path(config_file).resolve())
        os.environ.pop("SPOGW_PROFILE", None)
    else:
        os.environ["SPOGW_PROFILE"] = cfg.profile
        os.environ.pop("SPOGW_CONFIG", None)
    say = lambda m: print(m, file=out, flush=True)
    if os.environ.get(ENV_IMAGE):
        ok, why = own_image_status(os.environ[ENV_IMAGE])
        if not ok:
            from ..docker_sandbox import DockerUnavailableError

            raise DockerUnavailableError(why)
    else:
        say(build_image(log=say))
    results: list[dict[str, Any]] = []
    with assets_dir_lock(root, "spogw run (steps in containers)"):
        ensure_dagster_home(root)
        store = AssetStore(root)
        recon = _recon_job(JOB_NAME)
        reaper = contextlib.nullcontext(None) if keep_containers else _Reaper(os.getpid())
        with dg.DagsterInstance.get() as instance, _removing_containers(not keep_containers), reaper as reaped:
            for k in range(cfg.iterations):
                key = iteration_key(k)
                if not force and _already_reported(store, key, cfg.hash):
                    say(f"iteration {key}: benchmark_report exists for this config; skipped")
                    results.append({"key": key, "status": "skipped"})
                    continue
                if not instance.has_dynamic_partition(PARTITIONS_NAME, key):
                    instance.add_dynamic_partitions(PARTITIONS_NAME, [key])
                say(f"iteration {key}: steps in containers ({os.environ.get(ENV_IMAGE) or IMAGE})")
                t0 = time.monotonic()
                result = dg.execute_job(recon, instance, tags={
                    "dagster/partition": key, "spogw/iteration": key,
                    "spogw/launched_by": "spogw run (steps in containers)", "spogw/pid": str(os.getpid())},
                    run_config={"loggers": {"console": {"config": {"log_level": "WARNING"}}}})
                wall = time.monotonic() - t0
                containers = reaped.take() if reaped else step_containers(os.getpid())
                r = {"key": key, "status": "ok" if result.success else "failed", "wall_s": wall,
                     "run_id": result.run_id, "containers": containers}
                results.append(r)
                say(f"iteration {key}: {r['status']} in {wall:.1f} s, {len(containers)} step containers "
                    f"(run {result.run_id[:8]})")
                if not keep_containers:
                    remove_step_containers(os.getpid())
                if not result.success:
                    say("  " + _failure_message(result).replace("\n", "\n  "))
                    break
        say("")
        say(summary_table(store, cfg.iterations))
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m spogw_dagster.pipeline.container_steps",
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
