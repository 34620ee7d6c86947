"""Every function-local import of a module outside the package says why it is local (issue 58).

Imports sit at the top of a module. An import of the standard library or a third-party module inside a function
body (at any depth: nested functions, methods, `try` blocks) stays there only with a reason on its own line, as
a trailing `#` comment: `import torch  # heavy: ...`, `# lazy: keeps the CLI's start-up fast`,
`# optional extra (vllm)`. Imports of the package's own modules are tests/test_layers.py's concern (its `# lazy:`
rule). The checker is tested on planted source strings.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import spogw_dagster

PACKAGE = Path(spogw_dagster.__file__).parent
OWN = PACKAGE.name


def _own(node: ast.Import | ast.ImportFrom) -> bool:
    """Does this import statement import only the package's own modules (absolute or relative)?"""
    if isinstance(node, ast.ImportFrom):
        mod = node.module or ""
        return bool(node.level) or mod == OWN or mod.startswith(OWN + ".")
    return all(a.name == OWN or a.name.startswith(OWN + ".") for a in node.names)


def _comment_lines(source: str) -> set[int]:
    """Line numbers that carry a `#` comment (a real comment token, not a '#' inside a string)."""
    return {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(source).readline)
            if tok.type == tokenize.COMMENT}


def _local_imports(tree: ast.AST):
    """Import statements nested (at any depth) in the body of a function or method."""
    def visit(node: ast.AST, in_function: bool):
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child
            yield from visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))
    yield from visit(tree, False)


def unexplained_local_imports(source: str, name: str = "<string>") -> list[str]:
    """`name:line` of each function-local import of a non-package module with no comment on its lines."""
    tree = ast.parse(source, name)
    commented = _comment_lines(source)
    out = []
    for node in _local_imports(tree):
        if _own(node):
            continue
        if not any(ln in commented for ln in range(node.lineno, (node.end_lineno or node.lineno) + 1)):
            out.append(f"{name}:{node.lineno}")
    return out


def package_violations(root: Path = PACKAGE) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        out += unexplained_local_imports(path.read_text(), str(path.relative_to(root.parent)))
    return out


def test_every_function_local_import_of_another_module_says_why():
    found = package_violations()
    assert found == [], ("function-local imports without a reason: move each to the top of its module, or keep it "
                         "with a trailing comment that says why (`# heavy: ...`, `# lazy: ...`, `# optional extra "
                         "(...)`):\n  " + "\n  ".join(found))


PLANTED = '''\
import json


def top_level_is_fine():
    return json


def silent():
    import torch
    return torch


def explained():
    import torch  # heavy: only the trainer needs it
    from transformers import (  # heavy: likewise
        AutoModel,
    )
    return torch, AutoModel


def own_modules_are_test_layers_concern():
    from spogw_dagster.models import load_tokenizer
    from . import paths
    import spogw_dagster.seeds
    return load_tokenizer, paths


class Sampler:
    def method(self):
        try:
            if True:
                from vllm import LLM
        except ImportError:
            pass
        return LLM

    def nested(self):
        def inner():
            import os, sys
            return os, sys
        return inner


def hash_in_a_string():
    import re; x = "# not a comment"
    return re, x


async def coroutine():
    import asyncio
    return asyncio
'''


def test_the_checker_reports_a_silent_local_import_and_not_an_explained_one():
    found = unexplained_local_imports(PLANTED, "planted.py")
    assert found == ["planted.py:9", "planted.py:32", "planted.py:39", "planted.py:45", "planted.py:50"]


def test_the_checker_on_single_examples():
    silent = "def f():\n    import torch\n    return torch\n"
    explained = "def f():\n    import torch  # heavy: only the trainer needs it\n    return torch\n"
    assert unexplained_local_imports(silent) == ["<string>:2"]
    assert unexplained_local_imports(explained) == []


def test_the_checker_walks_a_package_tree(tmp_path):
    pkg = tmp_path / OWN
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "mod.py").write_text("def f():\n    import yaml\n    return yaml\n")
    (pkg / "ok.py").write_text("def g():\n    import yaml  # lazy: a reason\n    return yaml\n")
    assert package_violations(pkg) == [f"{OWN}/sub/mod.py:2"]
