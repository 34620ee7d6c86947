import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.cli import spogw

# torch's OpenMP threads busy-wait by default; on 2 shared cores that makes it ~8x slower whenever anything
# else runs (the sandbox, llama.cpp). Must be set before torch is first imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


# ---------------------------------------------------------------- a Docker engine for the docker sandbox

DOCKERD_START_S = 60


def _why_no_engine_can_start() -> str:
    """'' when this session may start dockerd itself; otherwise exactly why not."""
    if not sys.platform.startswith("linux"):
        return f"Docker engines run on Linux only (this is {sys.platform})"
    if not shutil.which("docker"):
        return "no docker client on PATH (CI installs it: `apt-get install docker.io`, see .ci/run)"
    if not shutil.which("dockerd"):
        return "no engine answers and there is no dockerd to start (`apt-get install docker.io`)"
    if os.geteuid() != 0:
        return "no engine answers and only root can start dockerd"
    if os.environ.get("DOCKER_HOST"):
        return f"DOCKER_HOST={os.environ['DOCKER_HOST']} does not answer; this session only starts a local engine"
    return ""


def _start_dockerd(log_path: str) -> subprocess.Popen:
    """dockerd with the vfs storage driver (the only one that works on this machine's kernel/filesystem)."""
    from spogw_dagster.sandboxing.engine import engine_answers

    with open(log_path, "wb") as log:
        proc = subprocess.Popen(["dockerd", "--storage-driver=vfs"], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + DOCKERD_START_S
    while time.monotonic() < deadline and proc.poll() is None:
        if engine_answers(timeout=5)[0]:
            return proc
        time.sleep(0.5)
    _stop_dockerd(proc)
    with open(log_path, errors="replace") as f:
        tail = "".join(f.readlines()[-5:]).strip()
    pytest.skip(f"dockerd --storage-driver=vfs did not come up within {DOCKERD_START_S}s "
                f"(exit code {proc.returncode}): {tail}")


def _stop_dockerd(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # dockerd stops its containerd and containers itself
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture(scope="session")
def docker_engine():
    """A Docker engine with the sandbox image built (spogw sandbox build-image; cached by tag): the engine
    that already answers, or one this session starts as root (`dockerd --storage-driver=vfs`) and stops at
    the end. Skips only when no engine can start, saying exactly why. Yields the engine's version."""
    from spogw_dagster.sandboxing.engine import engine_answers
    from spogw_dagster.sandboxing.images import SANDBOX_IMAGE, build_image

    started = None
    ok, version = engine_answers()
    if not ok:
        why = _why_no_engine_can_start()
        if why:
            pytest.skip(f"docker sandbox not tested: {why}")
        log_path = os.path.join(tempfile.gettempdir(), f"spogw-test-dockerd-{os.getpid()}.log")
        started = _start_dockerd(log_path)
        version = engine_answers()[1]
    try:
        build_image(SANDBOX_IMAGE, log=lambda msg: None)  # an engine answers: a failure here is ours, not a reason to skip
        yield version
    finally:
        if started is not None:
            _stop_dockerd(started)
            os.unlink(log_path)


# ---------------------------------------------------------------- one undisturbed `spogw run --profile ci`


@pytest.fixture(scope="session")
def ci_cli_run(tmp_path_factory):
    """One `spogw run --profile ci` (two iterations, the real CLI, its persistent Dagster instance in
    <assets>/.dagster) into a fresh assets directory, made once per session: the fault matrix's reference
    (tests/faults/conftest.py::undisturbed) and the staleness test's starting point. Read-only: a test that
    writes copies it first. $SPOGW_FAULTS_REFERENCE names such a run made earlier by this code (a debugging aid)."""
    t0 = time.monotonic()
    if os.environ.get("SPOGW_FAULTS_REFERENCE"):
        root = Path(os.environ["SPOGW_FAULTS_REFERENCE"]).resolve()
    else:
        root = tmp_path_factory.mktemp("undisturbed") / "assets"
        r = spogw("run", "--profile", "ci", "--assets-dir", str(root), timeout=1200)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return {"root": root, "wall_s": time.monotonic() - t0}
