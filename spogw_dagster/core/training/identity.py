"""What makes two training runs the same run (config, data, base model, previous adapter, each hashed), and
finding an identical finished run to reuse instead of training again."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Sequence

from spogw_dagster.adapter_files import ADAPTER_CONFIG, ADAPTER_FILES, ADAPTER_WEIGHTS, STATS_FILE
from spogw_dagster.core.hyperparams import ConfigError
from spogw_dagster.core.training.config import TrainConfig
from spogw_dagster.core.training.examples import TrainExample
from spogw_dagster.fsutil import file_sha256
from spogw_dagster.models import check_adapter_folder, resolve_model


def sha(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def data_hash(examples: Sequence[TrainExample]) -> str:
    return sha([e.canonical() for e in examples])


def model_identity(folder: Path) -> dict[str, Any]:
    """What identifies the base model in the run hash: the GGUF's sha256 for a converted model, else the
    folder's config.json and its weight files' names and sizes (hashing GBs of weights every run is not worth it)."""
    marker = folder / "spogw_conversion.json"
    if marker.is_file():
        m = json.loads(marker.read_text())
        return {"gguf_sha256": m.get("gguf_sha256")}
    weights = sorted((p.name, p.stat().st_size) for p in folder.glob("*.safetensors"))
    return {"config_sha256": file_sha256(folder / "config.json"), "weights": weights}


def check_previous_matches(prev: Path, cfg: TrainConfig) -> None:
    pc = json.loads((prev / ADAPTER_CONFIG).read_text())
    theirs = (int(pc.get("r", -1)), float(pc.get("lora_alpha", -1)), sorted(pc.get("target_modules") or []))
    ours = (cfg.lora_r, float(cfg.lora_alpha), sorted(cfg.target_modules))
    if theirs != ours:
        raise ConfigError(
            f"init='continue' needs the previous adapter's LoRA shape; it has (r, alpha, target_modules)={theirs}, "
            f"the config {ours}; fix: set the config to match, or init='restart'"
        )


def identify_run(examples, cfg: TrainConfig, output_dir, base_model, previous_adapter):
    """The validated inputs of a run and what identifies it: (examples, output folder, base model folder,
    previous adapter folder or None, run_hashes)."""

    exs = [e if isinstance(e, TrainExample) else TrainExample.from_dict(e) for e in examples]
    if not exs:
        raise ValueError("no training examples; fix: check that curation kept at least one group")
    out = Path(output_dir).expanduser().resolve()
    folder = resolve_model(base_model)
    prev = check_adapter_folder(previous_adapter) if previous_adapter is not None else None
    if prev is not None and cfg.init == "continue":
        check_previous_matches(prev, cfg)
    return exs, out, folder, prev, run_hashes(cfg, exs, folder, prev)


def finished_run(examples, cfg: TrainConfig, output_dir, base_model, previous_adapter) -> dict[str, Any] | None:
    """The stats of the identical finished run in `output_dir` (what `train_lora` would reuse), else None."""
    _, out, _, _, hashes = identify_run(examples, cfg, output_dir, base_model, previous_adapter)
    return finished_run_stats(out, sha(hashes))


def run_hashes(cfg: TrainConfig, exs: Sequence[TrainExample], folder: Path, prev: Path | None) -> dict[str, Any]:
    """What identifies a training run: config, data, base model and previous adapter (each hashed). The forward
    path (`shared_prompt`) is not: both compute the same run."""
    return {
        "config": sha(cfg.identity()),
        "data": data_hash(exs),
        "base_model": sha(model_identity(folder)),
        "previous_adapter": file_sha256(prev / ADAPTER_WEIGHTS) if prev is not None else None,
    }


def finished_run_stats(out: Path, run_hash: str) -> dict[str, Any] | None:
    """The stats of a finished run with this hash in `out`, else None."""
    if not ((out / STATS_FILE).is_file() and all((out / f).is_file() for f in ADAPTER_FILES)):
        return None
    try:
        old_stats = json.loads((out / STATS_FILE).read_text())
    except ValueError:
        return None
    if old_stats.get("run_hash") != run_hash or old_stats.get("weights_sha256") != file_sha256(out / ADAPTER_WEIGHTS):
        return None  # another run, or damaged weights: train again
    return old_stats

