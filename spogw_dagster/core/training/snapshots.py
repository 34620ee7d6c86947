"""Epoch snapshots: the shorter runs a longer run passes through, saved on the way.

With a constant learning rate (warmup included: it counts steps, not the run's length) the adapter after
epoch e of an E-epoch run *is* the e-epoch run: the data order is seeded per epoch, and the optimizer state and
the dropout draws up to epoch e are the same; nothing before epoch e depends on E. So it is saved as that run
(its run hash, steps and, with `eval_after`, its own after pass), and `train_lora` reuses it like any finished
run: training 2 and 3 epochs costs 3 epochs. Under a decaying schedule the LR at step t depends on E, so there is
no snapshot and the caller trains that length on its own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from spogw_dagster.core.training.config import TrainConfig
from spogw_dagster.core.training.examples import TrainExample
from spogw_dagster.core.training.identity import run_hashes, sha

__all__ = ["exact", "Snapshot", "plan"]


def exact(cfg: TrainConfig) -> bool:
    """Whether the state after a shorter number of epochs is exactly the shorter run of `cfg`."""
    return cfg.lr_scheduler == "constant"


@dataclass(frozen=True)
class Snapshot:
    """One shorter run to save when its last epoch ends: where, and what identifies it."""

    out: Path
    hashes: dict[str, Any]

    @property
    def run_hash(self) -> str:
        return sha(self.hashes)


def plan(snapshots: Mapping[int, str | os.PathLike[str]] | None, cfg: TrainConfig, exs: Sequence[TrainExample],
         folder: Path, prev: Path | None) -> dict[int, Snapshot]:
    """The snapshots to save: lengths shorter than cfg.epochs, when exact. Not filtered by what is on disk: with
    several processes each rank plans for itself, and the after pass at a snapshot is collective, so every rank
    must reach the same plan (a caller leaves out lengths it already has)."""
    if not snapshots or not exact(cfg):
        return {}
    out: dict[int, Snapshot] = {}
    for e, path in ((int(e), p) for e, p in snapshots.items()):
        if 1 <= e < cfg.epochs:
            out[e] = Snapshot(Path(path).expanduser().resolve(), run_hashes(replace(cfg, epochs=e), exs, folder, prev))
    return out
