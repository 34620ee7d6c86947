"""What the tests can run of a code answer (pure): its live top-level statements.

The solution's module runs top to bottom (as `__solution__`, so an `if __name__ == "__main__":` block never
runs), then the tests call the names they need: the entry point, and for some MBPP tasks another name. Of an
answer's text, only this decides the verdict:

- every top-level statement that does something while the module runs (an *effect*: a call, a loop, an `if`,
  a `try`, an assignment to anything but plain names or of anything but an inert value, a decorated or
  subclassing definition, a class whose body runs code, a `del`), except a docstring and a `__main__` block;
- the **last** top-level binding of each name the tests call and, transitively, of each name a live
  statement reads (a function body reads its globals when it is called, after the module has run; a string
  constant that spells a name counts as a read, for `getattr(m, "helper")` and `globals()["helper"]`).

Everything else is dead: a shadowed definition (Python keeps the last), a helper nothing reads, a guarded demo.
In doubt a statement is live: counting too much executor-written code costs no one (every live statement must
be the executor's, `provenance.Provenance.origin_of`); calling workflow-written code dead would hand out credit.

Imports are kept apart (`Statement.is_import`): an import carries no logic of the answer, so the provenance
rule leaves it neutral unless it binds a name the tests call.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Iterable

__all__ = ["Statement", "live_statements"]

_LINES = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")


@dataclass(frozen=True)
class Statement:
    start: int  # character offsets into the code: [start, end)
    end: int
    is_import: bool
    binds_root: bool  # binds a name the tests call


def live_statements(code: str, roots: Iterable[str]) -> list[Statement] | None:
    """The live top-level statements of `code`, in order; None when the code does not parse or binds none of
    `roots` at top level (then nothing can be said about what runs: judge the whole text)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    body = tree.body
    roots = set(roots)
    binders: dict[str, int] = {}  # name -> index of the last top-level statement binding it
    for i, st in enumerate(body):
        for name in _bound_names(st):
            binders[name] = i
    if not roots & binders.keys():
        return None
    live: set[int] = set()
    todo = [binders[r] for r in roots if r in binders]
    todo += [i for i, st in enumerate(body) if _is_effect(st)]
    while todo:
        i = todo.pop()
        if i in live:
            continue
        live.add(i)
        todo.extend(binders[n] for n in _read_names(body[i]) if n in binders)
    lines = _LINES.findall(code)  # ast's line breaks only (str.splitlines also breaks at \f, \x1c, ...)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def offset(lineno: int, col: int) -> int:  # ast's col_offset counts UTF-8 bytes, not characters
        line = lines[lineno - 1] if lineno - 1 < len(lines) else ""
        return starts[lineno - 1] + len(line.encode()[:col].decode(errors="ignore"))

    out = []
    for i in sorted(live):
        st = body[i]
        start = offset(st.lineno, st.col_offset)
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and st.decorator_list:
            first = st.decorator_list[0]
            start = max(offset(first.lineno, first.col_offset) - 1, 0)  # the "@"
        end = offset(st.end_lineno, st.end_col_offset)
        out.append(Statement(start, end, isinstance(st, (ast.Import, ast.ImportFrom)),
                             bool(roots & set(_bound_names(st)))))
    return out


def _bound_names(st: ast.stmt) -> list[str]:
    """Names a top-level statement binds in the module's namespace (not inside its functions or classes)."""
    if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [st.name]
    if isinstance(st, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in st.names if a.name != "*"]
    out = []
    for node in _walk_module_scope(st):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            out.append(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.append(node.name)  # a definition inside an `if` or `try` still binds at module level
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out += [(a.asname or a.name).split(".")[0] for a in node.names if a.name != "*"]
    return out


def _walk_module_scope(node: ast.AST):
    """ast.walk, not descending into function, lambda or class bodies, nor comprehensions (their names are
    their own scope's)."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        if n is not node and isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda,
                                            ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            continue
        stack.extend(ast.iter_child_nodes(n))


def _read_names(st: ast.stmt) -> set[str]:
    """Every name a statement may read, in any nested scope (over-approximating is safe: it only keeps more
    alive), and every string constant that spells a name (a lookup by name)."""
    out = set()
    for node in ast.walk(st):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
            out.add(node.value)
        elif isinstance(node, ast.Global):
            out.update(node.names)
    return out


def _is_effect(st: ast.stmt) -> bool:
    """Does the statement do anything when the module runs, beyond binding names to inert values?"""
    if isinstance(st, (ast.Import, ast.ImportFrom)):
        return any(a.name == "*" for a in st.names)  # `import *` binds names no one can list
    if isinstance(st, ast.Pass):
        return False
    if isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant):
        return False  # a docstring, a bare `...`
    if _is_main_guard(st):
        return False
    if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return not _inert_signature(st)
    if isinstance(st, ast.ClassDef):
        # bases and keywords run code at definition (`__init_subclass__`, a metaclass), so does the body
        return bool(st.decorator_list or st.bases or st.keywords) or any(_is_effect(s) for s in st.body)
    if isinstance(st, ast.Assign):
        return not (all(_plain_target(t) for t in st.targets) and _inert(st.value))
    if isinstance(st, ast.AnnAssign):
        return not (isinstance(st.target, ast.Name) and (st.value is None or _inert(st.value))
                    and _inert(st.annotation))
    return True


def _is_main_guard(st: ast.stmt) -> bool:
    """`if __name__ == "__main__":` with no `else` (the solution runs as `__solution__`: the block never runs)."""
    if not isinstance(st, ast.If) or st.orelse:
        return False
    t = st.test
    if not (isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], ast.Eq)):
        return False
    sides = [t.left, t.comparators[0]]
    return any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides) and \
        any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides)


def _inert_signature(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """No decorator, and defaults and annotations that run nothing (they are evaluated at definition)."""
    if fn.decorator_list:
        return False
    a = fn.args
    exprs = [*a.defaults, *(d for d in a.kw_defaults if d is not None), fn.returns,
             *(x.annotation for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if x is not None)]
    return all(e is None or _inert(e) for e in exprs)


def _plain_target(t: ast.expr) -> bool:
    if isinstance(t, ast.Name):
        return True
    return isinstance(t, (ast.Tuple, ast.List)) and all(isinstance(e, ast.Name) for e in t.elts)


def _inert(e: ast.expr) -> bool:
    """An expression whose evaluation runs no code of the module's: constants, names, attribute chains of
    names, containers of those, and lambdas (their body runs only when called). A subscript (`List[int]`) can
    call a class's `__class_getitem__`, so it is not inert: the statement is live, which is the safe side."""
    if isinstance(e, (ast.Constant, ast.Name)):
        return True
    if isinstance(e, ast.Lambda):  # its defaults are evaluated when it is made
        return all(d is None or _inert(d) for d in (*e.args.defaults, *e.args.kw_defaults))
    if isinstance(e, ast.Attribute):
        return _inert(e.value) and isinstance(e.value, (ast.Name, ast.Attribute))
    if isinstance(e, (ast.Tuple, ast.List, ast.Set)):
        return all(_inert(x) for x in e.elts)
    if isinstance(e, ast.Dict):
        return all(k is not None and _inert(k) for k in e.keys) and all(_inert(v) for v in e.values)
    if isinstance(e, ast.UnaryOp) and isinstance(e.operand, ast.Constant):
        return True  # -1
    return False
