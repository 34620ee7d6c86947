"""Child processes that end with the process that started them (Linux PR_SET_PDEATHSIG): a killed parent
(a SIGKILLed Dagster step, say) must not leave a model server or a training job running behind it."""

from __future__ import annotations

import ctypes
import signal
from typing import Callable

__all__ = ["die_with_parent"]

try:  # resolved here, in the parent: dlopen in a forked child of a threaded process can deadlock
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _PRCTL = None


def die_with_parent(sig: int = signal.SIGKILL) -> Callable[[], None]:
    """A `preexec_fn` that asks the kernel to send the child `sig` when the parent's forking thread ends.
    PR_SET_PDEATHSIG fires when that *thread* ends, so fork from a thread that lives as long as the child.
    It also puts SIGTERM and SIGINT back to their default action: an ignored signal is inherited across exec,
    and a child that ignores SIGTERM outlives every attempt to stop it short of SIGKILL."""

    def preexec() -> None:  # runs in the child between fork and exec
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if _PRCTL is not None:
            _PRCTL(1, sig)  # PR_SET_PDEATHSIG

    return preexec
