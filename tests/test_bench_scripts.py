"""Every script under bench/ imports: a moved or renamed function breaks a benchmark nobody runs in CI
otherwise (they need minutes or a GPU to run, not to load)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"

LOAD_ALL = """
import importlib.util, sys
bad = []
for path in sys.argv[1:]:
    name = "bench_" + path.rsplit("/", 1)[-1][:-3]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = sys.modules[name] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
    try:
        spec.loader.exec_module(mod)
    except Exception as e:  # noqa: BLE001
        bad.append(f"{path}: {type(e).__name__}: {e}")
print("\\n".join(bad))
sys.exit(1 if bad else 0)
"""


def test_every_bench_script_imports():
    scripts = sorted(str(p) for p in BENCH.glob("*.py"))
    assert len(scripts) >= 10
    res = subprocess.run([sys.executable, "-c", LOAD_ALL, *scripts], capture_output=True, text=True, timeout=600,
                         cwd=BENCH.parent)
    assert res.returncode == 0, res.stdout + res.stderr[-2000:]


def test_retrain_reads_its_settings_as_the_config_would():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_retrain", BENCH / "retrain.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    got = mod.training_overrides(["epochs=3", "learning_rate=2e-3", "objective=grpo", "eval_after=true"])
    assert got == {"epochs": 3, "learning_rate": 0.002, "objective": "grpo", "eval_after": True}
    assert type(got["epochs"]) is int and type(got["learning_rate"]) is float
    import pytest

    with pytest.raises(SystemExit, match="FIELD=VALUE"):
        mod.training_overrides(["epochs"])
