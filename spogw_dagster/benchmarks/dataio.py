"""Reading benchmark files, with errors that name the benchmark, the file and what is wrong.

Every loader goes through these helpers so that a user who points us at the wrong file gets one clear
message (which file, which line or record, what was expected) instead of a KeyError deep in a loader.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Iterator


class BenchmarkDataError(ValueError):
    """A benchmark file is missing, unreadable or not in the expected format."""


class BenchmarkFileNotFoundError(BenchmarkDataError, FileNotFoundError):
    """A path-based benchmark was asked for without a path, or the path does not exist."""


def resolve_data_path(
    benchmark: str,
    path: str | Path | None,
    *,
    file_format: str,
    standard_names: tuple[str, ...],
) -> Path:
    """Return the file to read for a benchmark that ships in no package.

    `path` may be the file itself or a directory holding it under one of its standard names.
    """
    how = (
        f"pass its path: `--data-path /path/to/{standard_names[0]}` on the spogw CLI, `benchmark.data_path` in "
        f"a pipeline config, or load_benchmark({benchmark!r}, path=...) from Python "
        f"(a directory holding one of {', '.join(standard_names)} also works)"
    )
    if path is None:
        raise BenchmarkFileNotFoundError(
            f"benchmark {benchmark!r} ships in no package, so it needs a data file: {file_format}. "
            f"Download the standard file and {how}."
        )
    p = Path(path).expanduser()
    if p.is_dir():
        for name in standard_names:
            if (p / name).is_file():
                return p / name
        raise BenchmarkFileNotFoundError(
            f"benchmark {benchmark!r}: directory {p} holds none of {', '.join(standard_names)}; "
            f"expected {file_format}; {how}."
        )
    if not p.is_file():
        raise BenchmarkFileNotFoundError(
            f"benchmark {benchmark!r}: data file {p} does not exist; expected {file_format}; {how}."
        )
    return p


def _open_text(path: Path):
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, "r", encoding="utf-8")


def iter_jsonl(path: Path, benchmark: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (line number, record) for each non-blank line; bad JSON or a non-object raises."""
    try:
        with _open_text(path) as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise BenchmarkDataError(
                        f"benchmark {benchmark!r}: {path} line {lineno} is not valid JSON ({e.msg}); "
                        "expected one JSON object per line (JSON Lines)"
                    ) from None
                if not isinstance(rec, dict):
                    raise BenchmarkDataError(
                        f"benchmark {benchmark!r}: {path} line {lineno} is a JSON {type(rec).__name__}, "
                        "expected a JSON object per line"
                    )
                yield lineno, rec
    except UnicodeDecodeError as e:
        raise BenchmarkDataError(f"benchmark {benchmark!r}: {path} is not UTF-8 text ({e.reason})") from None
    except (OSError, EOFError) as e:
        if isinstance(e, FileNotFoundError):
            raise BenchmarkFileNotFoundError(f"benchmark {benchmark!r}: {path} does not exist") from None
        raise BenchmarkDataError(f"benchmark {benchmark!r}: cannot read {path}: {e}") from None


def read_json(path: Path, benchmark: str, expected: str, top: type | None = None) -> Any:
    """Read a whole JSON document; errors name the file and the expected format.

    top: the type the document must be at its top level (dict or list), checked here for every loader."""
    try:
        with _open_text(path) as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise BenchmarkDataError(
            f"benchmark {benchmark!r}: {path} is not valid JSON (line {e.lineno}: {e.msg}); expected {expected}"
        ) from None
    except UnicodeDecodeError as e:
        raise BenchmarkDataError(f"benchmark {benchmark!r}: {path} is not UTF-8 text ({e.reason})") from None
    except FileNotFoundError:
        raise BenchmarkFileNotFoundError(f"benchmark {benchmark!r}: {path} does not exist") from None
    except (OSError, EOFError) as e:
        raise BenchmarkDataError(f"benchmark {benchmark!r}: cannot read {path}: {e}") from None
    if top is not None and not isinstance(data, top):
        raise BenchmarkDataError(
            f"benchmark {benchmark!r}: {path} holds a JSON {type(data).__name__}; expected {expected}"
        )
    return data


def require(rec: dict[str, Any], key: str, types: type | tuple[type, ...], *, benchmark: str, where: str) -> Any:
    """rec[key], checked for presence and type, or a BenchmarkDataError naming `where` (file + record)."""
    if key not in rec:
        raise BenchmarkDataError(
            f"benchmark {benchmark!r}: {where} has no field {key!r} (fields present: {sorted(rec)[:12]})"
        )
    val = rec[key]
    if not isinstance(val, types):
        names = types.__name__ if isinstance(types, type) else "/".join(t.__name__ for t in types)
        raise BenchmarkDataError(
            f"benchmark {benchmark!r}: {where} field {key!r} is a {type(val).__name__}, expected {names}"
        )
    return val
