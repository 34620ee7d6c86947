"""The `paper` profile starts: only its models swapped for the bundled ones (SMOLLM2 as the generator folder
the user would pass, a real llama.cpp server of the bundled GGUF as the OpenAI-compatible endpoint) and its sizes
shrunk in a YAML file that starts from `profile: paper`, `spogw run` passes the preflight and runs one iteration
end to end, training on 2 processes (`training.processes`, accelerate launch). Everything else is the paper's:
backend auto, bf16, temperature 1.0, the answer-only reward, LoRA r = 16, lr 5e-5, the SPOGW objective. A profile that cannot start fails here."""

from __future__ import annotations

import json
import os
import signal

import httpx
import pytest

from spogw_dagster.adapter_files import STATS_FILE
from spogw_dagster.cli import main
from spogw_dagster.pipeline.data.storage import AssetStore
from test_executor_fleet import _served_200, _start_llama_server, _wait_ready, free_port

pytestmark = pytest.mark.model

SHRUNK = """\
profile: paper
benchmark: {train_queries: 2, heldout_queries: 2}
generator: {max_new_tokens: 32, batch_size: 8}
executor: {max_tokens: 48, max_llm_calls: 6, max_operator_calls: 6, max_concurrency: 2}
execution: {concurrency: 2, wall_s: 90}
curation: {m: 4, n: 4, t: 1, g_max: 1, tau_sim: 1.0, tau_std: 0.0}
training: {epochs: 1, batch_size: 2, grad_accum: 2, processes: 2}  # 2 processes: the accelerate path
report: {baselines: [io], samples: 1, bootstrap_resamples: 200, max_regression: 1.0}
"""


def test_paper_profile_runs_one_iteration_against_a_local_endpoint(tmp_path, monkeypatch, capsys):
    from spogw_dagster.bundled_models import gguf_path
    from spogw_dagster.models import resolve_model

    port, log = free_port(), tmp_path / "llama.log"
    proc = _start_llama_server(gguf_path("smollm2"), port, log)
    try:
        _wait_ready([proc], [port], timeout_s=90)
        url = f"http://127.0.0.1:{port}/v1"
        served = httpx.get(f"{url}/models", timeout=5).json()["data"][0]["id"]
        monkeypatch.setenv("SPOGW_GENERATOR_MODEL", str(resolve_model("smollm2")))  # a Hugging Face folder
        monkeypatch.setenv("SPOGW_EXECUTOR_URL", url)
        monkeypatch.setenv("SPOGW_EXECUTOR_MODEL", served)
        monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
        cfg_file = tmp_path / "paper-small.yaml"
        cfg_file.write_text(SHRUNK)
        assets = tmp_path / "assets"
        assert main(["check", "--config", str(cfg_file), "--assets-dir", str(assets)]) == 0
        assert "ready to run" in capsys.readouterr().out
        rc = main(["run", "--config", str(cfg_file), "--iterations", "1", "--assets-dir", str(assets)])
        out = capsys.readouterr()
        assert rc == 0, out.err[-2000:]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    store = AssetStore(assets)
    sampled = store.read_parquet("sampled_workflows", "0000")
    assert sampled.height == 2 * 4  # d x m
    assert store.read_parquet("execution_scores", "0000").height == 8  # every sample scored (valid or not)
    heldout = store.read_parquet("heldout_results", "0000")
    io = heldout.filter(heldout["system"] == "baseline:io")
    assert io.height > 0 and int(io["llm_calls"].sum()) > 0
    assert _served_200(log) > 0  # the calls went to the endpoint, not an embedded model
    assert store.exists("lora_checkpoint", "0000") and store.exists("benchmark_report", "0000")
    stats = json.loads((store.adapter_dir("0000") / STATS_FILE).read_text())
    assert stats["summary"]["processes"] == 2 and stats["steps"]  # trained by accelerate launch on 2 processes
    assert "held-out scores per iteration" in out.out
