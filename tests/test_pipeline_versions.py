"""Code versions come from what each asset module imports, not from a hand-kept list."""

from __future__ import annotations

import re
from pathlib import Path

from spogw_dagster.pipeline.defs import versions
from spogw_dagster.pipeline.defs.assets import ASSET_MODULES
from spogw_dagster.pipeline.settings import load_config

PKG = Path(versions.__file__).resolve().parents[2]  # spogw_dagster/


def test_closure_holds_what_the_training_asset_uses():
    c = versions.import_closure("spogw_dagster.pipeline.defs.assets.lora_checkpoint")
    # the two files the old hand-kept list missed, and the trainer core
    for f in ("pipeline/data/checkpoints.py", "fsutil.py", "core/training/trainer.py", "core/training/passes.py", "core/training/objectives.py", "adapter_files.py",
              "pipeline/defs/assets/common.py", "pipeline/defs/assets/lora_checkpoint.py", "pipeline/__init__.py"):
        assert f in c, f
    # ... and not the command line, which no asset imports
    assert "cli.py" not in c and "pipeline/runs/commands.py" not in c


def test_every_module_that_runs_sandbox_files_declares_them():
    """A module that locates the top-level sandbox/ directory runs files from it without importing them; the
    code version covers those files only through the module's own `SANDBOX_FILES`."""
    users = sorted(str(p.relative_to(PKG)) for p in PKG.rglob("*.py")
                   if re.search(r"""["']sandbox["']|dockerfile_dir\(\)|sandbox_dir\(\)""", p.read_text()) and p.name != "versions.py")
    # cli.py and preflight.py only say the word (a subcommand, a check's name); neither runs a sandbox file
    missing = [u for u in users if versions.sandbox_files(u) is None and u not in ("cli.py", "pipeline/runs/preflight.py")]
    assert not missing, f"declare SANDBOX_FILES (the glob of sandbox/ files it runs) in {missing}"
    files = {str(p.relative_to(PKG.parent)) for p in versions.asset_files("execution_scores")}
    assert {"sandbox/runner.py", "sandbox/solution_host.py", "sandbox/test_host.py"} <= files


def test_code_versions_follow_config_sections():
    a, b = load_config("ci"), load_config("ci", overrides={"report": {"samples": 3}})
    same = {m.NAME for m in ASSET_MODULES if versions.code_version(m.NAME, a) == versions.code_version(m.NAME, b)}
    # only the report and the comparison (scored like the report) read the report section
    assert same == {m.NAME for m in ASSET_MODULES} - {"benchmark_report", "objective_comparison"}


def test_an_installed_wheel_covers_the_sandbox_scripts_too(tmp_path):
    """A non-editable install has no `sandbox/` beside the package: the scripts ship as `spogw_sandbox`. The
    code version must still cover them (it once globbed the missing folder and covered nothing)."""
    import subprocess
    import sys
    import zipfile

    root = PKG.parent
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                        str(tmp_path / "whl"), str(root)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    (wheel,) = (tmp_path / "whl").glob("spogw_dagster-*.whl")
    zipfile.ZipFile(wheel).extractall(tmp_path / "site")
    code = ("import spogw_dagster; from spogw_dagster.pipeline.defs import versions as v; "
            "print(spogw_dagster.__file__); print(v.sandbox_dir()); "
            "print(' '.join(v._label(p) for p in v.asset_files('execution_scores')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         env={**__import__("os").environ, "PYTHONPATH": str(tmp_path / "site")})
    assert out.returncode == 0, out.stderr[-2000:]
    pkg_file, sandbox, labels = out.stdout.splitlines()
    assert pkg_file.startswith(str(tmp_path / "site")) and sandbox == str(tmp_path / "site" / "spogw_sandbox")
    assert {"sandbox/runner.py", "sandbox/solution_host.py", "sandbox/test_host.py"} <= set(labels.split())


def test_every_package_of_the_source_tree_is_in_the_wheel():
    """pyproject lists its packages by hand: a new subpackage left out installs as an editable checkout but
    not as a wheel (core.training was, once)."""
    import tomllib

    listed = set(tomllib.loads((PKG.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(PKG.parent).parts) for p in PKG.rglob("__init__.py")}
    assert found - listed == set(), f"add to [tool.setuptools] packages: {sorted(found - listed)}"
