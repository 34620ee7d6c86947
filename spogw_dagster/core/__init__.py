"""Core algorithms, free of Dagster: curation (Polars) and training objectives (torch).

Names are re-exported lazily so that `import spogw_dagster.core.curation` does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ConfigError": "hyperparams",
    "CurationConfig": "hyperparams",
    "ObjectiveConfig": "hyperparams",
    "CurationResult": "curation",
    "curate": "curation",
    "sample_preference_pairs": "curation",
    "LossBatch": "training.objectives",
    "LossOutput": "training.objectives",
    "compute_loss": "training.objectives",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{mod}"), name)
    globals()[name] = value
    return value
