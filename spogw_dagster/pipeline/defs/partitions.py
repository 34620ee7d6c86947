"""The one partitions definition all six assets share: "iteration", dynamic, zero-padded keys ("0000", ...).

Dynamic because the loop is open-ended: the sensor and `spogw run` add iteration k+1 when k is done (a UI
user can add a key from the launch dialog). Keys are zero-padded so that lexical and numeric order agree.
Dagster cannot express "iteration k reads the checkpoint of k-1" (a cycle at asset-key level,
dagster-io/dagster#13368); `checkpoints.parent_checkpoint` does that lookup imperatively.
"""

from __future__ import annotations

import dagster as dg

PARTITIONS_NAME = "iteration"
KEY_WIDTH = 4

iterations = dg.DynamicPartitionsDefinition(name=PARTITIONS_NAME)


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
