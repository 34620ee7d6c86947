"""The sandbox starts from any interpreter a user runs spogw with: a fresh venv (symlinked or copied python,
with or without system site-packages) and the base interpreter itself. `spogw exec-workflow` runs the real
bundled executor and the real bwrap sandbox from each; CI itself runs from a fresh venv (.ci/run), which
covers `spogw run --profile ci` (tests/test_pipeline_e2e.py) from a venv.

The fresh venvs are made with --without-pip and reach this project's installed packages through a .pth file
that calls site.addsitedir: sys.executable, sys.prefix and pyvenv.cfg are the new venv's own, which is what
the sandbox has to cope with; only the (unchanged) packages are shared, to keep the test fast."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from spogw_dagster.workflow.template import TEMPLATES

pytestmark = pytest.mark.model
PROJECT_SITE = sysconfig.get_paths()["purelib"]  # where this project and its dependencies are installed
BASE_PYTHON = os.path.realpath(getattr(sys, "_base_executable", "") or sys.executable)
PY_VER = f"python{sys.version_info.major}.{sys.version_info.minor}"


def fresh_venv(root: Path, *venv_flags: str) -> Path:
    """A new venv at root/venv; returns its python (the venv's own, not a resolved path)."""
    venv = root / "venv"
    subprocess.run([BASE_PYTHON, "-m", "venv", "--without-pip", *venv_flags, str(venv)], check=True, timeout=120)
    site_dir = venv / "lib" / PY_VER / "site-packages"
    (site_dir / "_spogw_project.pth").write_text(f"import site; site.addsitedir({PROJECT_SITE!r})\n")
    return venv / "bin" / "python"


def exec_workflow(python_argv: list[str], tmp_path: Path) -> tuple[dict, str]:
    wf = tmp_path / "wf.py"
    wf.write_text(TEMPLATES["code"])
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not p.startswith(sys.prefix))  # not the test runner's venv
    proc = subprocess.run(
        python_argv + ["exec-workflow", "--benchmark", "humaneval", "--query", "HumanEval/0", "--workflow", str(wf),
                       "--json", "--no-cache"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert proc.stdout.strip(), f"exec-workflow printed nothing (rc={proc.returncode}): {proc.stderr[-2000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def interpreter_report(python_argv: list[str]) -> dict:
    code = ("import json, sys; print(json.dumps({'executable': sys.executable, 'prefix': sys.prefix, "
            "'base_prefix': sys.base_prefix}))")
    out = subprocess.run(python_argv[:1] + ["-c", code], capture_output=True, text=True, check=True, timeout=60)
    return json.loads(out.stdout)


VARIANTS = {
    "venv (symlinked python)": (),
    "venv (copied python)": ("--copies",),
    "venv --system-site-packages": ("--system-site-packages",),
}


@pytest.mark.parametrize("flags", list(VARIANTS.values()), ids=list(VARIANTS))
def test_exec_workflow_runs_in_the_sandbox_from_a_fresh_venv(tmp_path, flags):
    python = fresh_venv(tmp_path, *flags)
    me = interpreter_report([str(python)])
    assert me["executable"] == str(python) and me["prefix"] == str(tmp_path / "venv") != me["base_prefix"]
    data, stderr = exec_workflow([str(python), "-m", "spogw_dagster.cli"], tmp_path)
    assert data["isolation"] == "bwrap", data
    assert data["status"] == "ok", (data, stderr[-1500:])  # the workflow ran inside the sandbox
    assert data["llm_calls"] == 1 and data["cached_calls"] == 0  # the real bundled executor answered
    assert data["score"] in (0.0, 1.0) and "sandbox" not in data.get("detail", "").lower(), data


def test_exec_workflow_runs_in_the_sandbox_from_the_base_interpreter(tmp_path):
    """No venv at all (as a conda or pyenv prefix is run): the base binary with this project on its path."""
    # the project's site first, as in a prefix the project is installed into (the base interpreter's own
    # site-packages may hold older copies of our dependencies, e.g. a typing_extensions that anyio cannot use)
    argv = [BASE_PYTHON, "-c", f"import site, sys; old = list(sys.path); site.addsitedir({PROJECT_SITE!r}); "
                               "sys.path[:] = [p for p in sys.path if p not in old] + old; "
                               "from spogw_dagster.cli import main; sys.exit(main())"]
    data, stderr = exec_workflow(argv, tmp_path)
    assert data["isolation"] == "bwrap" and data["status"] == "ok", (data, stderr[-1500:])


def test_ci_runs_the_suite_from_a_venv():
    """.ci/run installs into a fresh venv and says so with SPOGW_CI_VENV: then this very process (which also
    runs the `spogw run --profile ci` end-to-end test) is a venv's python."""
    ci_venv = os.environ.get("SPOGW_CI_VENV")
    if not ci_venv:
        pytest.skip("not under .ci/run")
    assert sys.prefix != sys.base_prefix, "CI must run from a venv, where users install"
    assert os.path.realpath(sys.prefix) == os.path.realpath(ci_venv)
