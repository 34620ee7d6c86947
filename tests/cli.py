"""The real `spogw` CLI as a subprocess, in a clean environment (no DAGSTER_HOME or SPOGW_* of the caller's),
for the tests that run it: the fault matrix, and the one undisturbed `ci` run they share with the staleness
test (tests/conftest.py::ci_cli_run)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SPOGW = str(Path(sys.executable).with_name("spogw"))


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    for k in ("DAGSTER_HOME", "SPOGW_ASSETS_DIR", "SPOGW_PROFILE", "SPOGW_CONFIG"):
        env.pop(k, None)
    env.update(OMP_WAIT_POLICY="PASSIVE", PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore")
    return env


def spogw(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([SPOGW, *args], capture_output=True, text=True, env=cli_env(), timeout=timeout)
