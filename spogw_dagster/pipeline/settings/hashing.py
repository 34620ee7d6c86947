"""What a config's hashes cover. `config_hash` is the sha256 of the canonical JSON of the whole config, less
what changes no asset's output; `sections_hash` covers only the sections an asset reads (`read_sections` of
what its module declares; its code version uses it, so changing e.g. the report's baselines does not make the
sampled workflows stale; `pipeline/defs/versions.py::section_hash` looks an asset's sections up by its name). Fields added after
configs were written are left out at their old value (`section_base.drop_defaults`): those configs keep their
hashes, and so their assets."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

from spogw_dagster.pipeline.settings.sections import ExecutorSection

# `cfg` below is a `config.SpogwConfig` (not imported: config.py imports this module for `SpogwConfig.hash`).


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


def read_sections(cfg, always: tuple[str, ...], when_on: Mapping[str, tuple[str, ...]]) -> tuple[str, ...]:
    """The sections an asset reads under `cfg`: `always`, plus `when_on[s]` for each section `s` that is on
    (`cfg.<s>.enabled`). Each asset module declares both beside itself (`SECTIONS`, `SECTIONS_WHEN_ON`)."""
    return always + tuple(x for s, extra in when_on.items() if getattr(cfg, s).enabled for x in extra)


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


def sections_hash(cfg, sections: tuple[str, ...]) -> str:
    """The hash of `sections` of the config as hashed (order and repeats do not matter)."""
    d = _hashed(cfg)
    return hashlib.sha256(_canon_json({s: d[s] for s in sections if s in d}).encode()).hexdigest()
