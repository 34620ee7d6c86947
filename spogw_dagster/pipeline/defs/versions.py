"""Code versions of the assets: a hash of every source file an asset's module imports, transitively (module-level
and function-level imports inside the package, read from the source, so nothing is kept by hand), plus the
files of sandbox/ those modules run instead of importing (each such module says which: `SANDBOX_FILES`), plus
the config sections the asset reads (its module's `SECTIONS` and `SECTIONS_WHEN_ON`). Dagster shows earlier
partitions as stale ("code version changed") when either changes.

Both declarations are read from the source, as the imports are, by the asset's name: any module may ask for an
asset's sections without importing its module (assets are leaves: objective_comparison hashes the sections of
the two assets whose work it redoes).

The closure is deliberately generous: the resource that hands every asset its services imports the executors,
the sandbox and the sampler lazily, so most assets cover most of the package. A version that changes too often
costs a rerun; one that misses a file would hide stale data.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
from functools import lru_cache
from pathlib import Path

from spogw_dagster.pipeline.settings import SpogwConfig, read_sections, sections_hash

_PKG = Path(__file__).resolve().parents[2]  # spogw_dagster/
_ROOT = _PKG.parent
_NAME = _PKG.name

@lru_cache(maxsize=None)
def sandbox_dir() -> Path:
    """Where the sandbox's scripts are: the installed `spogw_sandbox` package (found without importing it) in a
    wheel install, else `sandbox/` beside the package (a source checkout). A non-editable install has no
    `sandbox/` beside site-packages' spogw_dagster, so globbing there found nothing and the code versions
    missed the sandbox runner."""
    spec = importlib.util.find_spec("spogw_sandbox")
    locs = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(locs[0]).resolve() if locs else _ROOT / "sandbox"


def _label(p: Path) -> str:
    """A file's name in the hash: the same whether the sandbox is a checkout's folder or an installed package."""
    sb = sandbox_dir()
    return f"sandbox/{p.relative_to(sb)}" if p.is_relative_to(sb) else str(p.relative_to(_ROOT))


def _module_file(name: str) -> Path | None:
    parts = name.split(".")
    if parts[0] != _NAME:
        return None
    p = _ROOT.joinpath(*parts)
    if (p / "__init__.py").is_file():
        return p / "__init__.py"
    return p.with_suffix(".py") if p.with_suffix(".py").is_file() else None


@lru_cache(maxsize=None)
def _imported_names(path: Path) -> tuple[str, ...]:
    """Every module name an import statement in `path` may refer to (`from a import b` gives a and a.b).
    Cached: the asset modules' closures share most files, and parsing is what definitions loading pays for."""
    rel = path.relative_to(_ROOT).with_suffix("")
    package = list(rel.parts[:-1])
    names: list[str] = []
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            names += [base] + [f"{base}.{a.name}" for a in node.names]
    if path.name == "__init__.py":  # a package's lazy re-exports (`lazy_exports.py`) are imports too
        here = ".".join(rel.parts[:-1])
        for node in tree.body:
            if (isinstance(node, ast.Assign) and any(isinstance(x, ast.Name) and x.id == "_EXPORTS" for x in node.targets)
                    and isinstance(node.value, ast.Dict)):
                names += [f"{here}.{v.value}" for v in node.value.values if isinstance(v, ast.Constant)]
    return tuple(names)


@lru_cache(maxsize=None)
def import_closure(module: str) -> tuple[str, ...]:
    """Source files (relative to the package) that `module` imports, transitively, itself included; a
    submodule brings its packages' __init__ files."""
    seen: set[Path] = set()
    todo = [_module_file(module)]
    while todo:
        path = todo.pop()
        if path is None or path in seen:
            continue
        seen.add(path)
        for name in _imported_names(path):
            parts = name.split(".")
            todo += [_module_file(".".join(parts[:i])) for i in range(1, len(parts) + 1)]
    return tuple(sorted(str(p.relative_to(_PKG)) for p in seen))


@lru_cache(maxsize=None)
def _constants(path: Path) -> dict[str, object]:
    """The module-level constants of a source file that are literals (`NAME = ...`), read without importing it."""
    out: dict[str, object] = {}
    for node in ast.parse(path.read_text()).body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and node.value is not None:
            try:
                out[target.id] = ast.literal_eval(node.value)
            except ValueError:  # not a literal (a call, a name): not a declaration
                pass
    return out


def sandbox_files(rel: str) -> str | None:
    """The glob of sandbox/ files that the package's module `rel` (e.g. "sandboxing/images.py") runs without
    importing them: its `SANDBOX_FILES`, or None."""
    glob = _constants(_PKG / rel).get("SANDBOX_FILES")
    return glob if isinstance(glob, str) else None


def _asset_module(asset: str) -> str:
    return f"{_NAME}.pipeline.defs.assets.{asset}"


def asset_files(asset: str) -> list[Path]:
    """Every file whose content is part of `asset`'s code version."""
    files = [_PKG / f for f in import_closure(_asset_module(asset))]
    for rel in import_closure(_asset_module(asset)):
        if (glob := sandbox_files(rel)) is not None:
            files += sorted(p for p in sandbox_dir().glob(glob) if p.is_file())
    return sorted(set(files))


def declared_sections(asset: str) -> tuple[tuple[str, ...], dict[str, tuple[str, ...]]]:
    """The config sections `asset`'s module declares it reads: `SECTIONS` always, and `SECTIONS_WHEN_ON[s]`
    while section `s` is on."""
    consts = _constants(_module_file(_asset_module(asset)))
    return tuple(consts["SECTIONS"]), dict(consts.get("SECTIONS_WHEN_ON", {}))


def section_hash(cfg: SpogwConfig, asset: str) -> str:
    """The hash of the config sections `asset` reads under `cfg` (its materializations' `config_section_hash`)."""
    return sections_hash(cfg, read_sections(cfg, *declared_sections(asset)))


@lru_cache(maxsize=None)
def source_hash(asset: str) -> str:
    h = hashlib.sha256()
    for p in asset_files(asset):
        h.update(_label(p).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def code_version(asset: str, cfg: SpogwConfig) -> str:
    return hashlib.sha256((source_hash(asset) + section_hash(cfg, asset)).encode()).hexdigest()[:16]
