"""Steps in containers, the Dagster side: the executor that runs each step of a run in its own container
(`dagster_docker.docker_executor`), holding the assets directory's lock like the in-process one.

Switch: SPOGW_STEP_EXECUTOR=docker in the environment of the code location (`dagster dev`, a run worker) makes
`wiring.build_definitions` use `step_executor(root)`; unset or `in_process` keeps the in-process executor. It is
an environment switch, not a config field, on purpose: where a step runs changes no asset's output, so it stays
out of the config hash (as `loop:` does) and a switch never makes existing assets stale.
`python -m spogw_dagster.pipeline.runs.container_steps run --profile ci` runs the loop with it (`spogw run` itself
uses `execute_in_process`, which always runs steps in-process).

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

`container_steps.py` builds the step image and runs the loop with this executor.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from spogw_dagster.paths import cache_dir
from spogw_dagster.pipeline.defs.run_executors import locking_executor
from spogw_dagster.pipeline.settings import ConfigValidationError, load_config
from spogw_dagster.sandboxing import backend_docker

ENV_SWITCH = "SPOGW_STEP_EXECUTOR"  # in_process (default) | docker
ENV_IMAGE = "SPOGW_STEP_IMAGE"  # another image (e.g. one built from docker/Dockerfile)
ENV_MAX_CONCURRENT = "SPOGW_STEP_MAX_CONCURRENT"
IMAGE = "spogw-steps:latest"
STEP_LABEL = "org.spogw.step"  # on every step container: its value is the pid of the orchestrating process
REPO = Path(__file__).resolve().parents[3]
# Syscalls of seccomp.py's deny list that bwrap itself needs to build the sandbox inside a step container.
BWRAP_NEEDS = ("mount", "umount2", "pivot_root", "unshare", "chroot")
# Environment passed through to the steps when set on the host (model/runtime knobs, never credentials).
_PASS_PREFIXES = ("SPOGW_", "OMP_", "MKL_", "HF_", "TRANSFORMERS_", "TOKENIZERS_", "TORCH_")
_PASS_SKIP = {"SPOGW_CACHE_DIR", "SPOGW_ASSETS_DIR"}


def mode() -> str:
    m = (os.environ.get(ENV_SWITCH) or "in_process").strip().lower().replace("-", "_")
    if m not in {"in_process", "docker"}:
        raise ConfigValidationError(f"{ENV_SWITCH}={m!r}: expected in_process or docker")
    return m


# ---------------------------------------------------------------- the step container

def step_seccomp_profile() -> dict:
    """seccomp.py's deny list (Docker's JSON form, as backend_docker.seccomp_profile) minus BWRAP_NEEDS and the
    clone-with-namespace rules: what bwrap needs to build the sandbox, which then applies the full filter."""

    prof = backend_docker.seccomp_profile()
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

    paths = list(backend_docker.host_mounts())
    for p in (sys.prefix, str(REPO), "/etc/ld.so.cache", "/etc/ssl/certs"):
        if os.path.exists(p) and p not in paths:
            paths.append(p)
    return paths


def _under(path: str, dirs: list[str]) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in dirs)


def step_executor_config(root: Path) -> dict[str, Any]:
    """The docker_executor's config for the assets directory `root` (see the module docstring)."""
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
        from dagster_docker import docker_executor  # optional extra (docker)
    except ImportError as e:
        raise ConfigValidationError(f"{ENV_SWITCH}=docker needs dagster-docker ({e}). Fix: "
                                    "pip install -e '.[docker]'") from None
    return _locking(docker_executor, Path(root).resolve()).configured(step_executor_config(root), name="docker")


def _locking(base, root: Path):
    """`base` holding the assets directory's lock for the whole run (`run_executors.locking_executor`): runs launched
    from the UI, a backfill or the sensor wait in iteration order; a run this process orchestrates under its
    own lock (run_loop_in_containers) goes ahead."""
    return locking_executor(base, root, label="steps in containers", description=(
        "Each step in its own Docker container (dagster-docker), holding the assets directory's lock."))
