"""Typed, validated configuration of the pipeline, and its hashes, by concern:

    sections.py       the pipeline's own sections (benchmark, generator, executor, execution, report, ...)
    core_sections.py  reward, curation and training: derived from the core's dataclasses, each field declared once
    config.py         `SpogwConfig`, the whole config, and the rules that span sections
    hashing.py        `config_hash`, `sections_hash`: what a run's and an asset's config hashes cover
    loading.py        `load_config`: profile, then YAML, then overrides; `ConfigValidationError`

One `SpogwConfig` describes a whole run of the loop: the benchmark and its splits, the generator (the model
being trained), the executor (the model the workflows call), how workflows are executed and rewarded,
curation (m, n, t, ...), LoRA training, the held-out report and the number of iterations.

It is plain pydantic (no Dagster) so that the CLI, tests and the Dagster resources share it. Profiles
(`profiles.py`) are partial mappings over the defaults; a YAML file may name a `profile:` to start from and
override any field. Every error names the field and the fix (`ConfigValidationError`). The training-core
configs (`CurationConfig`, `TrainConfig`) validate again on construction, so their rules (m >= n >= 2t,
beta >= 0, ...) are enforced here too, with their own messages.
"""

from __future__ import annotations

from spogw_dagster.pipeline.settings.config import SpogwConfig
from spogw_dagster.pipeline.settings.hashing import config_hash, executor_identity, read_sections, sections_hash
from spogw_dagster.pipeline.settings.loading import ConfigValidationError, deep_merge, load_config, parse_config
from spogw_dagster.pipeline.settings.sections import ReportSection

__all__ = [
    "ConfigValidationError",
    "SpogwConfig",
    "load_config",
    "parse_config",
    "deep_merge",
    "config_hash",
    "sections_hash",
    "read_sections",
    "executor_identity",
    "ReportSection",
]
