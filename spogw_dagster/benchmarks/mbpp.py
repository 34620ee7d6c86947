"""MBPP, read from a user-given file in the standard format (it ships in no package).

Accepted files:
- the original `mbpp.jsonl`: one JSON object per line with `task_id`, `text`, `code`, `test_list`,
  `test_setup_code`, `challenge_test_list`;
- the "sanitized" `sanitized-mbpp.json`: a JSON list of objects with `task_id`, `prompt`, `code`,
  `test_list`, `test_imports` (a list of import lines).

Per problem: question = the task text plus the first assert as the example (as the original MBPP prompt
shows it); public_tests = [first assert]; hidden_tests = setup code + every assert of `test_list`
(the standard MBPP harness; `challenge_test_list` is kept in meta, not scored); entry_point = the
function the first assert calls; answer = the reference code.
"""

from __future__ import annotations

import ast
import builtins
from pathlib import Path
from typing import Any

from ..contracts import Problem
from .dataio import BenchmarkDataError, iter_jsonl, read_json, require, resolve_data_path

FILE_FORMAT = (
    "MBPP JSON Lines (one object per line with task_id, text, code, test_list, test_setup_code, "
    "challenge_test_list), or the sanitized MBPP JSON list (task_id, prompt, code, test_list, test_imports)"
)
STANDARD_NAMES = ("mbpp.jsonl", "sanitized-mbpp.json", "mbpp.json")


def _called_names(src: str) -> list[str]:
    """Names of plain-function calls in `src`, in source order."""
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return []
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    calls.sort(key=lambda n: (n.lineno, n.col_offset))
    return [c.func.id for c in calls]  # type: ignore[union-attr]


def _defined_names(code: str) -> list[str]:
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
    return [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]


def entry_point_of(first_assert: str, code: str) -> str:
    """The function under test: the first name called in the assert that the reference code defines,
    else the first called name that is not a builtin, else the first function the code defines."""
    called = _called_names(first_assert)
    defined = _defined_names(code)
    for name in called:
        if name in defined:
            return name
    for name in called:
        if not hasattr(builtins, name):
            return name
    return defined[0] if defined else ""


def make_question(text: str, first_assert: str) -> str:
    return f"{text.strip()}\nYour code should pass this test:\n{first_assert.strip()}"


def _records(p: Path, bench: str) -> list[tuple[str, dict[str, Any]]]:
    with open(p, "rb") as f:
        head = f.read(4096).lstrip()
    if head.startswith(b"["):
        data = read_json(p, bench, FILE_FORMAT, top=list)
        out = []
        for i, rec in enumerate(data):
            if not isinstance(rec, dict):
                raise BenchmarkDataError(f"benchmark {bench!r}: {p} item {i} is not a JSON object; "
                                         f"expected {FILE_FORMAT}")
            out.append((f"{p} item {i}", rec))
        return out
    return [(f"{p} line {lineno}", rec) for lineno, rec in iter_jsonl(p, bench)]


def load_mbpp(path: str | Path | None = None) -> list[Problem]:
    bench = "mbpp"
    p = resolve_data_path(bench, path, file_format=FILE_FORMAT, standard_names=STANDARD_NAMES)
    problems: list[Problem] = []
    seen: set[str] = set()
    for where, rec in _records(p, bench):
        task_id = require(rec, "task_id", (int, str), benchmark=bench, where=where)
        where = f"{where} (task_id {task_id})"
        text_key = "text" if "text" in rec else "prompt"
        text = require(rec, text_key, str, benchmark=bench, where=where)
        code = require(rec, "code", str, benchmark=bench, where=where)
        tests = require(rec, "test_list", list, benchmark=bench, where=where)
        if not tests or not all(isinstance(t, str) and t.strip() for t in tests):
            raise BenchmarkDataError(f"benchmark {bench!r}: {where}: `test_list` must be a non-empty list of assert strings")
        if "test_setup_code" in rec:
            setup = require(rec, "test_setup_code", str, benchmark=bench, where=where)
        else:
            imports = rec.get("test_imports") or []
            if not isinstance(imports, list) or not all(isinstance(x, str) for x in imports):
                raise BenchmarkDataError(f"benchmark {bench!r}: {where}: `test_imports` must be a list of strings")
            setup = "\n".join(imports)
        challenge = rec.get("challenge_test_list") or []
        first = tests[0].strip()
        entry = entry_point_of(first, code)
        if not entry:
            raise BenchmarkDataError(f"benchmark {bench!r}: {where}: cannot tell which function the first test calls")
        pid = f"mbpp/{task_id}"
        if pid in seen:
            raise BenchmarkDataError(f"benchmark {bench!r}: {where}: duplicate task_id")
        seen.add(pid)
        hidden = "\n".join(([setup.strip()] if setup.strip() else []) + [t.strip() for t in tests]) + "\n"
        problems.append(
            Problem(
                benchmark=bench,
                id=pid,
                question=make_question(text, first),
                answer=code,
                family="code",
                entry_point=entry,
                public_tests=[first],
                hidden_tests=hidden,
                meta={
                    "dataset": bench,
                    "test_style": "asserts",
                    "test_setup_code": setup,
                    "challenge_test_list": list(challenge),
                },
            )
        )
    if not problems:
        raise BenchmarkDataError(f"benchmark {bench!r}: {p} holds no problems; expected {FILE_FORMAT}")
    return problems

