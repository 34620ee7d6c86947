"""The Docker client and engine, as every container-using part of spogw talks to them: the docker sandbox
backend, the image builder and the container step executor."""

from __future__ import annotations

import os
import shutil
import subprocess

DEFAULT_HOST = "unix:///var/run/docker.sock"


class DockerUnavailableError(RuntimeError):
    """No usable Docker engine, client or image; the message names the fix."""


def client() -> str:
    """Absolute path of the docker client: sandboxed starts run with a scrubbed PATH (/usr/bin:/bin)."""
    path = shutil.which("docker")
    if not path:
        raise DockerUnavailableError("no docker client on PATH. Fix: `apt-get install docker.io`")
    return path


def host() -> str:
    """The engine to talk to, passed as -H on every call (the scrubbed environment drops DOCKER_HOST)."""
    return os.environ.get("DOCKER_HOST") or DEFAULT_HOST


def docker(*args: str, stdin: bytes | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run one docker client command against our engine; never raises for a non-zero exit."""
    try:
        return subprocess.run([client(), "-H", host(), *args], input=stdin, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(e.cmd, 124, b"", f"timed out after {timeout}s".encode())


def last_line(res: subprocess.CompletedProcess) -> str:
    """The last line a failed docker command printed: what an error message quotes."""
    text = (res.stderr or res.stdout or b"").decode(errors="replace").strip()
    return text.splitlines()[-1] if text else f"exit code {res.returncode}"


def engine_answers(timeout: float = 10) -> tuple[bool, str]:
    res = docker("version", "--format", "{{.Server.Version}}", timeout=timeout)
    if res.returncode != 0:
        return False, f"no Docker engine answers at {host()} ({last_line(res)})"
    return True, res.stdout.decode().strip()


def require_engine() -> str:
    """The engine's version, or DockerUnavailableError naming how to start one."""
    ok, why = engine_answers()
    if not ok:
        raise DockerUnavailableError(f"{why}. Fix: start one as root: `dockerd --storage-driver=vfs &`")
    return why
