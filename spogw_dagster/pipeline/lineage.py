"""The cross-iteration edge: iteration k samples from the checkpoint of iteration k-1.

Dagster cannot declare it (a cycle at asset-key level), so `sampled_workflows(k)` calls
`parent_checkpoint(store, k)` itself. At k = 0 there is no parent (the base model). Otherwise the adapter
folder `assets/lora_checkpoint/<k-1>/` must hold a complete PEFT adapter; if it does not, the lookup fails
fast with a message naming the missing partition and how to fix it, before any model is loaded or anything
is written. The parent's partition, path and adapter hash go into the metadata (and columns) of iteration k.
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
    missing = [f for f in ADAPTER_FILES if not (folder / f).is_file()]
    if missing:
        what = "does not exist" if not folder.exists() else f"lacks {', '.join(missing)}"
        raise MissingCheckpointError(
            f"iteration {partition} samples from the checkpoint of iteration {prev}, but lora_checkpoint[{prev}] "
            f"is missing: {folder} {what}. Materialize iteration {prev} first (all six assets, or at least "
            f"lora_checkpoint for partition {prev}); iterations must run in order."
        )
    return ParentCheckpoint(partition=prev, iteration=key_to_int(prev), path=folder, sha256=adapter_sha256(folder))
