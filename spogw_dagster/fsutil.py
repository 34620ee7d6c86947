"""Small file-system helpers shared by every layer: atomic writes, directory swaps, content hashes.

Nothing we write may be seen half-written: a file goes to a temp name in the same directory, is fsynced,
then renamed over the target; a folder (an adapter, a converted model) is built aside and swapped in.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def file_lock(path: str | os.PathLike[str]) -> Iterator[None]:
    """An exclusive advisory lock on `path` (created if missing) for the duration of the block."""
    with open(path, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def fsync_dir(d: Path) -> None:
    """Make a rename durable (best effort: some file systems refuse to open directories)."""
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temp path beside `path`; on success it is fsynced and renamed onto `path`, else removed."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.parent / f".tmp-{uuid.uuid4().hex[:12]}-{p.name}.part"
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(p.parent)


def write_bytes_atomic(data: bytes, path: str | os.PathLike[str]) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text_atomic(text: str, path: str | os.PathLike[str]) -> Path:
    return write_bytes_atomic(text.encode("utf-8"), path)


def replace_dir(tmp: Path, out: Path) -> None:
    """Swap a fully built folder `tmp` into place at `out` (the old one, if any, is moved aside first)."""
    if out.exists():
        trash = out.parent / f".trash-{out.name}-{uuid.uuid4().hex[:8]}"
        os.rename(out, trash)
        os.rename(tmp, out)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.rename(tmp, out)


def file_sha256(path: str | os.PathLike[str], chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def pid_alive(pid: int, start: str | None = None) -> bool:
    """Whether a process with this pid exists (one we may not signal counts as alive). A zombie (killed, not yet
    reaped by its parent) is dead; with `start` (`process_start`'s value when the pid was recorded), a process
    that started at another time is a reused pid, also dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = _proc_stat(pid)
    if stat is None:
        return True  # no /proc: trust the signal
    return stat[0] != "Z" and (start is None or stat[19] == start)


def process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22): with the pid, an
    identity that a reused pid does not share. None where there is no /proc."""
    stat = _proc_stat(pid)
    return stat[19] if stat is not None else None


def _proc_stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2:].split()  # after "pid (comm) ": state is [0], starttime [19]
