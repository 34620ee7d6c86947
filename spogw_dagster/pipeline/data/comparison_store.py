"""Where objective_comparison keeps what each method made, under `<assets>/comparison/<k>/`: the method's adapter
(`<method>/`) and, for a method that samples and scores its own candidates (ScoreFlow's, W4S's turns), those
candidates (`<method>.candidates/`), kept whole or not at all, and reused only under the fingerprint they were
made with (sampling and scoring them takes hours on CPU; a failure in training or scoring after must not cost
them again). `spogw gc` (`runs/cleanup.py`) reads the same layout."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import polars as pl

from spogw_dagster.fsutil import replace_dir
from spogw_dagster.pipeline.data.storage import AssetStore

COMPARISON_DIR = "comparison"
CANDIDATES_SUFFIX = ".candidates"  # a method's own candidates, beside its adapter


def method_adapter_dir(store: AssetStore, key: str, name: str) -> Path:
    """Where method `name`'s adapter of partition `key` is written."""
    return store.root / COMPARISON_DIR / key / name


def own_data_dir(store: AssetStore, key: str, name: str) -> Path:
    """Where method `name` keeps its own sampled and scored candidates of partition `key` (beside its adapter):
    sampling and scoring them takes hours on CPU for W4S's turns, and must not be redone when training or
    held-out scoring fails after."""
    return store.root / COMPARISON_DIR / key / f"{name}{CANDIDATES_SUFFIX}"


def stored_own_data(folder: Path, fingerprint: str) -> tuple[pl.DataFrame, pl.DataFrame] | None:
    """The stored (sampled, scores) when they were made with this fingerprint, else None (missing, another
    config or parent, or unreadable: they are made again)."""
    try:
        if (folder / "fingerprint.json").read_text() != fingerprint:
            return None
        return pl.read_parquet(folder / "sampled.parquet"), pl.read_parquet(folder / "scores.parquet")
    except (OSError, pl.exceptions.PolarsError):
        return None


def store_own_data(folder: Path, fingerprint: str, sampled: pl.DataFrame, scores: pl.DataFrame) -> None:
    """Written whole or not at all: built in a temp folder, then swapped in."""
    tmp = folder.parent / f".tmp-{folder.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        sampled.write_parquet(tmp / "sampled.parquet")
        scores.write_parquet(tmp / "scores.parquet")
        (tmp / "fingerprint.json").write_text(fingerprint)
        replace_dir(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
