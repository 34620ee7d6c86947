"""Iteration partition keys: zero-padded, so that lexical and numeric order agree ("0000", "0001", ...).

Pure, so the data layer can name iteration k-1 without the Dagster definitions (`defs/partitions.py` holds the
partitions definition itself)."""

from __future__ import annotations

KEY_WIDTH = 4


def iteration_key(k: int) -> str:
    if not isinstance(k, int) or isinstance(k, bool) or k < 0 or k >= 10**KEY_WIDTH:
        raise ValueError(f"iteration must be an integer in [0, {10**KEY_WIDTH}), got {k!r}")
    return f"{k:0{KEY_WIDTH}d}"


def key_to_int(key: str) -> int:
    if not isinstance(key, str) or len(key) != KEY_WIDTH or not key.isdigit():
        raise ValueError(f"iteration partition keys are {KEY_WIDTH} digits, e.g. '0000'; got {key!r}")
    return int(key)


def previous_key(key: str) -> str | None:
    k = key_to_int(key)
    return None if k == 0 else iteration_key(k - 1)
