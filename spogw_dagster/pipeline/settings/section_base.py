"""What every config section shares: no unknown fields, frozen, and `drop_defaults` for the fields added after
configs were written (they keep their hashes)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


def drop_defaults(d: Any, **defaults: Any) -> Any:
    """A section's serialized dict without the fields that hold the value they had before the field existed:
    configs written earlier keep their hashes (and their assets)."""
    if isinstance(d, dict):
        for name, default in defaults.items():
            if name in d and d[name] == default and type(d[name]) is type(default):
                d.pop(name)
    return d


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
