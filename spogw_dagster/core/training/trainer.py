"""Offline LoRA trainer for the generator (ioGRPO + mKL and the baseline objectives), transformers + peft.

One call trains one iteration: ``train_lora(examples, cfg, output_dir, base_model, previous_adapter)``.

Policies (the algorithm as docs/algorithm.md specifies it), with π_{k−1} = base + previous adapter (the base model when there is none):

* **π_old** is the policy that produced the data, π_{k−1}. ``cfg.old_logprobs="recompute"`` (default)
  computes it before training, under ``no_grad`` and in eval mode, with the previous adapter loaded as a
  second, frozen adapter — so it is right even when ``init="restart"`` starts the trainable adapter from
  scratch. ``"data"`` takes the per-token log-probs recorded by the sampler (`TrainExample.old_logprobs`,
  which then need `completion_token_ids` so that tokens line up); they follow the same convention (see
  `core.training.logprobs`), provided the sampler's temperature equals ``cfg.temperature``.
* **π_ref** is ``"base"`` (adapters disabled) or ``"previous"`` (π_{k−1}). Both are precomputed before the
  first step in the same pass as π_old (for "previous" it *is* π_old's numbers when those are recomputed),
  so a training step is one forward + backward of the trainable policy and no second model or adapter is
  kept in memory. The reference is only computed when the objective needs it (β > 0, or score_dpo).
* **π_θ** is the trainable adapter: ``init="continue"`` starts from a copy of the previous adapter (its
  rank, alpha and target modules must match the config), ``"restart"`` from a fresh LoRA (B = 0, so the
  start equals the base model).

All log-probs are ``log softmax(logits / T)`` of the completion tokens with
``T = cfg.logprob_temperature(cfg.temperature)``: the sampling temperature for spogw / grpo / grpo_nokl
(π_old is the sampler's distribution), 1 for score_dpo and rwr (ScoreFlow's TRL DPO and W4S score at
T = 1); prompt tokens are context only. score_dpo trains on explicit pairs: each example carries
``role`` "chosen" or "rejected" and its pair's ``group_id``; a pair's two rows share a micro-batch. With ``cfg.shared_prompt`` (None, the default: the device's faster path, shared on the CPU) every pass runs each distinct prompt of a batch once and
only the completions per row (`core.training.logprobs.SharedPromptBatch`); micro-batches keep a prompt's rows together. The loss is `core.training.objectives.compute_loss(cfg.objective, ...)`.

Output: a standard PEFT folder (``adapter_config.json`` + ``adapter_model.safetensors``, loadable by
``peft`` and by vLLM ``--enable-lora``) plus ``training_stats.json`` (config, hashes, per-step stats,
summary). It is written into a temporary sibling folder and renamed into place, so a crash never leaves a
half-written adapter. If `output_dir` already holds a finished run with the same ``run_hash`` (config,
data, base model, previous adapter) that run is returned instead of training again.

Determinism: the fresh LoRA initialisation, the data order (per epoch) and dropout are seeded from
``cfg.seed``; on the CPU the same seed and data give bit-identical adapter tensors.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from typing import Any, Callable, Mapping, Sequence

import torch

from spogw_dagster.adapter_files import STATS_FILE
from spogw_dagster.core.device_paths import shared_prompt_for
from spogw_dagster.core.training.adapters import save_adapter, trainable_adapter
from spogw_dagster.core.training.anchor_choice import anchor_decisions, stop_when_decided
from spogw_dagster.core.training.batching import aggregate, tokenize
from spogw_dagster.core.training.config import TrainConfig
from spogw_dagster.core.training.distributed import from_environment
from spogw_dagster.core.training.examples import TrainExample, TrainResult
from spogw_dagster.core.training.identity import finished_run_stats, identify_run, sha
from spogw_dagster.core.training.logprobs import score_completions
from spogw_dagster.core.training.optimize import optimize
from spogw_dagster.core.training.passes import device_for, log_prob_shift, reference_passes, shared_path
from spogw_dagster.core.training.snapshots import plan as plan_snapshots
from spogw_dagster.models import load_model_and_tokenizer, resolve_dtype

__all__ = ["train_lora", "score_examples"]


def train_lora(
    examples: Sequence[TrainExample | Mapping[str, Any]],
    cfg: TrainConfig | None = None,
    output_dir: str | os.PathLike[str] = "adapter",
    base_model: str | os.PathLike[str] = "smollm2",
    previous_adapter: str | os.PathLike[str] | None = None,
    reuse_existing: bool = True,
    log: Callable[[dict[str, Any]], None] | None = None,
    progress: Callable[[str], None] | None = None,
    snapshots: Mapping[int, str | os.PathLike[str]] | None = None,
) -> TrainResult:
    """Train one LoRA adapter on an offline dataset and save it atomically to `output_dir`.

    `snapshots` ({epochs: folder}): shorter runs to save on the way, each as the finished run of that length,
    where that is exact (`core.training.snapshots`; otherwise ignored).

    Stages: identify the run (and reuse an identical finished one) → tokenize → π_old / π_ref → the trainable
    adapter → optimize → (optionally) how the log-probs moved → save.

    Started N times by `accelerate launch` (`core.training.launch`), the processes train one adapter together
    (`core.training.distributed`: micro-batches sharded, gradients summed); rank 0 alone logs and writes the folder,
    and the run hash is the 1-process run's (the number of processes is not part of what is trained)."""

    cfg = cfg or TrainConfig()
    # "auto" becomes the number type this device computes in before the run is identified: the run hash and
    # the stats name the type the numbers came from
    cfg = replace(cfg, dtype=resolve_dtype(cfg.dtype, device_for(cfg).type))
    exs, out, folder, prev, hashes = identify_run(examples, cfg, output_dir, base_model, previous_adapter)
    run_hash = sha(hashes)
    if reuse_existing and (done := finished_run_stats(out, run_hash)) is not None:
        return TrainResult(out, done, reused=True)
    snaps = plan_snapshots(snapshots, cfg, exs, folder, prev)

    t_start = time.perf_counter()
    dist = from_environment(cpu=device_for(cfg).type == "cpu")
    device = device_for(cfg, dist)
    cfg = replace(cfg, shared_prompt=shared_path(cfg, device))  # the stats record the path taken
    if not dist.main:  # one voice: rank 0 reports for all
        log = progress = None
    torch.manual_seed(cfg.seed)
    model, tok = load_model_and_tokenizer(folder, dtype=cfg.dtype)
    model.to(device)
    items = tokenize(exs, tok, cfg)
    items, decisions = anchor_decisions(items, cfg, progress)  # training.anchor_stop's (none when it is off)
    rows = aggregate(items) if cfg.aggregates else items  # what the passes and the optimizer run on
    t0 = time.perf_counter()
    model = reference_passes(model, rows, prev, cfg, tok.pad_token_id, device, dist)
    precompute_s = time.perf_counter() - t0
    model, params = trainable_adapter(model, prev, cfg, device)
    common = {
        "base_model": str(folder),
        "previous_adapter": str(prev) if prev is not None else None,
        "n_examples": len(items),
        "n_train_rows": len(rows),  # unique workflows with aggregate_unique (GRPO family), else n_examples
        "n_trainable_params": sum(p.numel() for p in params),
    }

    def summary(run, **extra) -> dict[str, Any]:
        return {**run.summary(), "precompute_seconds": round(precompute_s, 3), "logprob_temperature": cfg.logprob_T,
                "total_seconds": round(time.perf_counter() - t_start, 3), "device": str(device),
                "processes": dist.world, **extra}

    def after_pass() -> tuple[list[dict[str, Any]], dict[str, Any]]:
        return (log_prob_shift(model, rows, cfg, tok.pad_token_id, device, items, dist)
                if cfg.eval_after else ([], {}))

    def epoch_end(epochs: int, run) -> None:
        if (snap := snaps.get(epochs)) is None:
            return
        per_example, moved = after_pass()  # the shorter run's own (no-grad, eval mode: it draws no dropout mask)
        model.train()
        if dist.main:
            save_adapter(model, snap.out, folder, {
                "run_hash": snap.run_hash, "hashes": snap.hashes, "config": replace(cfg, epochs=epochs).to_dict(),
                **common, "steps": list(run.steps), "summary": summary(run, **moved), "examples": per_example,
                "snapshot_of_epochs": cfg.epochs})

    run = optimize(model, params, rows, cfg, tok.pad_token_id, device, log, progress, dist, epoch_end=epoch_end,
                   stop=stop_when_decided(model, decisions, cfg, device, dist))
    per_example, moved = after_pass()
    stats = {"run_hash": run_hash, "hashes": hashes, "config": cfg.to_dict(), **common, "steps": run.steps,
             "summary": summary(run, **moved), "examples": per_example}
    if dist.main:
        save_adapter(model, out, folder, stats)
    dist.barrier()  # the other ranks return once the folder is in place
    if not dist.main:
        stats = json.loads((out / STATS_FILE).read_text())
    return TrainResult(out, stats)


