"""Helpers for the UI test: start and stop `dagster dev` (with all its children), query its GraphQL API, and
launch Debian's headless Chromium the way it runs on these machines."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

CHROMIUM = "/usr/bin/chromium"
# No GPU, no sandbox (root), and none of Chromium's own background traffic: the machine's network is closed.
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after `comm` (state, ppid, pgrp, session, ..., starttime at [19])."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _procs() -> dict[int, list[str]]:
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and (st := _stat(int(d.name))) is not None:
            out[int(d.name)] = st
    return out


def tree(pid: int) -> dict[int, str]:
    """Every live process under `pid` or in its session, as {pid: start time} (so a reused pid is not hit)."""
    procs = _procs()
    kids: dict[int, list[int]] = {}
    for p, st in procs.items():
        kids.setdefault(int(st[1]), []).append(p)
    out: dict[int, str] = {p: st[19] for p, st in procs.items() if int(st[3]) == pid and st[0] != "Z"}
    todo = [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            if c not in out and procs[c][0] != "Z":
                out[c] = procs[c][19]
                todo.append(c)
    out.pop(pid, None)
    return out


def _same(pid: int, start: str) -> bool:
    st = _stat(pid)
    return st is not None and st[0] != "Z" and st[19] == start


class DagsterDev:
    """`dagster dev -w workspace.yaml` on 127.0.0.1 in its own session; `stop()` ends it and every child."""

    def __init__(self, repo: Path, home: Path, env: dict[str, str], log_path: Path, port: int | None = None):
        self.repo, self.home, self.env, self.log_path = repo, home, env, log_path
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self._seen: dict[int, str] = {}

    def start(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
        env = {**self.env, "DAGSTER_HOME": str(self.home), "PYTHONUNBUFFERED": "1"}
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dagster", "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(self.port)],
            cwd=self.repo, env=env, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def graphql(self, query: str, variables: dict[str, Any] | None = None, timeout: float = 60) -> dict[str, Any]:
        r = httpx.post(f"{self.url}/graphql", json={"query": query, "variables": variables or {}}, timeout=timeout)
        r.raise_for_status()
        body = r.json()
        if body.get("errors"):
            raise AssertionError(f"GraphQL errors: {body['errors']}")
        return body["data"]

    def wait_ready(self, timeout: float = 240) -> float:
        """Until the webserver answers and the code location is loaded; returns the seconds waited."""
        t0 = time.monotonic()
        last = "no answer yet"
        while time.monotonic() - t0 < timeout:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"dagster dev exited with {self.proc.returncode}:\n{self.log_tail()}")
            self._seen.update(tree(self.proc.pid))
            try:
                data = self.graphql(
                    "{ workspaceOrError { __typename ... on Workspace { locationEntries { name loadStatus "
                    "locationOrLoadError { __typename ... on PythonError { message } } } } } }", timeout=10)
                entries = data["workspaceOrError"].get("locationEntries") or []
                last = repr(entries)
                for e in entries:
                    err = e.get("locationOrLoadError") or {}
                    if err.get("__typename") == "PythonError":
                        raise AssertionError(f"code location {e['name']} failed to load: {err['message']}")
                    if e["loadStatus"] == "LOADED" and err.get("__typename") == "RepositoryLocation":
                        return time.monotonic() - t0
            except (httpx.HTTPError, ValueError) as e:
                last = repr(e)
            time.sleep(1)
        raise AssertionError(f"dagster dev not ready after {timeout:.0f} s ({last}):\n{self.log_tail()}")

    def stop(self, grace: float = 30) -> None:
        """SIGINT to `dagster dev` (its own shutdown path), then SIGKILL whatever of its tree is left."""
        if self.proc is None:
            return
        pid = self.proc.pid
        self._seen.update(tree(pid))
        if self.proc.poll() is None:
            try:
                os.kill(pid, signal.SIGINT)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and self.proc.poll() is None:
                self._seen.update(tree(pid))
                time.sleep(0.5)
        self._seen.update(tree(pid))
        if self.proc.poll() is None:
            self.proc.kill()
        for p, start in sorted(self._seen.items()):
            if _same(p, start):
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self._log.close()

    def leftovers(self) -> list[int]:
        """Processes of this server still alive (after `stop()`: none)."""
        time.sleep(0.5)
        return sorted(p for p, start in self._seen.items() if _same(p, start))
