"""No isolation: a plain subprocess with rlimits, a scrubbed environment and a fresh temp cwd. NOT a sandbox
(network and the filesystem stay reachable); used only when the user explicitly opts out."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import ClassVar

from .backend import Launch, RunIdentity
from .environment import Limits


@dataclass(frozen=True)
class Unsandboxed:
    detail: str = ""
    name: ClassVar[str] = "none"
    host_limits_memory: ClassVar[bool] = True

    def runner(self, script: str) -> tuple[str, list[tuple[str, str]]]:
        return script, []  # the host's own path: nothing hides it

    def command(self, argv: list[str], limits: Limits, ro_files: list[tuple[str, str]],
                run: RunIdentity) -> list[str]:
        return list(argv)

    @contextmanager
    def launch(self, argv: list[str], limits: Limits, ro_files: list[tuple[str, str]]) -> Iterator[Launch]:
        run = RunIdentity()
        yield Launch(self.command(argv, limits, ro_files, run), run,
                     scratch=tempfile.TemporaryDirectory(prefix="spogw-run-"))

    async def release(self, launch: Launch) -> None:
        if launch.scratch is not None:
            launch.scratch.cleanup()
