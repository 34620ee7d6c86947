"""No function takes sys.stdout or sys.stderr as a default argument: a default is bound once, at import, so a
caller that later replaces the stream (pytest's capsys, a notebook, `contextlib.redirect_stdout`) would see the
output go past it to whatever stream existed when the module was first imported."""

from __future__ import annotations

import ast
from pathlib import Path

import spogw_dagster

ROOT = Path(spogw_dagster.__file__).parent.parent


def _stream_defaults(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for d in [*node.args.defaults, *(k for k in node.args.kw_defaults if k is not None)]:
                if (isinstance(d, ast.Attribute) and isinstance(d.value, ast.Name) and d.value.id == "sys"
                        and d.attr in ("stdout", "stderr")):
                    found.append(f"{path.name}:{d.lineno} (default sys.{d.attr})")
    return found


def test_the_scan_finds_stream_defaults(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import sys\ndef f(x, out=sys.stdout):\n    print(x, file=out)\n"
                   "async def g(*, err=sys.stderr, n=1):\n    pass\n")
    assert _stream_defaults(bad) == ["bad.py:2 (default sys.stdout)", "bad.py:4 (default sys.stderr)"]


def test_no_function_binds_an_output_stream_at_import():
    files = sorted((ROOT / "spogw_dagster").rglob("*.py")) + sorted((ROOT / "bench").glob("*.py"))
    assert len(files) > 20
    assert [hit for f in files for hit in _stream_defaults(f)] == []
