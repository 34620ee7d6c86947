"""bench/gpu_check.py: its CPU-side logic (no GPU, no vLLM here): arguments, model discovery, the log-prob
comparison, the throughput ratio and the summary line."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("gpu_check", Path(__file__).resolve().parent.parent / "bench" / "gpu_check.py")
gc = importlib.util.module_from_spec(_spec)
sys.modules["gpu_check"] = gc
_spec.loader.exec_module(gc)

QWEN_05B = {"hidden_size": 896, "num_hidden_layers": 24, "vocab_size": 151936, "intermediate_size": 4864,
            "num_attention_heads": 14, "num_key_value_heads": 2, "tie_word_embeddings": True}


def test_parse_args_defaults_and_errors():
    a = gc.parse_args([])
    assert (a.prompts, a.max_tokens, a.ratio_target, a.tol_mean, a.tol_p99, a.budget_s) == (64, 128, 0.9, 0.05, 0.5, 420.0)
    for bad in (["--prompts", "0"], ["--budget-s", "600"], ["--temperature", "0"], ["--tol-mean", "-1"]):
        with pytest.raises(SystemExit):
            gc.parse_args(bad)


def test_estimate_params_of_known_configs():
    # Qwen2.5-0.5B: 494M parameters (tied embeddings); our estimate leaves out norms and biases (< 0.1%)
    assert gc.estimate_params(QWEN_05B) == pytest.approx(494e6, rel=0.01)
    # a toy config by hand: h = 4, 2 heads of 2: emb 10*4*2 = 80 (untied); per layer q, o 2*(4*4) = 32 and k, v
    # 2*(4*4) = 32, mlp 3*4*8 = 96 -> 2 layers of 160
    toy = {"hidden_size": 4, "num_hidden_layers": 2, "vocab_size": 10, "intermediate_size": 8,
           "num_attention_heads": 2}
    assert gc.estimate_params(toy) == 80 + 2 * (32 + 32 + 96)


def test_find_local_model_order(tmp_path):
    assert gc.find_local_model("/m", {"SPOGW_GENERATOR_MODEL": "/e"}, tmp_path) == ("/m", "--model")
    assert gc.find_local_model(None, {"SPOGW_GENERATOR_MODEL": "/e"}, tmp_path) == ("/e", "$SPOGW_GENERATOR_MODEL")
    assert gc.find_local_model(None, {}, tmp_path)[0] == "smollm2"
    snap = tmp_path / "models--Qwen--Qwen2.5-0.5B" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(QWEN_05B))
    assert gc.find_local_model(None, {}, tmp_path)[0] == "smollm2"  # no weights: not a usable model
    (snap / "model.safetensors").write_bytes(b"")
    assert gc.find_local_model(None, {}, tmp_path) == (str(snap), "HF cache")
    tiny = tmp_path / "models--x--tiny" / "snapshots" / "s"
    tiny.mkdir(parents=True)
    (tiny / "config.json").write_text(json.dumps({**QWEN_05B, "num_hidden_layers": 1, "vocab_size": 100}))
    (tiny / "model.safetensors").write_bytes(b"")
    assert gc.find_local_model(None, {}, tmp_path)[0] == str(snap)  # too small to count as 0.5B-7B


def test_newest_adapter(tmp_path):
    assert gc.newest_adapter(tmp_path) is None
    for k in ("0000", "0002", "0001"):
        (tmp_path / "adapters" / k).mkdir(parents=True)
        (tmp_path / "adapters" / k / "adapter_model.safetensors").write_bytes(b"")
    assert gc.newest_adapter(tmp_path) == tmp_path / "adapters" / "0002"


def test_throughput_ratio():
    assert gc.throughput_ratio(900, 1.0, 1000, 1.0) == pytest.approx(0.9)
    assert gc.throughput_ratio(1000, 2.0, 1000, 1.0) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        gc.throughput_ratio(1, 0.0, 1, 1.0)


def test_compare_logprobs_by_hand():
    engine = [[-1.0, -2.0], [-0.5]]
    trainer = [[-1.01, -1.98], [-0.5]]
    c = gc.compare_logprobs(engine, trainer, tol_mean=0.05, tol_p99=0.5)
    assert c["tokens"] == 3 and c["mean_abs"] == pytest.approx(0.01) and c["max_abs"] == pytest.approx(0.02)
    assert c["p99_abs"] == pytest.approx(0.02) and c["mean_signed"] == pytest.approx((0.01 - 0.02) / 3)
    assert c["ok"]
    # a temperature mismatch: every token off by 0.3 -> mean 0.3 > 0.05
    off = gc.compare_logprobs([[-1.0] * 10], [[-1.3] * 10], 0.05, 0.5)
    assert not off["ok"] and off["mean_signed"] == pytest.approx(0.3)
    # p99 by nearest rank: 100 tokens, one outlier of 2.0 sits above the 99th: p99 = 0 -> ok; two -> not
    one = gc.compare_logprobs([[0.0] * 100], [[0.0] * 99 + [2.0]], 0.05, 0.5)
    assert one["p99_abs"] == 0.0 and one["ok"]
    two = gc.compare_logprobs([[0.0] * 100], [[0.0] * 98 + [2.0, 2.0]], 0.05, 0.5)
    assert two["p99_abs"] == 2.0 and not two["ok"]
    for bad in (([[0.0]], [[0.0], [0.0]]), ([[0.0, 1.0]], [[0.0]]), ([[math.nan]], [[0.0]]), ([[]], [[]])):
        with pytest.raises(ValueError):
            gc.compare_logprobs(*bad, 0.05, 0.5)


def test_summary_line():
    lp = gc.compare_logprobs([[-1.0, -2.0]], [[-1.0, -2.01]], 0.05, 0.5)
    r = gc.Results(ratio=0.97, logprobs=lp, train_step_s=0.41, train_note="0.5B bf16 LoRA, 8 rows",
                   model="Qwen2.5-0.5B (HF cache)", elapsed_s=312.4)
    line = gc.summary_line(r)
    assert line.startswith("GPU_CHECK ok ") and "\n" not in line
    assert "lora_ratio=0.97 (>=0.90)" in line and "logprob_mean_abs=0.005" in line and "train_step_s=0.41" in line
    assert "gen_tps" not in line  # only what was measured
    speeds = gc.summary_line(gc.Results(ratio=0.97, logprobs=lp, gen_tps=1234.4, train_tps=876.6))
    assert "gen_tps=1234" in speeds and "train_tps=877" in speeds
    assert line.endswith("elapsed=312s")
    assert gc.summary_line(gc.Results(ratio=0.8, logprobs=lp)).startswith("GPU_CHECK FAIL")
    assert gc.summary_line(gc.Results(ratio=0.95)).startswith("GPU_CHECK INCOMPLETE")
    err = gc.summary_line(gc.Results(error="RuntimeError: no CUDA device visible to torch"))
    assert err.startswith("GPU_CHECK FAIL") and "no CUDA device" in err


def test_main_without_gpu_prints_one_failing_line(capsys, monkeypatch):
    monkeypatch.setattr(gc, "_ensure_vllm", lambda install: (_ for _ in ()).throw(RuntimeError("vllm is not installed")))
    assert gc.main(["--budget-s", "60"]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("GPU_CHECK FAIL") and "vllm is not installed" in out[0]
