"""The sandbox for untrusted code: generated workflows, and a solution run against hidden tests.

Backends, strongest first (each one module implementing the `Isolation` protocol of backend.py):
  bwrap  - backend_bwrap: bubblewrap namespaces, a read-only root of /usr and the interpreter's prefix, a
           fresh unprivileged uid, the seccomp filter of seccomp.py; per-run cgroups (cgroups.py).
  docker - backend_docker: a container of the skeleton image (images.py) with --network none, a read-only
           root, no capabilities and the same syscall filter as a Docker profile; used when an engine answers.
  none   - backend_none: a plain subprocess with rlimits, a scrubbed environment and a temp cwd: NOT a sandbox.
           Only when the user explicitly opts out.
`detect_isolation` picks one (detect.py); `process.spawn` starts a process in it and `process.run_code` runs a
program there. environment.py holds what every backend gives a process (limits, interpreter, hidden paths).
"""

from .backend import Isolation, RunIdentity
from .backend_bwrap import Bubblewrap
from .backend_docker import Docker
from .backend_none import Unsandboxed
from .detect import detect_isolation, isolation_choices
from .environment import Limits, SandboxStartError, SandboxUnavailableError, runner_path
from .process import CodeRunResult, Spawned, run_code, signal_status, spawn

__all__ = ["Isolation", "RunIdentity", "Bubblewrap", "Docker", "Unsandboxed", "detect_isolation", "isolation_choices",
           "Limits", "SandboxStartError", "SandboxUnavailableError", "runner_path", "CodeRunResult", "Spawned",
           "run_code", "signal_status", "spawn"]
