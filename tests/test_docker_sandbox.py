"""The Docker variant of the sandbox on a real engine (started by the `docker_engine` fixture in conftest.py
when none answers): the image builds with no registry and stays an empty skeleton, the syscall filter holds
inside the container, a timeout kills the named container, and `spogw exec-workflow --isolation docker` runs
the template workflow with the real bundled executor. The hostile workflow suite runs under docker too
(tests/test_sandbox_hostile.py is parametrized over bwrap and docker). No container outlives a test."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spogw_dagster.sandboxing import backend_docker
from spogw_dagster.sandboxing import engine, images, seccomp
from spogw_dagster.sandboxing import Limits, detect_isolation, run_code
from spogw_dagster.sandboxing.backend_docker import IMAGE as DOCKER_IMAGE
from spogw_dagster.contracts import Status
from tests.test_isolation_seccomp import CLONE_NEWUSER, NUMBERS, assert_filter_denies_and_allows

LIMITS = Limits(wall_s=20, cpu_s=10, memory_mb=512, nproc=16)
REPO = str(Path(__file__).resolve().parents[1])
HOME = os.path.expanduser("~/.cache")
OUR_CONTAINERS = f"spogw-{os.getpid()}-"  # spawn names each container spogw-<parent pid>-<random>


def wait_for_no_containers(prefix: str = OUR_CONTAINERS, timeout: float = 15.0) -> list[str]:
    """The engine removes a --rm container asynchronously after it dies; give it a moment."""
    deadline = time.monotonic() + timeout
    while (left := backend_docker.leftover_containers(prefix)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@pytest.fixture(scope="module")
def iso(docker_engine):
    return detect_isolation("docker")


@pytest.fixture(autouse=True)
def no_container_outlives_a_test(request):
    yield
    if "docker_engine" in request.fixturenames:
        assert wait_for_no_containers() == [], "sandbox containers were left behind"


def test_profile_is_the_seccomp_policy_in_dockers_format():
    profile = backend_docker.seccomp_profile()
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW"
    assert len(profile["architectures"]) == 1  # native only: another ABI's syscalls hit the bad-arch action
    by_errno: dict[int, set[str]] = {}
    for rule in profile["syscalls"]:
        if "args" not in rule:
            by_errno.setdefault(rule["errnoRet"], set()).update(rule["names"])
    assert by_errno[seccomp.DENY_ERRNO] == set(seccomp.DENIED_SYSCALLS)
    assert by_errno[38] == set(seccomp.ENOSYS_SYSCALLS) == {"clone3"}
    clone_bits = {rule["args"][0]["value"] for rule in profile["syscalls"] if rule["names"] == ["clone"]}
    assert clone_bits == set(seccomp.CLONE_NAMESPACE_FLAGS.values())
    path = backend_docker.seccomp_profile_path()
    assert json.loads(path.read_text()) == profile and backend_docker.seccomp_profile_path() == path


def test_image_is_built_without_a_registry_and_stays_an_empty_skeleton(docker_engine):
    assert backend_docker.IMAGE == DOCKER_IMAGE
    assert images.build_image(images.SANDBOX_IMAGE, log=lambda m: None) == f"{DOCKER_IMAGE} is up to date"  # idempotent
    size = engine.docker("image", "inspect", "--format", "{{.Size}}", DOCKER_IMAGE)
    # vfs copies the image into every container: a Debian+Python image (252 MB) cost 1.3-4.4 s per start
    assert int(size.stdout) < 64 * 1024, f"the sandbox image grew to {int(size.stdout)} bytes"


async def test_container_sees_only_read_only_host_paths_and_its_own_tmp(iso):
    prog = ("import os, sys\n"
            "def writable(p):\n"
            "    try:\n"
            "        open(p, 'w').close(); return True\n"
            "    except OSError:\n"
            "        return False\n"
            "print(os.getuid(), sorted(os.environ), os.getcwd())\n"
            "print(writable('/sandbox/runner.py'), writable('/usr/x'), writable(sys.executable + '.x'),"
            " writable('/etc/x'), writable('/x'), writable('/tmp/x'))\n"
            f"print(os.path.isfile('/sandbox/runner.py'), os.path.exists({REPO!r}), os.path.exists({HOME!r}))\n")
    res = await run_code(prog, iso, LIMITS)
    assert res.status == Status.OK, (res.error, res.stderr[-500:])
    ident, writes, seen = res.stdout.splitlines()
    assert ident.startswith("65534 ") and "/tmp" in ident and "KEY" not in ident
    assert writes == "False False False False False True"  # only the tmpfs
    assert seen == "True False False"  # sandbox/*.py is mounted at /sandbox; the repository and the home are not


async def test_namespaces_mounts_io_uring_and_tracing_are_denied_inside_the_container(iso):
    numbers = NUMBERS.get(platform.machine())
    if numbers is None:
        pytest.skip(f"no syscall table for {platform.machine()} in tests/test_isolation_seccomp.py")
    await assert_filter_denies_and_allows(iso, numbers, "container", LIMITS)


# push rbx; mov eax, 310 (i386 unshare); mov ebx, CLONE_NEWUSER; int 0x80; pop rbx; ret
I386_UNSHARE = (
    "import ctypes, mmap\n"
    "code = bytes.fromhex('53' 'b836010000' 'bb00000010' 'cd80' '5b' 'c3')\n"
    "m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
    "m.write(code)\n"
    "print('before', flush=True)\n"
    "print(ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))())\n")
X32_UNSHARE = ("import ctypes\nprint('before', flush=True)\n"
               f"ctypes.CDLL(None).syscall(0x40000000 | 272, {CLONE_NEWUSER})\n")


@pytest.mark.parametrize("abi, program", [("i386 int 0x80", I386_UNSHARE), ("x32", X32_UNSHARE)])
async def test_a_syscall_of_another_abi_kills_the_process(iso, abi, program):
    """Rules name native syscall numbers; unshare through the i386 or x32 ABI would slip past them (as root
    on this host, int 0x80 unshare(CLONE_NEWUSER) returns 0 unfiltered). The profile lists only the native
    architecture, so such a call gets the bad-arch action: the process dies with SIGSYS."""
    if platform.machine() != "x86_64":
        pytest.skip("these foreign ABIs exist on x86_64 only")
    res = await run_code(program, iso, LIMITS)
    assert res.stdout == "before\n", res.stdout
    assert res.status == Status.RUNTIME_ERROR and "syscall filter" in res.error, (res.status, res.error)


async def test_a_timeout_kills_the_named_container(iso):
    task = asyncio.create_task(run_code("import time\ntime.sleep(3600)", iso, LIMITS.with_(wall_s=4)))
    seen: list[str] = []
    while not task.done() and not seen:
        seen = await asyncio.to_thread(backend_docker.leftover_containers, OUR_CONTAINERS)
        await asyncio.sleep(0.2)
    res = await task
    assert res.status == Status.TIMEOUT and res.wall_s < 15, (res.status, res.wall_s)
    assert seen, "the container was never seen by its name while it ran"
    assert await asyncio.to_thread(wait_for_no_containers) == []


async def test_limits_hold_in_the_container(iso):
    loop = await run_code("while True: pass", iso, LIMITS.with_(cpu_s=2))
    assert loop.status == Status.TIMEOUT and "CPU-time" in loop.error, (loop.status, loop.error)
    bomb = await run_code("import os\nwhile True:\n    os.fork()", iso, LIMITS.with_(wall_s=10))
    assert bomb.status in (Status.RUNTIME_ERROR, Status.TIMEOUT), bomb.status
    big = await run_code("x = bytearray(2 * 1024 ** 3)", iso, LIMITS)
    assert big.status == Status.RUNTIME_ERROR, (big.status, big.error)
    ok = await run_code("print(6 * 7)", iso, LIMITS)
    assert ok.status == Status.OK and ok.stdout == "42\n"


def test_cli_build_image_says_the_image_is_up_to_date(docker_engine):
    out = subprocess.run([sys.executable, "-m", "spogw_dagster.cli", "sandbox", "build-image"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == f"{DOCKER_IMAGE} is up to date", out.stderr


@pytest.mark.model
def test_cli_exec_workflow_runs_with_the_bundled_executor_in_docker(docker_engine, tmp_path):
    """The template code workflow, the real SmolLM2 executor, and HumanEval's hidden tests: the workflow
    and the scoring run both start a container."""
    from spogw_dagster.workflow.template import TEMPLATES

    wf = tmp_path / "wf.py"
    wf.write_text(TEMPLATES["code"])
    env = {**os.environ, "SPOGW_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "spogw_dagster.cli", "exec-workflow", "--benchmark", "humaneval", "--query",
         "HumanEval/0", "--workflow", str(wf), "--isolation", "docker", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-2000:]
    data = json.loads(stdout)
    assert data["isolation"] == "docker" and data["status"] == "ok", data
    assert data["llm_calls"] == 1 and data["score"] in (0.0, 1.0)
    assert wait_for_no_containers(f"spogw-{proc.pid}-") == []  # the CLI's containers are named after it


ORPHAN_PARENT = """
import subprocess, sys, time
from spogw_dagster.sandboxing import Docker, Limits, RunIdentity
cmd = Docker().command([sys.executable, "-I", "-S", "-c", "import time; time.sleep(600)"], Limits(), [],
                       RunIdentity(container=sys.argv[1]))
subprocess.Popen(cmd, stdin=subprocess.PIPE, start_new_session=True)  # as spawn does: its own session
time.sleep(600)
"""


def test_a_container_whose_parent_was_killed_is_swept(docker_engine):
    name = f"spogw-orphan-{os.getpid()}-{os.urandom(4).hex()}"
    parent = subprocess.Popen([sys.executable, "-c", ORPHAN_PARENT, name])
    try:
        deadline = time.monotonic() + 30
        while name not in backend_docker.leftover_containers(name) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert backend_docker.leftover_containers(name) == [name], "the container never started"
    finally:
        parent.kill()
        parent.wait()
    time.sleep(1)
    assert backend_docker.leftover_containers(name) == [name]  # the container outlives its killed parent
    assert name in backend_docker.sweep_orphans()
    assert wait_for_no_containers(name) == []
