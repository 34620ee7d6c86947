"""Per-run cgroups: one memory and process budget for a whole sandbox, not per process.

rlimits bound each process (RLIMIT_AS x RLIMIT_NPROC could still add up to many GiB); a cgroup bounds
the sandbox's processes together. Used when we are root and a writable cgroup v1 (memory + pids
controllers) or v2 hierarchy is mounted; otherwise the sandbox falls back to rlimits alone and says so.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
GROUP = "spogw"


@dataclass
class RunCgroup:
    dirs: list[Path]  # one per hierarchy (v1: memory and pids; v2: one)

    def join(self) -> None:
        """Move the calling process into the group. Runs in the child between fork and exec."""
        pid = str(os.getpid())
        for d in self.dirs:
            with open(d / "cgroup.procs", "w") as f:
                f.write(pid)

    def pids(self) -> set[int]:
        out: set[int] = set()
        for d in self.dirs:
            try:
                out |= {int(x) for x in (d / "cgroup.procs").read_text().split()}
            except OSError:
                pass
        return out

    def oom_killed(self) -> bool:
        for d in self.dirs:
            for name in ("memory.events", "memory.oom_control"):
                try:
                    text = (d / name).read_text()
                except OSError:
                    continue
                for line in text.splitlines():
                    key, _, val = line.partition(" ")
                    if key == "oom_kill" and val.strip() not in ("", "0"):
                        return True
        return False

    def destroy(self) -> None:
        """Kill whatever is left in the group, then remove it."""
        for _ in range(50):
            left = self.pids()
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                for d in self.dirs:
                    if d.exists():
                        d.rmdir()
                return
            except OSError:
                time.sleep(0.02)


class CgroupManager:
    def __init__(self) -> None:
        self.kind = ""
        self.why_not = ""
        if os.geteuid() != 0:
            self.why_not = "not root"
        elif (ROOT / "memory").is_dir() and (ROOT / "pids").is_dir():
            self.kind = "v1"
        elif (ROOT / "cgroup.controllers").is_file():
            self.kind = "v2"
        else:
            self.why_not = "no cgroup memory/pids controllers mounted"
        if self.kind:
            try:
                self._prepare()
            except OSError as e:
                self.kind, self.why_not = "", f"cannot create cgroups ({e})"

    def _prepare(self) -> None:
        if self.kind == "v1":
            tops = [ROOT / ctl / GROUP for ctl in ("memory", "pids")]
            for top in tops:
                top.mkdir(exist_ok=True)
        else:
            top = ROOT / GROUP
            (ROOT / "cgroup.subtree_control").write_text("+memory +pids")
            top.mkdir(exist_ok=True)
            (top / "cgroup.subtree_control").write_text("+memory +pids")
            tops = [top]
        for top in tops:
            sweep_stale(top)

    @property
    def available(self) -> bool:
        return bool(self.kind)

    def create(self, memory_bytes: int, max_pids: int) -> RunCgroup:
        name = f"run-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        if self.kind == "v1":
            mem, pids = ROOT / "memory" / GROUP / name, ROOT / "pids" / GROUP / name
            mem.mkdir()
            pids.mkdir()
            (mem / "memory.limit_in_bytes").write_text(str(memory_bytes))
            swap = mem / "memory.memsw.limit_in_bytes"
            if swap.exists():
                swap.write_text(str(memory_bytes))
            (pids / "pids.max").write_text(str(max_pids))
            return RunCgroup([mem, pids])
        d = ROOT / GROUP / name
        d.mkdir()
        (d / "memory.max").write_text(str(memory_bytes))
        if (d / "memory.swap.max").exists():
            (d / "memory.swap.max").write_text("0")
        (d / "pids.max").write_text(str(max_pids))
        return RunCgroup([d])


def sweep_stale(top: Path) -> int:
    """Remove empty run groups left by processes that died without cleaning up (named run-<pid>-<id>)."""
    removed = 0
    for d in top.glob("run-*-*"):
        try:
            pid = int(d.name.split("-")[1])
        except (IndexError, ValueError):
            continue
        if pid == os.getpid() or Path(f"/proc/{pid}").exists():
            continue  # its owner is still running
        try:
            d.rmdir()  # fails if processes are still inside: then it is not stale
            removed += 1
        except OSError:
            pass
    return removed


_MANAGER: CgroupManager | None = None


def manager() -> CgroupManager:
    global _MANAGER
    if _MANAGER is None:
        _MANAGER = CgroupManager()
    return _MANAGER
