"""Every seed the project derives, in one place: stable across processes and Python versions (no `hash()`
salt), and each a function of named parts so that a rerun draws the same and another iteration, query or
sample draws anew.

Three encodings exist because each seeds data that is already stored (sampled workflows, groups, pairs):
changing one would change every such table of existing assets and their reruns. New code uses `derive_seed`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

__all__ = ["derive_seed", "sampler_seed", "offset_seed"]


def derive_seed(*parts: Any, bits: int = 31) -> int:
    """A `bits`-bit seed from the parts' text (sha256 of the parts joined by \\x1f, big-endian). 31 bits fit
    every backend's seed type, llama.cpp's included; curation's group draw uses 64."""
    h = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(h[: (bits + 7) // 8], "big") & ((1 << bits) - 1)


def sampler_seed(*parts: Any) -> int:
    """The generator's sampling seeds (a batch's, a row's): a 63-bit seed from the parts as JSON."""
    h = hashlib.sha256(json.dumps(parts, default=str).encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


def offset_seed(seed: int, k: int) -> int:
    """Draw k of a series seeded by `seed` (an epoch's batch order, an iteration's pair draw): another draw for
    each k, the same on a rerun."""
    return int(seed) * 1_000_003 + int(k)
