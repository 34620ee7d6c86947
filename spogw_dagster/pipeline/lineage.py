"""The cross-iteration edge: iteration k samples from the checkpoint of iteration k-1.

Dagster cannot declare it (a cycle at asset-key level), so `sampled_workflows(k)` calls
`parent_checkpoint(store, k)` itself. At k = 0 there is no parent (the base model). Otherwise the adapter
folder `assets/lora_checkpoint/<k-1>/` must hold a complete PEFT adapter; if it does not, the lookup fails
fast with a message naming the missing partition and how to fix it, before any model is loaded or anything
is written. A folder whose weights are not the bytes `lora_checkpoint(k-1)` recorded (`adapter_sha256`) is
damaged (a bad disk, a partial copy, a hand edit) and fails the same way. The parent's partition, path and adapter hash go into the metadata (and columns) of iteration k.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..adapter_files import ADAPTER_FILES, ADAPTER_WEIGHTS
from ..fsutil import file_sha256
from .partitions import key_to_int, previous_key
from .storage import AssetStore



class MissingCheckpointError(RuntimeError):
    """The previous iteration's checkpoint is not there: iteration k cannot sample from π_{k-1}."""


def adapter_damage(store: AssetStore, partition: str) -> str | None:
    """Why lora_checkpoint[partition]'s adapter folder is not the one its table row records, or None when it is
    (or when there is no readable row to compare with: a missing partition is reported elsewhere)."""
    folder = store.adapter_dir(partition)
    missing = [f for f in ADAPTER_FILES if not (folder / f).is_file()]
    if missing:
        return f"{folder} {'does not exist' if not folder.exists() else 'lacks ' + ', '.join(missing)}"
    if not store.readable("lora_checkpoint", partition):
        return None
    rows = store.read_parquet("lora_checkpoint", partition)
    want = rows["adapter_sha256"][0] if rows.height and "adapter_sha256" in rows.columns else None
    got = adapter_sha256(folder)
    if want and got != want:
        return (f"{folder / ADAPTER_WEIGHTS} has sha256 {got[:16]}, not the {want[:16]} lora_checkpoint[{partition}] "
                "recorded (damaged or replaced)")
    return None


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
    damage = adapter_damage(store, prev)
    if damage:
        missing = not all((folder / f).is_file() for f in ADAPTER_FILES)
        raise MissingCheckpointError(
            f"iteration {partition} samples from the checkpoint of iteration {prev}, but lora_checkpoint[{prev}] "
            f"is {'missing' if missing else 'damaged'}: {damage}. "
            + (f"Materialize iteration {prev} first (all six assets, or at least lora_checkpoint for partition "
               f"{prev}); iterations must run in order." if missing else
               f"Rematerialize lora_checkpoint[{prev}] (`spogw run` does, resuming at it) and the iterations after "
               "it, or restore the adapter folder from a backup.")
        )
    return ParentCheckpoint(partition=prev, iteration=key_to_int(prev), path=folder, sha256=adapter_sha256(folder))
