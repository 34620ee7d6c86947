"""How sandboxed processes are started: the command lines per isolation kind, and the opt-out path."""

import os
import sys

import pytest

from spogw_dagster.sandboxing import Bubblewrap, Docker, Limits, RunIdentity, detect_isolation, run_code, signal_status
from spogw_dagster.sandboxing.backend_docker import IMAGE as DOCKER_IMAGE
from spogw_dagster.contracts import Status

LIMITS = Limits(wall_s=5, cpu_s=3, memory_mb=512, nproc=8, scratch_mb=32, fsize_mb=4, nofile=32)


def test_docker_command_isolates_network_filesystem_privileges_and_resources():
    from spogw_dagster.sandboxing.environment import sandbox_python

    cmd = Docker().command([sys.executable, "-I", "-S", "/sandbox/runner.py"], LIMITS,
                           [("/host/extra.py", "/sandbox/extra.py")], RunIdentity(container="spogw-test"))
    joined = " ".join(cmd)
    for flag in ("--network none", "--read-only", "--cap-drop ALL", "--security-opt no-new-privileges",
                 "--security-opt seccomp=", "--pids-limit 8", "--memory 512m", "--memory-swap 512m",
                 "--user 65534:65534", "--tmpfs /tmp:rw,size=32m,mode=1777", "--ulimit cpu=3:4", "--rm -i",
                 "--log-driver none"):
        assert flag in joined, flag
    # host paths come in read-only only (/usr, the interpreter's prefix, sandbox/, ro_files); no -v at all
    assert "-v" not in cmd and "--volume" not in cmd
    mounts = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--mount"]
    assert mounts and all(m.startswith("type=bind,") and m.endswith(",readonly") for m in mounts)
    assert "type=bind,source=/usr,target=/usr,readonly" in mounts
    assert "type=bind,source=/host/extra.py,target=/sandbox/extra.py,readonly" in mounts
    # the base interpreter, reached through the read-only binds
    assert cmd[cmd.index(DOCKER_IMAGE) + 1:] == [sandbox_python().executable, "-I", "-S", "/sandbox/runner.py"]


def test_bwrap_command_as_root_drops_to_a_fresh_uid_without_capabilities():
    iso = Bubblewrap(bwrap="/x/bwrap", setpriv="/usr/bin/setpriv")
    cmd = iso.command(["python3", "-c", "pass"], LIMITS, [], RunIdentity(uid=1234567, seccomp_fd=9))
    joined = " ".join(cmd)
    for flag in ("--unshare-net", "--unshare-pid", "--die-with-parent", "--clearenv", "--ro-bind /usr /usr",
                 "--seccomp 9",
                 f"--size {32 * 1024 * 1024} --perms 1777 --tmpfs /tmp",
                 "--reuid 1234567 --regid 1234567 --clear-groups --inh-caps -all --bounding-set -all --no-new-privs"):
        assert flag in joined, flag
    assert "--bind " not in joined  # nothing of the host is mounted writable
    assert cmd[-3:] == ["python3", "-c", "pass"]


def test_bwrap_command_without_root_uses_a_user_namespace():
    cmd = Bubblewrap(bwrap="/x/bwrap").command(["python3"], LIMITS, [], RunIdentity(seccomp_fd=9))
    assert "--unshare-user" in cmd and "--seccomp" in cmd and "--cap-drop" in cmd and "setpriv" not in " ".join(cmd)


async def test_unsandboxed_opt_in_still_scrubs_env_and_applies_limits(monkeypatch):
    monkeypatch.setenv("SPOGW_SECRET_FOR_TEST", "hunter2")
    iso = detect_isolation("none", allow_unsandboxed=True)
    res = await run_code("import os\nprint(sorted(os.environ))\nprint(os.getcwd())", iso, LIMITS)
    assert res.status == Status.OK and res.isolation == "none"
    assert "SPOGW_SECRET_FOR_TEST" not in res.stdout and "hunter2" not in res.stdout
    assert "spogw-run-" in res.stdout  # a private temp working directory
    loop = await run_code("while True: pass", iso, LIMITS)
    assert loop.status == Status.TIMEOUT


