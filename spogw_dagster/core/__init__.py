"""Core algorithms, free of Dagster: curation (Polars) and training objectives (torch).

Names are re-exported lazily so that `import spogw_dagster.core.curation` does not import torch.
"""

from __future__ import annotations

from spogw_dagster.lazy_exports import lazy_getattr

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


__getattr__ = lazy_getattr(__name__, _EXPORTS, globals())
