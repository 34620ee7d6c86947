"""The sandbox backend protocol: a new kind is its module plus its entry in detect.BACKENDS, and nothing else
branches on which kind is in force (shown with a toy backend defined here alone); the built-in kinds' runner
binds; the two images built from one skeleton."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import ClassVar

import pytest

from spogw_dagster.contracts import Status
from spogw_dagster.sandboxing import (
    Bubblewrap,
    Docker,
    Isolation,
    Limits,
    RunIdentity,
    Unsandboxed,
    detect,
    detect_isolation,
    run_code,
)
from spogw_dagster.sandboxing.backend import Launch
from spogw_dagster.sandboxing.environment import RUNNER_INSIDE

MARK = "SPOGW_TOY_BACKEND"


@dataclass(frozen=True)
class EnvWrapped:
    """A toy kind: the plain subprocess, started through /usr/bin/env with one variable set, so a test can see
    its command line was the one that ran. It records each launch and release."""
    detail: str = "toy"
    events: list = field(default_factory=list, compare=False, hash=False)
    name: ClassVar[str] = "toy"
    host_limits_memory: ClassVar[bool] = True

    def runner(self, script: str) -> tuple[str, list[tuple[str, str]]]:
        return script, []

    def command(self, argv, limits, ro_files, run):
        return ["/usr/bin/env", f"{MARK}=1", *argv]

    @contextmanager
    def launch(self, argv, limits, ro_files) -> Iterator[Launch]:
        self.events.append("launch")
        run = RunIdentity()
        yield Launch(self.command(argv, limits, ro_files, run), run)

    async def release(self, launch: Launch) -> None:
        self.events.append("release")


@pytest.fixture
def toy(monkeypatch):
    backend = EnvWrapped()
    monkeypatch.setitem(detect.BACKENDS, "toy", lambda: (backend, ""))
    monkeypatch.setattr(detect, "_DETECTED", {})
    return backend


async def test_a_new_backend_needs_only_its_module_and_a_registry_entry(toy):
    iso = detect_isolation("toy")
    assert iso is toy and isinstance(iso, Isolation)
    res = await run_code(f"import os\nprint(os.environ.get({MARK!r}), 6 * 7)", iso, Limits(wall_s=10, cpu_s=5))
    assert res.status == Status.OK and res.stdout.split() == ["1", "42"] and res.isolation == "toy"
    assert toy.events == ["launch", "release"]  # the run's resources are given back exactly once
    loop = await run_code("while True: pass", iso, Limits(wall_s=2, cpu_s=1))
    assert loop.status == Status.TIMEOUT and toy.events[-1] == "release"


def test_settings_and_auto_detection_take_the_registered_backends(toy):
    from spogw_dagster.pipeline.settings import ConfigValidationError, load_config

    cfg = load_config(profile="tiny", overrides={"execution": {"isolation": "toy"}})
    assert cfg.execution.isolation == "toy"
    with pytest.raises(ConfigValidationError, match="unknown isolation 'chroot'"):
        load_config(profile="tiny", overrides={"execution": {"isolation": "chroot"}})
    assert list(detect.BACKENDS)[-1] == "toy"  # registered after bwrap and docker: auto tries it last


def test_each_builtin_kind_says_where_the_runner_is_inside():
    script = "/host/site-packages/spogw_sandbox/runner.py"
    assert Bubblewrap(bwrap="/x/bwrap").runner(script) == (RUNNER_INSIDE, [(script, RUNNER_INSIDE)])
    assert Docker().runner(script) == (RUNNER_INSIDE, [])  # sandbox/ is bound at /sandbox on every container
    assert Unsandboxed().runner(script) == (script, [])  # nothing hides the host's paths
    assert RUNNER_INSIDE == "/sandbox/runner.py"
    for iso in (Bubblewrap(bwrap="/x/bwrap"), Docker(), Unsandboxed()):
        assert isinstance(iso, Isolation), iso
    assert [Bubblewrap.host_limits_memory, Docker.host_limits_memory, Unsandboxed.host_limits_memory] == [
        True, False, True]  # the engine caps docker's memory and processes; the client needs room


def test_the_unsandboxed_kind_gives_each_run_a_fresh_cwd_and_removes_it():
    iso = Unsandboxed()
    with iso.launch([sys.executable, "-c", "pass"], Limits(), []) as launch:
        cwd = launch.cwd
        assert cwd and os.path.isdir(cwd) and "spogw-run-" in cwd
    import asyncio

    asyncio.run(iso.release(launch))
    assert not os.path.exists(cwd)


def test_the_bwrap_kind_opens_the_filter_for_the_start_only():
    iso = Bubblewrap(bwrap="/x/bwrap", setpriv="/usr/bin/setpriv")
    with iso.launch(["python3"], Limits(), []) as launch:
        fd = launch.run.seccomp_fd
        assert launch.pass_fds == (fd,) and os.fstat(fd).st_size > 0  # the compiled BPF program
        assert launch.cmd[launch.cmd.index("--seccomp") + 1] == str(fd)
        assert str(launch.run.uid) in launch.cmd  # a fresh uid per run, as root
    with pytest.raises(OSError):
        os.fstat(fd)  # closed once the process has its own copy


def test_both_images_come_from_one_skeleton():
    from spogw_dagster.pipeline.runs.container_steps import STEP_IMAGE
    from spogw_dagster.sandboxing.images import SANDBOX_IMAGE

    sandbox = {path: (kind, payload) for kind, path, payload in SANDBOX_IMAGE.entries()}
    steps = {path: (kind, payload) for kind, path, payload in STEP_IMAGE.entries()}
    assert sandbox.pop("sandbox") == ("dir", "")  # the mount point of the child-side scripts
    assert "sandbox" not in steps  # steps run bwrap inside; no scripts are bound there
    assert sandbox.pop("sbin") == ("dir", "")  # docker-init's mount point, never a bind of the host's /usr
    expected_sbin = ("link", os.readlink("/sbin")) if os.path.islink("/sbin") else ("dir", "")
    assert steps.pop("sbin") == expected_sbin  # ctypes finds libseccomp through /sbin/ldconfig
    assert sandbox == steps  # everything else is the same host layout
    assert SANDBOX_IMAGE.dockerfile_dir is not None and STEP_IMAGE.dockerfile_dir is None
    assert SANDBOX_IMAGE.digest() != STEP_IMAGE.digest()
