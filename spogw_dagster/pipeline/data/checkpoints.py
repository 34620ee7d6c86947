"""Checkpoints: the adapter of each iteration, how iteration k finds its parent, and what is written when there
is nothing to train on.

**The cross-iteration edge.** Iteration k samples from the checkpoint of iteration k-1.

Dagster cannot declare it (a cycle at asset-key level), so `sampled_workflows(k)` calls
`parent_checkpoint(store, k)` itself. At k = 0 there is no parent (the base model). Otherwise the adapter
folder `assets/lora_checkpoint/<k-1>/` must hold a complete PEFT adapter; if it does not, the lookup fails
fast with a message naming the missing partition and how to fix it, before any model is loaded or anything
is written. A folder whose weights are not the bytes `lora_checkpoint(k-1)` recorded (`adapter_sha256`) is
damaged (a bad disk, a partial copy, a hand edit) and fails the same way. The parent's partition, path and
adapter hash go into the metadata (and columns) of iteration k.

**When there is nothing to train on.** If no group survives screening (common with a 135M generator: every workflow of a query scores the same),
iteration k has no training data. The loop still needs a checkpoint for k+1 to sample from, so the parent
policy is carried forward unchanged: a copy of lora_checkpoint(k-1), or at k = 0 a freshly initialised LoRA
whose B matrices are zero (exactly the base model). The folder is written atomically like the trainer's and
its training_stats.json says `"trained": false` and why; the asset's metadata and table say so too.

The adapter's file names are `spogw_dagster.adapter_files` (the core's trainer writes the same folder).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spogw_dagster.adapter_files import ADAPTER_FILES, ADAPTER_WEIGHTS, STATS_FILE
from spogw_dagster.core.training import lora_config, save_adapter
from spogw_dagster.fsutil import file_sha256, replace_dir
from spogw_dagster.models import load_model_and_tokenizer, resolve_model
from spogw_dagster.pipeline.data.iteration_keys import key_to_int, previous_key
from spogw_dagster.pipeline.data.storage import AssetStore

TRAINED_SUFFIX = ".trained"


class MissingCheckpointError(RuntimeError):
    """The previous iteration's checkpoint is not there: iteration k cannot sample from π_{k-1}."""


def _missing_files(folder: Path) -> str | None:
    missing = [f for f in ADAPTER_FILES if not (folder / f).is_file()]
    if not missing:
        return None
    return f"{folder} {'does not exist' if not folder.exists() else 'lacks ' + ', '.join(missing)}"


def recorded_adapter_sha256(store: AssetStore, partition: str) -> str | None:
    """The weights' sha256 lora_checkpoint[partition]'s row records (None without a readable row)."""
    if not store.readable("lora_checkpoint", partition):
        return None
    rows = store.read_parquet("lora_checkpoint", partition)
    return rows["adapter_sha256"][0] if rows.height and "adapter_sha256" in rows.columns else None


def weights_mismatch(folder: Path, got: str, recorded: str | None, partition: str) -> str | None:
    """Why an adapter folder whose weights hash to `got` is not the one lora_checkpoint[partition] recorded."""
    if recorded and got != recorded:
        return (f"{folder / ADAPTER_WEIGHTS} has sha256 {got[:16]}, not the {recorded[:16]} "
                f"lora_checkpoint[{partition}] recorded (damaged or replaced)")
    return None


def adapter_damage(store: AssetStore, partition: str) -> str | None:
    """Why lora_checkpoint[partition]'s adapter folder is not the one its table row records, or None when it is
    (or when there is no readable row to compare with: a missing partition is reported elsewhere)."""
    folder = store.adapter_dir(partition)
    return _missing_files(folder) or weights_mismatch(folder, adapter_sha256(folder),
                                                      recorded_adapter_sha256(store, partition), partition)


@dataclass(frozen=True)
class ParentCheckpoint:
    partition: str
    iteration: int
    path: Path
    sha256: str

    def as_metadata(self) -> dict[str, str | int]:
        return {"partition": self.partition, "path": str(self.path), "adapter_sha256": self.sha256}


def adapter_sha256(folder: Path) -> str:
    return file_sha256(Path(folder) / ADAPTER_WEIGHTS)


