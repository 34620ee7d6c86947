"""No function of 100 lines or more in the package: past that a reader cannot hold one in mind (issue of the
house's second pass); split it into named steps instead."""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "spogw_dagster"
LIMIT = 100


def long_functions(root: Path, limit: int = LIMIT) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines >= limit:
                    out.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({lines} lines)")
    return out


def test_no_function_in_the_package_reaches_100_lines():
    assert long_functions(PKG) == []


def test_the_check_sees_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT - 1))
    (tmp_path / "m.py").write_text(f"def short():\n    pass\n\n\nasync def long():\n{body}\n")
    assert long_functions(tmp_path) == [f"{tmp_path.name}/m.py:5 long ({LIMIT} lines)"]
