"""What a config's hashes cover. `config_hash` is the sha256 of the canonical JSON of the whole config, less
what changes no asset's output; `section_hash` covers only the sections an asset depends on (its code version
uses it, so changing e.g. the report's baselines does not make the sampled workflows stale). Fields added after
configs were written are left out at their old value (`section_base.drop_defaults`): those configs keep their
hashes, and so their assets."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from spogw_dagster.pipeline.settings.sections import ExecutorSection

# `cfg` below is a `config.SpogwConfig` (not imported: config.py imports this module for `SpogwConfig.hash`).


# Sections each asset's output depends on (its code version and `section_hash` use them).
ASSET_SECTIONS: dict[str, tuple[str, ...]] = {
    "sampled_workflows": ("benchmark", "generator", "curation", "refinement"),
    "execution_scores": ("benchmark", "executor", "execution", "reward"),
    "screened_groups": ("curation",),
    "sharpened_groups": ("curation",),
    "lora_checkpoint": ("generator", "training"),
    "benchmark_report": ("benchmark", "generator", "executor", "execution", "reward", "report"),
    "objective_comparison": ("benchmark", "generator", "executor", "execution", "reward", "curation", "training",
                             "report", "comparison"),
}


def _canon_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def config_hash(cfg) -> str:
    d = _hashed(cfg)
    # Neither changes what any asset computes: the profile is a name, `iterations` only how far the loop goes.
    d.pop("profile", None)
    d.pop("iterations", None)
    d.pop("loop", None)  # whether the sensor starts running changes no asset's output
    d.pop("comparison", None)  # only objective_comparison reads it (its code version covers it); what it
    # reserves of the validation split reaches the report and the gate through _hashed
    return hashlib.sha256(_canon_json(d).encode()).hexdigest()


def asset_sections(cfg, asset: str) -> tuple[str, ...]:
    """The sections `asset` reads under `cfg`: with refinement on, sampling also runs workflows for feedback."""
    if asset == "sampled_workflows" and cfg.refinement.enabled:
        return ASSET_SECTIONS[asset] + ("executor", "execution", "reward")
    if asset == "lora_checkpoint" and cfg.selection.enabled:  # the gate runs the executor on validation,
        # whose queries W4S's feedback may reserve (the count, from refinement or comparison, is in `selection`)
        return ASSET_SECTIONS[asset] + ("selection", "benchmark", "executor", "execution", "reward", "refinement")
    return ASSET_SECTIONS[asset]


def _hashed(cfg) -> dict[str, Any]:
    """The canonical config as hashed: refinement left out while it is off, so configs written before it
    existed keep their hashes (and their assets)."""
    d = cfg.canonical()
    if not cfg.refinement.enabled:
        d.pop("refinement", None)
    if not cfg.selection.enabled:  # the same for selection: earlier configs keep their hashes
        d.pop("selection", None)
    # The validation split less W4S's feedback queries is what the gate, a validation report and the comparison
    # score; the count can come from `comparison`, which no asset but objective_comparison hashes. Only a
    # non-zero count is written, so every config that reserves nothing keeps its hash.
    for section, split in (("selection", "validation"), ("report", cfg.report.split),
                           ("comparison", cfg.comparison.split)):
        if section in d and (reserved := cfg.reserved_validation(split)):
            d[section]["reserved_validation"] = reserved
    d["training"].pop("processes", None)  # how the adapter is computed, not what (TrainingSection)
    d["training"].pop("shared_prompt", None)  # the same: how a batch is computed (core/device_paths.py)
    d["executor"] = executor_identity(d["executor"])
    return d


def executor_identity(executor: dict[str, Any]) -> dict[str, Any]:
    """The canonical executor section (`cfg.canonical()["executor"]`) as hashes see it. Where the call cache
    lives is storage, not configuration: `--seeds` points every seed at one shared file, so with the path hashed
    a copied or moved `--seeds` run got another hash and redid finished iterations (and missed its cached
    baselines). It counts as the default, so runs that never set it keep their hashes. The speed levers
    (`stop_after_code`, `reproducible`) are written only when they differ from their defaults: every config
    written before them keeps its hash and its cached baselines."""
    out = {**executor, "cache_file": ExecutorSection.model_fields["cache_file"].default}
    for lever in ("stop_after_code", "reproducible"):
        if out.get(lever) == ExecutorSection.model_fields[lever].default:
            out.pop(lever, None)
    return out


def section_hash(cfg, asset: str) -> str:
    d = _hashed(cfg)
    return hashlib.sha256(_canon_json({s: d[s] for s in asset_sections(cfg, asset) if s in d}).encode()).hexdigest()
