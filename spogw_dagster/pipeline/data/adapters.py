"""Checkpoints when there is nothing to train on.

If no group survives screening (common with a 135M generator: every workflow of a query scores the same),
iteration k has no training data. The loop still needs a checkpoint for k+1 to sample from, so the parent
policy is carried forward unchanged: a copy of lora_checkpoint(k-1), or at k = 0 a freshly initialised LoRA
whose B matrices are zero (exactly the base model). The folder is written atomically like the trainer's and
its training_stats.json says `"trained": false` and why; the asset's metadata and table say so too.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from spogw_dagster.adapter_files import ADAPTER_CONFIG, STATS_FILE
from spogw_dagster.fsutil import replace_dir


def carry_forward(out: str | os.PathLike[str], parent: str | os.PathLike[str] | None, tcfg, base_model: str,
                  reason: str) -> dict[str, Any]:
    """Write the parent's adapter (or an identity LoRA at k = 0) to `out`; returns its stats."""
    out = Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".tmp-{out.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    stats: dict[str, Any] = {
        "trained": False, "reason": reason, "previous_adapter": str(parent) if parent else None,
        "config": tcfg.to_dict(), "steps": [], "summary": {"optimizer_steps": 0},
        "run_hash": None,
    }
    try:
        if parent is not None:
            shutil.copytree(parent, tmp)
            (tmp / STATS_FILE).unlink(missing_ok=True)
        else:
            _identity_adapter(tmp, tcfg, base_model)
        (tmp / STATS_FILE).write_text(json.dumps(stats, indent=2))
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return stats


def _identity_adapter(folder: Path, tcfg, base_model: str) -> None:
    import torch
    from peft import LoraConfig, get_peft_model

    from spogw_dagster.models import load_model_and_tokenizer, resolve_model

    model, _ = load_model_and_tokenizer(base_model, dtype=tcfg.dtype)
    torch.manual_seed(tcfg.seed)
    lcfg = LoraConfig(r=tcfg.lora_r, lora_alpha=tcfg.lora_alpha, lora_dropout=tcfg.lora_dropout,
                      target_modules=list(tcfg.target_modules), bias="none", task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, lcfg)  # LoRA B = 0: the adapted model equals the base model
    peft_model.save_pretrained(str(folder), safe_serialization=True)
    cfg_path = folder / ADAPTER_CONFIG
    acfg = json.loads(cfg_path.read_text())
    acfg["base_model_name_or_path"] = str(resolve_model(base_model))
    cfg_path.write_text(json.dumps(acfg, indent=2, sort_keys=True))
