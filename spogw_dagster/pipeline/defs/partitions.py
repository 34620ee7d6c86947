"""The one partitions definition all six assets share: "iteration", dynamic, zero-padded keys ("0000", ...).

Dynamic because the loop is open-ended: the sensor and `spogw run` add iteration k+1 when k is done (a UI
user can add a key from the launch dialog). Keys are zero-padded so that lexical and numeric order agree.
Dagster cannot express "iteration k reads the checkpoint of k-1" (a cycle at asset-key level,
dagster-io/dagster#13368); `checkpoints.parent_checkpoint` does that lookup imperatively.
"""

from __future__ import annotations

import dagster as dg

# the keys themselves are pure (the data layer needs them too); the assets import them from here
from spogw_dagster.pipeline.data.iteration_keys import KEY_WIDTH, iteration_key, key_to_int, previous_key

__all__ = ["PARTITIONS_NAME", "KEY_WIDTH", "iterations", "iteration_key", "key_to_int", "previous_key"]

PARTITIONS_NAME = "iteration"

iterations = dg.DynamicPartitionsDefinition(name=PARTITIONS_NAME)