def test_signal_status_maps_cpu_limit_to_timeout_and_kills_to_runtime_error():
    assert signal_status(-24) == Status.TIMEOUT  # SIGXCPU
    assert signal_status(128 + 24) == Status.TIMEOUT  # as bwrap reports a child's signal
    assert signal_status(-9) == Status.RUNTIME_ERROR
    assert signal_status(128 + 31) == Status.RUNTIME_ERROR  # SIGSYS: killed by the syscall filter
    assert signal_status(0) is None and signal_status(1) is None


def test_unknown_isolation_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown isolation 'chroot'"):
        detect_isolation("chroot")


async def test_a_sandbox_that_does_not_start_raises_instead_of_scoring():
    from spogw_dagster.sandboxing import SandboxStartError

    with pytest.raises(SandboxStartError, match="did not start"):
        await run_code("print(1)", Bubblewrap(bwrap="/bin/false"), LIMITS)


async def test_memory_budget_covers_all_processes_of_a_run():
    """rlimits are per process; the run's cgroup caps the sandbox as a whole (when cgroups are usable)."""
    from spogw_dagster.sandboxing.cgroups import manager

    iso = detect_isolation()
    if iso.name != "bwrap" or not manager().available:
        pytest.skip(f"no cgroup budget here ({manager().why_not})")
    prog = ("import os, time\n"
            "kids = []\n"
            "for i in range(4):\n"
            "    pid = os.fork()\n"
            "    if pid == 0:\n"
            "        b = bytearray(300 * 1024 * 1024)\n"
            "        time.sleep(2)\n"
            "        os._exit(0)\n"
            "    kids.append(pid)\n"
            "for k in kids:\n"
            "    os.waitpid(k, 0)\n"
            "print('all done')\n")
    res = await run_code(prog, iso, Limits(wall_s=20, cpu_s=10, memory_mb=512, nproc=8))
    assert res.status == Status.RUNTIME_ERROR and "memory limit" in res.error, (res.status, res.error)
    small = await run_code(prog.replace("300 * 1024", "50 * 1024"), iso, Limits(wall_s=20, cpu_s=10, memory_mb=512, nproc=8))
    assert small.status == Status.OK and "all done" in small.stdout


def test_stale_run_cgroups_of_dead_processes_are_swept():
    from spogw_dagster.sandboxing.cgroups import manager, sweep_stale

    m = manager()
    if m.kind != "v1":
        pytest.skip(f"cgroup v1 not in use here ({m.kind or m.why_not})")
    from spogw_dagster.sandboxing.cgroups import GROUP, ROOT

    top = ROOT / "pids" / GROUP
    dead_pid = 2 ** 22 + 7  # above pid_max: no such process
    stale = top / f"run-{dead_pid}-deadbeef0000"
    stale.mkdir()
    live = m.create(64 << 20, 4)
    assert sweep_stale(top) >= 1
    assert not stale.exists()
    assert all(d.exists() for d in live.dirs)  # a live run's group stays
    live.destroy()


def test_sandbox_starts_the_base_interpreter_and_mounts_nothing_of_a_venv():
    """The venv's python is the base binary plus a pyvenv.cfg that only adds site-packages, which sandboxed
    code never loads (-I -S): the sandbox runs the base binary and binds its prefix, not the venv."""
    from spogw_dagster.sandboxing.environment import sandbox_python

    py = sandbox_python()
    assert os.path.isfile(py.executable) and os.access(py.executable, os.X_OK)
    assert os.path.realpath(py.executable) == py.executable
    assert any(py.executable.startswith(m.rstrip("/") + "/") for m in py.mounts + ("/usr",))
    if sys.prefix != sys.base_prefix:  # running from a venv: none of it is visible inside
        venv = os.path.realpath(sys.prefix)
        assert not any(m == venv or m.startswith(venv + "/") for m in py.mounts), py.mounts
        cmd = Bubblewrap(bwrap="/x/bwrap", setpriv="/usr/bin/setpriv").command(
            [sys.executable, "-I", "-S", "-c", "pass"], LIMITS, [], RunIdentity(seccomp_fd=9))
        assert sys.executable not in cmd and py.executable in cmd


def test_bwrap_refuses_to_build_a_command_without_the_syscall_filter():
    with pytest.raises(ValueError, match="seccomp_fd"):
        Bubblewrap(bwrap="/x/bwrap").command(["python3"], LIMITS, [], RunIdentity())
