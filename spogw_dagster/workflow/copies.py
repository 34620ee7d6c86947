"""Near copies: is a generated workflow one the generator was shown (a prompt example or the template)?

A policy that copies the prompt's examples verbatim cannot improve on them, so the report measures it. Two
workflows are the same here when they are equal after normalising names and whitespace: the code is parsed,
every local name (variables, loop targets, comprehension targets, function arguments other than ``self``) is
renamed by order of first appearance, and the tree is printed back (`ast.unparse`, so layout, comments and
quote styles vanish). Attribute names (the operators), keyword names and string constants stay: a different
instruction is a different workflow.
"""

from __future__ import annotations

import ast
import builtins
from functools import lru_cache

from .template import ANCHORED_EXAMPLES, FEW_SHOT, TEMPLATES, WORKFLOW_HEADER

_KEEP = frozenset(dir(builtins)) | {"self", "Workflow"}


class _Renamer(ast.NodeTransformer):
    def __init__(self) -> None:
        self.names: dict[str, str] = {}

    def _new(self, name: str) -> str:
        if name in _KEEP:
            return name
        return self.names.setdefault(name, f"v{len(self.names)}")

    def visit_Name(self, node: ast.Name) -> ast.AST:
        node.id = self._new(node.id)
        return node

    def visit_arg(self, node: ast.arg) -> ast.AST:
        node.arg = self._new(node.arg)
        node.annotation = None
        return node


def normalized(code: str) -> str | None:
    """The name- and layout-free form of `code`, or None when it does not parse."""
    if not isinstance(code, str):
        return None
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    for node in ast.walk(tree):  # docstrings are layout too
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(getattr(body[0], "value", None), ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    try:
        return ast.unparse(_Renamer().visit(tree))
    except (RecursionError, ValueError):
        return None


@lru_cache(maxsize=None)
def shown_forms(family: str) -> dict[str, str]:
    """normalized form -> what it copies ("example 1", ..., "template") for the workflows a prompt shows."""
    forms: dict[str, str] = {}
    t = normalized(TEMPLATES[family])
    if t is not None:
        forms[t] = "template"
    shown = [(f"example {i}", b) for i, b in enumerate(FEW_SHOT[family], start=1)]
    shown += [(f"anchored example {i}", b) for i, b in enumerate(ANCHORED_EXAMPLES[family], start=1)]
    for label, body in shown:
        f = normalized(WORKFLOW_HEADER + body)
        if f is not None:
            forms.setdefault(f, label)
    return forms


def copied_from(code: str, family: str) -> str | None:
    """Which shown workflow `code` is a near copy of ("template", "example 2"), or None."""
    f = normalized(code)
    return None if f is None else shown_forms(family).get(f)


def distinct_count(codes: list[str]) -> int:
    """How many different workflows `codes` holds (after normalisation; unparsable ones by their text)."""
    return len({normalized(c) or ("\0raw", c) for c in codes})
