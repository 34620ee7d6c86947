"""LoRA adapters: the peft config, the trainable adapter π_θ (a copy of π_{k-1}'s or a fresh seeded one), and
writing the PEFT folder atomically."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from spogw_dagster.adapter_files import ADAPTER_CONFIG, ADAPTER_FILES, ADAPTER_WEIGHTS, STATS_FILE
from spogw_dagster.core.training.config import TrainConfig
from spogw_dagster.fsutil import file_sha256, replace_dir


def lora_config(cfg: TrainConfig):
    """The peft LoraConfig of `cfg` (what every fresh adapter starts from: the trainer's and a carried one)."""
    from peft import LoraConfig  # heavy: this module loads at every `spogw` start-up

    return LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=list(cfg.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )


def trainable_adapter(model, prev: Path | None, cfg: TrainConfig, device):
    """π_θ: a copy of the previous adapter (init "continue") or a fresh seeded LoRA; only LoRA weights train.
    Returns (model, trainable parameters)."""
    import torch  # heavy: this module loads at every `spogw` start-up
    from peft import get_peft_model  # heavy: this module loads at every `spogw` start-up

    if prev is not None:
        if cfg.init == "continue":
            model.load_adapter(str(prev), adapter_name="default", is_trainable=True)
        else:
            torch.manual_seed(cfg.seed)
            model.add_adapter("default", lora_config(cfg))
        model.set_adapter("default")
        model.delete_adapter("previous")
    else:
        torch.manual_seed(cfg.seed)
        model = get_peft_model(model, lora_config(cfg))
    model.to(device)
    params = []
    for n, p in model.named_parameters():
        p.requires_grad_("lora_" in n)
        if p.requires_grad:
            params.append(p)
    if not params:  # pragma: no cover
        raise RuntimeError("no trainable LoRA parameters; check target_modules against the model's module names")
    return model, params


def save_adapter(model, out: Path, folder: Path, stats: dict[str, Any]) -> None:
    """Write the PEFT folder and the stats into a temporary sibling, then rename it into place."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".tmp-{out.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        model.save_pretrained(str(tmp), safe_serialization=True)
        cfg_path = tmp / ADAPTER_CONFIG
        acfg = json.loads(cfg_path.read_text())
        acfg["base_model_name_or_path"] = str(folder)
        cfg_path.write_text(json.dumps(acfg, indent=2, sort_keys=True))
        missing = [f for f in ADAPTER_FILES if not (tmp / f).is_file()]
        if missing:  # pragma: no cover
            raise RuntimeError(f"peft did not write {missing}")
        # the weights' hash: an identical later run reuses this folder only while its bytes are intact
        stats["weights_sha256"] = file_sha256(tmp / ADAPTER_WEIGHTS)
        (tmp / STATS_FILE).write_text(json.dumps(stats, indent=2))
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

