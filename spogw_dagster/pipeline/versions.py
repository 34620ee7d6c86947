"""Code versions of the assets: a hash of the source files each asset's output depends on plus the config
sections it reads (`config.ASSET_SECTIONS`). Dagster shows earlier partitions as stale ("code version
changed") when either changes."""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

from .config import SpogwConfig, section_hash

_PKG = Path(__file__).resolve().parent.parent  # spogw_dagster/
_SANDBOX = _PKG.parent / "sandbox"

_COMMON = ["pipeline/assets.py", "pipeline/tables.py", "pipeline/storage.py", "pipeline/io.py", "types.py",
           "seeds.py"]
ASSET_CODE: dict[str, list[str]] = {
    "sampled_workflows": ["core/sampling.py", "models.py", "workflow/template.py", "workflow/parser.py",
                          "pipeline/lineage.py"],
    "execution_scores": ["evaluation.py", "workflow/*.py", "executors/*.py", "benchmarks/*.py", "isolation.py", "cgroups.py",
                         "seccomp.py", "docker_sandbox.py", "pipeline/rewards.py", "pipeline/resources.py",
                         "@sandbox/*.py"],
    "screened_groups": ["core/curation.py", "core/config.py"],
    "sharpened_groups": ["core/curation.py", "core/config.py"],
    "lora_checkpoint": ["core/trainer.py", "core/objectives.py", "core/logprobs.py", "core/config.py", "models.py",
                        "pipeline/adapters.py", "fsutil.py"],
    "benchmark_report": ["evaluation.py", "workflow/*.py", "executors/*.py", "benchmarks/*.py", "isolation.py", "cgroups.py",
                         "seccomp.py", "docker_sandbox.py", "core/sampling.py", "core/stats.py", "models.py",
                         "pipeline/heldout.py", "pipeline/rewards.py", "pipeline/resources.py", "@sandbox/*.py"],
}


@lru_cache(maxsize=None)
def source_hash(asset: str) -> str:
    h = hashlib.sha256()
    for pattern in _COMMON + ASSET_CODE[asset]:
        base, pat = (_SANDBOX, pattern[len("@sandbox/"):]) if pattern.startswith("@sandbox/") else (_PKG, pattern)
        for p in sorted(base.glob(pat)):
            if p.is_file():
                h.update(str(p.relative_to(base)).encode())
                h.update(p.read_bytes())
    return h.hexdigest()


def code_version(asset: str, cfg: SpogwConfig) -> str:
    return hashlib.sha256((source_hash(asset) + section_hash(cfg, asset)).encode()).hexdigest()[:16]
