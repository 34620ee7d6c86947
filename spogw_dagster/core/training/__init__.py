"""Training the generator: one LoRA run per iteration (`train_lora`), its objectives and their registry, the
teacher-forced log-probs every pass shares, and running it across processes.

The run, in the order its stages happen (`trainer.train_lora`):

    identity.py    what makes two runs the same run; reuse of an identical finished run
    batching.py    examples -> token rows (unique-workflow rows, ScoreFlow's pairs) -> seeded micro-batches
    passes.py      the device and forward path; π_old / π_ref and after-training passes; one micro-batch's loss
    adapters.py    π_θ: the trainable LoRA adapter; writing the PEFT folder atomically
    optimize.py    AdamW over the micro-batches, the LR schedule, one optimizer step
    config.py      TrainConfig;  examples.py  TrainExample, TrainResult

    objectives.py  the losses (ioGRPO + mKL, GRPO, ScoreFlow's DPO, W4S's RWR), pure torch
    registry.py    the objectives the trainer knows, each declared once
    logprobs.py    per-token log-probs of completions (shared-prompt and per-row batches)
    distributed.py / launch.py   several processes training one adapter (`accelerate launch`)

Names are re-exported lazily so that importing the package (for `TrainConfig`) does not import torch.
"""

from __future__ import annotations

from spogw_dagster.lazy_exports import lazy_getattr

_EXPORTS = {
    "TrainConfig": "config",
    "config_identity": "config",
    "TrainExample": "examples",
    "TrainResult": "examples",
    "data_hash": "identity",
    "finished_run": "identity",
    "lora_config": "adapters",
    "save_adapter": "adapters",
    "train_lora": "trainer",
    "score_examples": "trainer",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_getattr(__name__, _EXPORTS, globals())