def parent_checkpoint(store: AssetStore, partition: str) -> ParentCheckpoint | None:
    """The checkpoint iteration `partition` samples from: None at iteration 0 (the base model)."""
    prev = previous_key(partition)
    if prev is None:
        return None
    folder = store.adapter_dir(prev)
    missing = _missing_files(folder)
    if missing:
        raise MissingCheckpointError(
            f"iteration {partition} samples from the checkpoint of iteration {prev}, but lora_checkpoint[{prev}] "
            f"is missing: {missing}. Materialize iteration {prev} first (all six assets, or at least "
            f"lora_checkpoint for partition {prev}); iterations must run in order.")
    sha = adapter_sha256(folder)  # hashed once: the check below and the lineage record
    damaged = weights_mismatch(folder, sha, recorded_adapter_sha256(store, prev), prev)
    if damaged:
        raise MissingCheckpointError(
            f"iteration {partition} samples from the checkpoint of iteration {prev}, but lora_checkpoint[{prev}] "
            f"is damaged: {damaged}. Rematerialize lora_checkpoint[{prev}] (`spogw run` does, resuming at it) and "
            "the iterations after it, or restore the adapter folder from a backup.")
    return ParentCheckpoint(partition=prev, iteration=key_to_int(prev), path=folder, sha256=sha)


def carry_forward(out: str | os.PathLike[str], parent: str | os.PathLike[str] | None, tcfg, base_model: str,
                  reason: str) -> dict[str, Any]:
    """Write the parent's adapter (or an identity LoRA at k = 0) to `out`; returns its stats."""
    out = Path(out).resolve()
    stats: dict[str, Any] = {
        "trained": False, "reason": reason, "previous_adapter": str(parent) if parent else None,
        "config": tcfg.to_dict(), "steps": [], "summary": {"optimizer_steps": 0},
        "run_hash": None,
    }
    if parent is None:  # the trainer's own fresh LoRA (B = 0) and its atomic save
        _identity_adapter(out, tcfg, base_model, stats)
        return stats
    copy_adapter(parent, out, stats)
    return stats


def copy_adapter(src: str | os.PathLike[str], out: str | os.PathLike[str], stats: dict[str, Any] | None = None) -> None:
    """Copy the adapter folder `src` to `out` atomically; with `stats`, the copy's training_stats.json is `stats`."""
    out = Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".tmp-{out.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        shutil.copytree(src, tmp)
        if stats is not None:
            (tmp / STATS_FILE).unlink(missing_ok=True)
            (tmp / STATS_FILE).write_text(json.dumps(stats, indent=2))
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def trained_dir(store: AssetStore, partition: str, epochs: int | None = None) -> Path:
    """Where iteration `partition` trains when checkpoint selection is on: beside its checkpoint folder, so a
    rejected adapter is kept (and a rerun reuses it) while the parent is carried forward as the checkpoint.
    `epochs`: a training length other than training.epochs that the gate also tries (`<k>.trained.e<N>`)."""
    name = partition + TRAINED_SUFFIX + ("" if epochs is None else f".e{epochs}")
    return store.adapter_dir(partition).with_name(name)


def folder_partition(name: str) -> str | None:
    """The partition an adapter folder of lora_checkpoint belongs to (`<k>`, `<k>.trained`, `<k>.trained.e<N>`);
    None for any other name."""
    m = re.fullmatch(r"([^.]+)(?:" + re.escape(TRAINED_SUFFIX) + r"(?:\.e\d+)?)?", name)
    return m.group(1) if m else None


def _identity_adapter(out: Path, tcfg, base_model: str, stats: dict[str, Any]) -> None:
    """A fresh LoRA exactly as the trainer starts one (seeded; B = 0, so it is the base model), saved as the
    trainer saves (atomically, with its stats and the weights' hash)."""
    import torch  # heavy: this module loads at every `spogw` start-up
    from peft import get_peft_model  # heavy: this module loads at every `spogw` start-up

    model, _ = load_model_and_tokenizer(base_model, dtype=tcfg.dtype)
    torch.manual_seed(tcfg.seed)
    save_adapter(get_peft_model(model, lora_config(tcfg)), out, resolve_model(base_model), stats)
