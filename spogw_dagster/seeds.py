"""Seeds derived from named parts, stable across processes and Python versions (no `hash()` salt)."""

from __future__ import annotations

import hashlib
from typing import Any


def derive_seed(*parts: Any) -> int:
    """A 31-bit seed (fits every backend's seed type, llama.cpp's included) from the parts' text."""
    h = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(h[:4], "big") & 0x7FFFFFFF
