"""The syscall filter every sandboxed process runs under: kernel surface that no test or scoring code needs.

The policy is data (DENIED_SYSCALLS, ENOSYS_SYSCALLS, CLONE_NAMESPACE_FLAGS) so that each isolation kind
enforces the same thing: bwrap loads the BPF program compiled here by libseccomp (`--seccomp FD`); the
Docker variant turns the same lists into Docker's JSON profile. Everything not listed is allowed: this is a
deny list on top of the namespaces, the unprivileged uid, no capabilities and no_new_privs, which hold
anyway; it removes the kernel interfaces an exploit would start from.

Compiled by libseccomp (the maintained compiler used by systemd, Docker and Podman) through its ctypes
binding `pyseccomp`, which installs from PyPI into any venv; no BPF is written by hand here.
"""

from __future__ import annotations

import errno
import os
from functools import lru_cache

# Denied outright with EPERM (the errno a caller gets for a forbidden operation).
DENIED_SYSCALLS: tuple[str, ...] = (
    # new namespaces, or joining one: the sandbox's own walls would become movable
    "unshare", "setns",
    # filesystem mounts, in the old and the new (fd-based) API
    "mount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig", "fsmount", "fspick", "open_tree",
    "move_mount", "mount_setattr",
    # reading or writing other processes, or their file descriptors
    "ptrace", "process_vm_readv", "process_vm_writev", "process_madvise", "kcmp", "pidfd_getfd",
    # large kernel attack surfaces that no test needs
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "keyctl", "add_key", "request_key",
    # the execution domain (personality flags turn off ASLR or make data executable)
    "personality",
    # file handles bypass path permissions (the "shocker" escape)
    "name_to_handle_at", "open_by_handle_at",
    # whole-machine state: kernel modules, kexec, reboot, swap, accounting, clocks, names, quotas, logs
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot",
    "swapon", "swapoff", "acct", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
    "sethostname", "setdomainname", "quotactl", "quotactl_fd", "syslog", "vhangup", "lookup_dcookie",
    "fanotify_init", "nfsservctl", "uselib", "ustat", "sysfs", "_sysctl",
    # raw I/O ports and NUMA page moves between processes
    "iopl", "ioperm", "migrate_pages", "move_pages",
)

# Denied with ENOSYS ("not implemented") so that callers fall back: glibc's clone3 wrapper (threads,
# posix_spawn) then uses clone, whose flags the filter can see. clone3 passes its flags in memory, which a
# seccomp filter cannot read, so it cannot be allowed selectively.
ENOSYS_SYSCALLS: tuple[str, ...] = ("clone3",)

# clone is allowed (threads, fork) unless its flags ask for a new namespace: one deny rule per flag,
# matching (flags & bit) == bit on argument CLONE_FLAGS_ARG. (CLONE_NEWTIME shares its bit with clone's
# exit-signal byte, where no valid signal sets it: denying it there costs nothing.)
CLONE_NAMESPACE_FLAGS: dict[str, int] = {
    "CLONE_NEWTIME": 0x00000080,
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
CLONE_FLAGS_ARG = 0  # clone's flags argument on x86_64 and aarch64 (s390 swaps the first two arguments)
DENY_ERRNO = errno.EPERM


class SeccompUnavailableError(RuntimeError):
    pass


def _binding():
    try:
        import pyseccomp  # lazy: fails without libseccomp; every `spogw` start-up loads this module
    except ImportError as e:  # also RuntimeError("Unable to find libseccomp") from pyseccomp itself
        raise SeccompUnavailableError(
            f"the sandbox's syscall filter needs libseccomp and pyseccomp ({e}). Fix: "
            "`apt-get install libseccomp2` and `pip install pyseccomp`") from e
    except RuntimeError as e:
        raise SeccompUnavailableError(f"{e}. Fix: `apt-get install libseccomp2`") from e
    return pyseccomp


def _syscall_number(sc, name: str) -> int:
    nr = sc.resolve_syscall(sc.Arch.NATIVE, name)
    if nr == -1:  # __NR_SCMP_ERROR: a name libseccomp does not know at all (a typo in the lists above)
        raise ValueError(f"libseccomp knows no syscall named {name!r}")
    return nr  # a negative pseudo-number for one this architecture lacks: libseccomp skips its rule


def build_filter():
    """The filter as a libseccomp SyscallFilter for the native architecture. Any other architecture's
    syscalls (int 0x80 on x86_64, the x32 ABI) kill the process: the rules would not match them."""
    sc = _binding()
    f = sc.SyscallFilter(sc.ALLOW)
    f.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    for name in DENIED_SYSCALLS:
        f.add_rule(sc.ERRNO(DENY_ERRNO), _syscall_number(sc, name))
    for name in ENOSYS_SYSCALLS:
        f.add_rule(sc.ERRNO(errno.ENOSYS), _syscall_number(sc, name))
    for bit in CLONE_NAMESPACE_FLAGS.values():
        f.add_rule(sc.ERRNO(DENY_ERRNO), "clone", sc.Arg(CLONE_FLAGS_ARG, sc.MASKED_EQ, bit, bit))
    return f


def _export(method: str) -> bytes:
    fd = os.memfd_create("spogw-seccomp", os.MFD_CLOEXEC)
    try:
        with open(fd, "w+b", closefd=False) as f:
            getattr(build_filter(), method)(f)
        os.lseek(fd, 0, os.SEEK_SET)
        return os.read(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


@lru_cache(maxsize=1)
def bpf_program() -> bytes:
    """The compiled BPF program (struct sock_filter[]), as bwrap's --seccomp reads it."""
    return _export("export_bpf")


def pseudo_code() -> str:
    """libseccomp's human-readable rendering of the filter, for review and debugging."""
    return _export("export_pfc").decode()


def program_fd() -> int:
    """A fresh file descriptor holding the BPF program at offset 0, for one bwrap start. The caller passes
    it to the child (pass_fds) and closes it once the child has started."""
    fd = os.memfd_create("spogw-seccomp-bpf", os.MFD_CLOEXEC)
    os.write(fd, bpf_program())
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
