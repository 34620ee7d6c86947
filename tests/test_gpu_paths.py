"""bench/gpu_paths.py, the GPU bench that needs neither vLLM nor weights: its pure parts by hand, and its CPU dry
run end to end (the same code that runs on a lent GPU, on a tiny shape)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "bench" / "gpu_paths.py"
_spec = importlib.util.spec_from_file_location("gpu_paths", _PATH)
gp = importlib.util.module_from_spec(_spec)
sys.modules["gpu_paths"] = gp
_spec.loader.exec_module(gp)  # type: ignore[union-attr]


def test_matmul_params_and_step_flops_by_hand():
    tiny = gp.SHAPES["tiny"]
    # h 64, 4 heads of 16, 2 kv heads: q+o 2·64·64 = 8192, k+v 2·64·32 = 4096; MLP 3·64·128 = 24576;
    # 2 layers · 36864 + head 64·1000 = 137728
    assert gp.matmul_params(tiny) == 137728
    n = 137728
    # one micro-batch, one distinct prompt of 2 tokens, completions of 1 and 2 tokens:
    # prompt 2·N·2 + 4·64·2·(1 + 2) = 4N + 1536; row 1: 2N + 512·3; row 2: 4N + 512·(3 + 4); three passes
    batches = [([[5, 6], [5, 6]], [[7], [8, 9]])]
    assert gp.step_flops(tiny, batches) == pytest.approx(3 * (10 * n + 1536 + 1536 + 3584))


def test_busy_share_is_the_union_of_kernel_intervals():
    assert gp.busy_share([(0, 2), (1, 3), (5, 6)], 10) == pytest.approx(0.4)  # [0, 3] and [5, 6]
    assert gp.busy_share([(0, 4), (1, 2)], 8) == pytest.approx(0.5)  # nested kernels count once
    assert gp.busy_share([], 1) == 0.0


def test_rounds_alternate_and_workloads_share_a_header():
    assert gp.alternate(3) == [("a", "b"), ("b", "a"), ("a", "b")]
    w = gp.Workload.make(3, 2, 30, 8, vocab=50, seed=1)
    assert [len(p) for p in w.prompts] == [30, 30, 30] and w.prompts[0][:20] == w.prompts[2][:20]
    assert all(4 <= len(c) <= 8 for cs in w.completions for c in cs)
    assert all(2 <= t < 50 for p in w.prompts for t in p)  # never pad (0) or EOS (1)
    mbs = w.micro_batches(4)
    assert [len(c) for _, c in mbs] == [4, 2] and mbs[0][0][:2] == [w.prompts[0]] * 2


def test_unknown_shape_is_refused_with_the_choices():
    with pytest.raises(SystemExit):
        gp.parse_args(["--shapes", "gpt5"])


def test_cpu_dry_run_prints_both_ratios_and_the_plan_figures(capsys):
    assert gp.main(["--device", "cpu", "--shapes", "tiny", "--prompts", "2", "--rows", "2", "--prompt-tokens", "24",
                    "--completion-tokens", "6", "--micro-batch", "4", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "RATIO train shared/per-row = " in out and "RATIO sample prefix/generate = " in out
    plan = next(line for line in out.splitlines() if line.startswith("PLAN tiny on cpu"))
    assert "--generator-tps" in plan and "--train-tps" in plan
    assert "MFU" not in out  # no peak on the CPU: no made-up utilisation
