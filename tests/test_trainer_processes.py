"""train_lora across 2 processes (accelerate launch, gloo on the CPU) against the same run in 1 process.

The global batch is the same in both (grad_accum micro-batches of batch_size rows per optimizer step); with 2
processes each rank back-propagates its share of a step's micro-batches and the gradients are summed. The
step's gradient is then the same sum taken in another order, so the runs agree up to float32 rounding: the
losses to ~1e-7 relative. Adam divides each gradient by its own running magnitude, which turns rounding-level
differences of near-zero gradient components into differences of up to lr per step in those weights, so the
adapters are compared as the shared- vs per-row-prompt test does (1e-3 of the largest LoRA-B weight), which
a wrong shard (a micro-batch missed or counted twice, a wrong weight) exceeds by orders of magnitude.

grad_accum = 3 over 4 micro-batches an epoch gives steps of 3 and 1 micro-batches: one rank runs two and the
other one, then one rank runs none (it adds zeros to the sum)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from safetensors.torch import load_file

from spogw_dagster.adapter_files import STATS_FILE
from spogw_dagster.core.training.launch import fit_adapter
from spogw_dagster.core.training import TrainConfig, TrainExample
from tiny_llama import save_tiny_llama, tiny_llama

GROUP = [("    a = generate(q)\n    return a\n", 1.0, 1.0), ("    s = ensemble(q, 3)\n    return s\n", 0.5, 0.9),
         ("    pass\n", -0.5, 0.1), ("    x = review(q)\n", -1.0, 0.0)]


def _examples() -> list[TrainExample]:
    return [TrainExample(f"Write the body of a workflow.\nTask: {task}.\n", c, advantage=sign * a, score=s,
                         group_id=task)
            for task, sign in (("add two numbers", 1.0), ("reverse a string", -1.0)) for c, a, s in GROUP]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama", *tiny_llama())


CFG = TrainConfig(epochs=2, batch_size=2, grad_accum=3, learning_rate=1e-2, seed=7, beta=0.1,
                  target_modules=("q_proj", "k_proj", "v_proj"), device="cpu")


def test_two_processes_train_the_adapter_one_process_trains(tiny_model, tmp_path):
    lines: list[str] = []
    one = fit_adapter(_examples(), CFG, tmp_path / "one", base_model=tiny_model, processes=1)
    two = fit_adapter(_examples(), CFG, tmp_path / "two", base_model=tiny_model, processes=2,
                      progress=lines.append, snapshots={1: tmp_path / "two-e1"})
    a, b = one.stats, two.stats
    assert (a["summary"]["processes"], b["summary"]["processes"]) == (1, 2)
    assert a["run_hash"] == b["run_hash"]  # the number of processes is not part of what is trained
    # 4 micro-batches of 2 rows an epoch in steps of 3 + 1: the whole step's rows, whichever rank ran them
    assert [s["rows"] for s in b["steps"]] == [s["rows"] for s in a["steps"]] == [6, 2, 6, 2]
    assert [s["tokens"] for s in b["steps"]] == [s["tokens"] for s in a["steps"]]
    for sa, sb in zip(a["steps"], b["steps"]):
        for k in ("loss", "policy_loss", "kl_loss", "grad_norm"):
            assert sb[k] == pytest.approx(sa[k], rel=1e-4, abs=1e-6), k
    ta, tb = load_file(str(one.adapter_dir / "adapter_model.safetensors")), load_file(
        str(two.adapter_dir / "adapter_model.safetensors"))
    assert ta.keys() == tb.keys()
    scale = max(float(t.abs().max()) for k, t in ta.items() if "lora_B" in k)
    worst = max(float((ta[k] - tb[k]).abs().max()) for k in ta)
    print(f"first loss {a['steps'][0]['loss']:.8f} vs {b['steps'][0]['loss']:.8f}; "
          f"max |Δ weight| {worst:.3g} of max |B| {scale:.3g}")
    assert scale > 1e-3 and worst < 1e-3 * scale
    for ea, eb in zip(a["examples"], b["examples"]):  # π_old and the after pass, sharded and gathered
        assert eb["mean_logp_before"] == pytest.approx(ea["mean_logp_before"], abs=1e-5)
        assert eb["mean_logp_after"] == pytest.approx(ea["mean_logp_after"], abs=1e-5)
    assert sum("done: loss" in x for x in lines) == 4  # rank 0's progress, once per step
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one", "two", "two-e1"]  # no temporary folder left
    # the 1-epoch run, saved by rank 0 on the way: the 1-epoch run of one process, and found as that run
    one_e1 = fit_adapter(_examples(), replace(CFG, epochs=1), tmp_path / "one-e1", base_model=tiny_model)
    t1, t2 = (load_file(str(d / "adapter_model.safetensors")) for d in (one_e1.adapter_dir, tmp_path / "two-e1"))
    assert max(float((t1[k] - t2[k]).abs().max()) for k in t1) < 1e-3 * scale
    snap = json.loads((tmp_path / "two-e1" / STATS_FILE).read_text())
    assert snap["run_hash"] == one_e1.stats["run_hash"] and snap["summary"]["processes"] == 2
    for e1, e2 in zip(one_e1.stats["examples"], snap["examples"]):  # its own after pass, on both ranks
        assert e2["mean_logp_after"] == pytest.approx(e1["mean_logp_after"], abs=1e-5)
    assert fit_adapter(_examples(), replace(CFG, epochs=1), tmp_path / "two-e1", base_model=tiny_model,
                       processes=2).reused
    assert json.loads((two.adapter_dir / STATS_FILE).read_text())["weights_sha256"] == b["weights_sha256"]
    again = fit_adapter(_examples(), CFG, tmp_path / "two", base_model=tiny_model, processes=2)
    assert again.reused and again.stats["run_hash"] == b["run_hash"]  # found before any launch


def test_a_failure_inside_the_processes_is_an_error_with_its_cause(tiny_model, tmp_path):
    bad = replace(CFG, target_modules=("no_such_proj",))
    with pytest.raises(RuntimeError, match=r"(?s)training on 2 processes failed.*no_such_proj.*training.processes: 1"):
        fit_adapter(_examples(), bad, tmp_path / "out", base_model=tiny_model, processes=2)
    assert not (tmp_path / "out").exists()


def test_an_interrupted_launch_stops_the_job(tmp_path):
    """The step is interrupted while the job runs (here: its progress callback raises, as a Dagster
    termination raises inside it): the launcher is stopped at once, not waited for."""
    import subprocess
    import sys
    import time

    from spogw_dagster.core.training import launch as train_launch

    pidfile = tmp_path / "pid"
    child = (f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); "
             f"print({train_launch.PROGRESS!r} + 'step 1 started', flush=True); time.sleep(120)")

    def interrupted(_msg):
        raise KeyboardInterrupt

    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        train_launch._run([sys.executable, "-c", child], 2, interrupted)
    assert time.monotonic() - t0 < 30
    pid = int(pidfile.read_text())
    assert subprocess.run(["kill", "-0", str(pid)], capture_output=True).returncode != 0  # gone
