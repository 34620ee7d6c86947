"""The syscall filter (spogw_dagster/sandboxing/seccomp.py) inside the real bwrap sandbox: namespace creation, mounts,
io_uring and the rest fail with EPERM, clone3 with ENOSYS (so glibc falls back to clone), foreign-ABI
syscalls kill the process; while threads, fork, subprocess, math and json keep working."""

import json
import platform

import pytest

from spogw_dagster.sandboxing import seccomp
from spogw_dagster.sandboxing import Limits, detect_isolation, run_code
from spogw_dagster.contracts import Status

LIMITS = Limits(wall_s=20, cpu_s=10, memory_mb=512, nproc=16)

# Syscall numbers per architecture (asm/unistd_64.h); the filter is built for the native one.
NUMBERS = {
    "x86_64": {"unshare": 272, "mount": 165, "io_uring_setup": 425, "clone3": 435, "clone": 56, "setns": 308,
               "ptrace": 101, "bpf": 321, "keyctl": 250, "perf_event_open": 298, "userfaultfd": 323,
               "personality": 135, "pivot_root": 155, "open_tree": 428},
    "aarch64": {"unshare": 97, "mount": 40, "io_uring_setup": 425, "clone3": 435, "clone": 220, "setns": 268,
                "ptrace": 117, "bpf": 280, "keyctl": 219, "perf_event_open": 241, "userfaultfd": 282,
                "personality": 92, "pivot_root": 41, "open_tree": 428},
}
CLONE_NEWUSER, CLONE_NEWNET, SIGCHLD = 0x10000000, 0x40000000, 17

PROGRAM = """
import ctypes, json, math, os, subprocess, sys, threading
NR = %(numbers)s
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

def call(name, *args):
    ctypes.set_errno(0)
    ret = libc.syscall(ctypes.c_long(NR[name]), *[ctypes.c_long(a) for a in args])
    if ret == 0 and name == "clone":
        os._exit(0)  # a clone that got through: the child leaves at once, the parent reports it
    return [ret, ctypes.get_errno()]

out = {
    "unshare(CLONE_NEWUSER)": call("unshare", %(newuser)d),
    "unshare(CLONE_NEWNET)": call("unshare", %(newnet)d),
    "clone(CLONE_NEWUSER)": call("clone", %(newuser)d | %(sigchld)d, 0, 0, 0, 0),
    "clone(CLONE_NEWNET)": call("clone", %(newnet)d | %(sigchld)d, 0, 0, 0, 0),
    "mount": call("mount", 0, 0, 0, 0, 0),
    "io_uring_setup": call("io_uring_setup", 1, 0),
    "setns": call("setns", 0, 0),
    "ptrace": call("ptrace", 0, 0, 0, 0),
    "bpf": call("bpf", 0, 0, 0),
    "keyctl": call("keyctl", 0, 0, 0, 0, 0),
    "perf_event_open": call("perf_event_open", 0, 0, -1, -1, 0),
    "userfaultfd": call("userfaultfd", 0),
    "personality": call("personality", 0x0040000),
    "pivot_root": call("pivot_root", 0, 0),
    "open_tree": call("open_tree", -100, 0, 0),
    "clone3": call("clone3", 0, 0),
}
box = []
t = threading.Thread(target=box.append, args=("thread ran",))
t.start(); t.join()
pid = os.fork()
if pid == 0:
    os._exit(7)
ok = {
    "thread": box,
    "fork": os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]),
    "subprocess": subprocess.run([sys.executable, "-I", "-S", "-c", "print(6 * 7)"], capture_output=True,
                                 text=True).stdout.strip(),
    "math_json": json.loads(json.dumps({"v": math.comb(10, 3)}))["v"],
    "seccomp": [line.split()[1] for line in open("/proc/self/status") if line.startswith("Seccomp:")],
}
print(json.dumps({"denied": out, "ok": ok}))
"""


@pytest.fixture(scope="module")
def iso():
    iso = detect_isolation()
    if iso.name != "bwrap":
        pytest.skip(f"the bwrap sandbox is not available here ({iso.detail})")
    return iso


@pytest.fixture(scope="module")
def numbers():
    machine = platform.machine()
    if machine not in NUMBERS:
        pytest.skip(f"no syscall table for {machine} in this test")
    return NUMBERS[machine]


def test_policy_compiles_and_every_name_is_a_real_syscall():
    program = seccomp.bpf_program()
    assert program and len(program) % 8 == 0  # struct sock_filter is 8 bytes
    text = seccomp.pseudo_code()
    for name in ("unshare", "mount", "io_uring_setup", "ptrace", "bpf", "keyctl", "clone3"):
        assert name in seccomp.DENIED_SYSCALLS + seccomp.ENOSYS_SYSCALLS and f'"{name}"' in text
    assert "ERRNO(38)" in text  # clone3 -> ENOSYS
    assert "KILL_PROCESS" in text  # syscalls of another ABI


async def assert_filter_denies_and_allows(iso, numbers, where: str, limits=None) -> None:
    """PROGRAM inside `iso`: every listed call is refused (EPERM; clone3 ENOSYS), ordinary Python still works.
    Shared with tests/test_docker_sandbox.py."""
    prog = PROGRAM % {"numbers": numbers, "newuser": CLONE_NEWUSER, "newnet": CLONE_NEWNET, "sigchld": SIGCHLD}
    res = await run_code(prog, iso, limits or LIMITS)
    assert res.status == Status.OK, (res.status, res.error, res.stderr[-1500:])
    report = json.loads(res.stdout)
    for name, (ret, err) in report["denied"].items():
        expected = 38 if name == "clone3" else 1  # ENOSYS so glibc falls back to clone; EPERM otherwise
        assert (ret, err) == (-1, expected), f"{name} returned {ret} (errno {err}) inside the {where}"
    assert report["ok"] == {"thread": ["thread ran"], "fork": 7, "subprocess": "42", "math_json": 120,
                            "seccomp": ["2"]}


async def test_namespaces_mounts_io_uring_and_tracing_are_denied_inside_the_sandbox(iso, numbers):
    await assert_filter_denies_and_allows(iso, numbers, "sandbox")


async def test_a_syscall_of_another_abi_kills_the_process(iso):
    if platform.machine() != "x86_64":
        pytest.skip("the x32 ABI exists on x86_64 only")
    prog = ("import ctypes\nprint('before', flush=True)\n"
            f"ctypes.CDLL(None).syscall(0x40000000 | 272, {CLONE_NEWUSER})\nprint('after')\n")
    res = await run_code(prog, iso, LIMITS)
    assert res.stdout == "before\n"
    assert res.status == Status.RUNTIME_ERROR and "syscall filter" in res.error, (res.status, res.error)