def score_examples(
    examples: Sequence[TrainExample | Mapping[str, Any]],
    base_model: str | os.PathLike[str] = "smollm2",
    adapter_path: str | os.PathLike[str] | None = None,
    temperature: float = 1.0,
    batch_size: int = 8,
    model=None,
    tokenizer=None,
    shared_prompt: bool | None = None,
) -> list[list[float]]:
    """Teacher-forced per-token log-probs of each example's completion under base (+ adapter).

    Tokenizes exactly like the trainer. Pass a preloaded `model`/`tokenizer` to avoid reloading. With
    `shared_prompt`, examples with the same prompt are batched together and the prompt runs once per batch
    (None: the path measured faster on the model's device, `core.device_paths`).
    """

    if model is None:
        model, tokenizer = load_model_and_tokenizer(base_model, adapter_path=adapter_path)
    exs = [e if isinstance(e, TrainExample) else TrainExample.from_dict(e) for e in examples]
    items = tokenize(exs, tokenizer, TrainConfig(objective="grpo_nokl"))
    return score_completions(
        model,
        [x.prompt_ids for x in items],
        [x.completion_ids for x in items],
        tokenizer.pad_token_id,
        temperature=temperature,
        batch_size=batch_size,
        shared_prompt=shared_prompt_for(next(model.parameters()).device.type, shared_prompt),
    )

