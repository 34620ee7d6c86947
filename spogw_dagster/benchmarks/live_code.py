"""What the tests can run of a code answer (pure): its live top-level statements.

The solution's module runs top to bottom (as `__solution__`, so an `if __name__ == "__main__":` block never
runs, unless the module may rebind `__name__`), then the tests call the names they need: the entry point, and
for some MBPP tasks another name. Of an answer's text, only this decides the verdict:

- every top-level statement that does something while the module runs (an *effect*: a call, a loop, an `if`,
  a `try`, an assignment to anything but plain names or of anything but an inert value, a decorated or
  subclassing definition, a class whose body runs code, a `del`, a star import), except a docstring and a
  `__main__` block;
- for each name the tests call, its last top-level binding that surely runs and every conditional binding
  after it (in an `if`, `try`, loop or `with`); a `__main__` block and a bare annotation (`f: T`) bind nothing;
- every binding of every name a live statement reads, transitively (a read at import time finds an earlier
  binding than one in a function body does; a string constant that spells a name counts as a read, for
  `getattr(m, "helper")` and `globals()["helper"]`).

Everything else is dead: a shadowed definition of a tested name, a helper nothing reads, a guarded demo. In
doubt a statement is live: counting too much executor-written code costs no one (every live statement must
be the executor's, `provenance.code_origin`); calling workflow-written code dead would hand out credit. And
the scorer runs only what is live (`live_only`: dead statements become `pass`), so a statement this analysis
wrongly calls dead cannot decide a verdict either: the answer fails its tests instead.

Imports, and plain aliases of a function the answer defines (`f = solve`), carry no logic of their own: they
are neutral (`Statement.neutral`) unless an import binds a name the tests call.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Iterable

__all__ = ["Statement", "live_statements", "live_only"]

_LINES = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")


@dataclass(frozen=True)
class Statement:
    start: int  # character offsets into the code: [start, end)
    end: int
    # neutral: an import, or an alias of a function the answer defines (`f = solve`), carries no logic of its own;
    # judged anyway where it binds a tested name to anything else (an import, `from statistics import *`)
    neutral: bool
    binds_root: bool  # binds a name the tests call


STAR = "*"  # what a star import binds: any name


def live_statements(code: str, roots: Iterable[str]) -> list[Statement] | None:
    """The live top-level statements of `code`, in order; None when the code does not parse or binds none of
    `roots` at top level (then nothing can be said about what runs: judge the whole text)."""
    a = _analyse(code, roots)
    return None if a is None else [st for _, st, is_live in a if is_live]


def live_only(code: str, roots: Iterable[str]) -> str | None:
    """`code` with each dead statement replaced by `pass` (imports and docstrings kept where they stand), so the
    module the tests run holds only what the provenance rule judged; None when `live_statements` says nothing."""
    a = _analyse(code, roots)
    if a is None:
        return None
    parts = []
    for node, st, is_live in a:
        keep = is_live or isinstance(node, (ast.Import, ast.ImportFrom)) or \
            (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))
        parts.append(code[st.start:st.end] if keep else "pass")
    return "\n".join(parts) + "\n"


def _analyse(code: str, roots: Iterable[str]) -> list[tuple[ast.stmt, Statement, bool]] | None:
    """Every top-level statement (its node, its span, whether it is live); None: unparsable, or no root bound."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    body = tree.body
    roots = set(roots)
    # an `if __name__ == "__main__":` block never runs, unless something may rebind `__name__`
    guards_dead = not _may_rebind_dunder_name(tree)
    binds = [set(_bound_names(st, guards_dead)) for st in body]
    conditional = [_is_compound(st) for st in body]
    if not any(STAR in b or roots & b for b in binds):
        return None

    def binders(name: str) -> list[int]:
        return [i for i, b in enumerate(binds) if name in b or STAR in b]

    def root_binders(name: str) -> list[int]:
        """What the tests may call: the last binding that surely runs, and every conditional one after it."""
        idx = binders(name)
        sure = [i for i in idx if not conditional[i]]
        return [i for i in idx if i >= (sure[-1] if sure else -1)]

    live: set[int] = set()
    todo = [i for r in roots for i in root_binders(r)]
    todo += [i for i, st in enumerate(body) if _is_effect(st, guards_dead)]
    while todo:
        i = todo.pop()
        if i in live:
            continue
        live.add(i)
        # a read at import time finds an earlier binding, a read in a function body the last: every binding is live
        todo.extend(j for n in _read_names(body[i]) for j in binders(n))
    lines = _LINES.findall(code)  # ast's line breaks only (str.splitlines also breaks at \f, \x1c, ...)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def offset(lineno: int, col: int) -> int:  # ast's col_offset counts UTF-8 bytes, not characters
        line = lines[lineno - 1] if lineno - 1 < len(lines) else ""
        return starts[lineno - 1] + len(line.encode()[:col].decode(errors="ignore"))

    out = []
    for i, st in enumerate(body):
        start = offset(st.lineno, st.col_offset)
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and st.decorator_list:
            first = st.decorator_list[0]
            start = code.rfind("@", 0, offset(first.lineno, first.col_offset))
        end = offset(st.end_lineno, st.end_col_offset)
        binds_root = bool(STAR in binds[i] or roots & binds[i])
        is_import = isinstance(st, (ast.Import, ast.ImportFrom))
        neutral = (is_import and not binds_root) or _is_alias(st, [body[j] for j in binders(_alias_of(st))])
        out.append((st, Statement(start, end, neutral, binds_root), i in live))
    return out


def _alias_of(st: ast.stmt) -> str:
    """The name `st` aliases (`f = solve`: "solve"), or "" when it is no plain alias."""
    if isinstance(st, ast.Assign) and isinstance(st.value, ast.Name) and \
            all(isinstance(t, ast.Name) for t in st.targets):
        return st.value.id
    return ""


def _is_alias(st: ast.stmt, value_binders: list[ast.stmt]) -> bool:
    """`f = solve` where every binding of `solve` is a function or class the answer defines: the alias adds no
    logic, and those definitions are judged (they are live through it). Not an alias of an import or a library
    name (`f = statistics.median` lets the library answer)."""
    return bool(_alias_of(st)) and bool(value_binders) and all(
        isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for b in value_binders)


def _is_compound(st: ast.stmt) -> bool:
    """A statement whose bindings may not happen (a branch, a loop, a `try`, a `with`)."""
    return isinstance(st, (ast.If, ast.For, ast.AsyncFor, ast.While, ast.Try, ast.With, ast.AsyncWith, ast.Match)) or \
        (hasattr(ast, "TryStar") and isinstance(st, ast.TryStar))


def _may_rebind_dunder_name(tree: ast.Module) -> bool:
    """Does anything in the module store to `__name__`, declare it global, or spell it in a string
    (`globals()["__name__"] = ...`)?"""
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == "__name__" and not isinstance(node.ctx, ast.Load):
            return True
        if isinstance(node, ast.Global) and "__name__" in node.names:
            return True
        if isinstance(node, ast.Constant) and node.value == "__name__":
            return True
    return False


def _bound_names(st: ast.stmt, guards_dead: bool = True) -> list[str]:
    """Names a top-level statement binds in the module's namespace (not inside its functions or classes); STAR
    for a star import. A `__main__` block that never runs binds nothing, nor does a bare annotation (`f: T`)."""
    if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [st.name]
    if guards_dead and _is_main_guard(st):
        return []
    bare = {id(n.target) for n in _walk_module_scope(st) if isinstance(n, ast.AnnAssign) and n.value is None}
    out = []
    for node in _walk_module_scope(st):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)) and id(node) not in bare:
            out.append(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node is not st:
            out.append(node.name)  # a definition inside an `if` or `try` still binds at module level
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out += [STAR if a.name == "*" else (a.asname or a.name).split(".")[0] for a in node.names]
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


def _is_effect(st: ast.stmt, guards_dead: bool = True) -> bool:
    """Does the statement do anything when the module runs, beyond binding names to inert values?"""
    if isinstance(st, (ast.Import, ast.ImportFrom)):
        return any(a.name == "*" for a in st.names)  # `import *` binds names no one can list
    if isinstance(st, ast.Pass):
        return False
    if isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant):
        return False  # a docstring, a bare `...`
    if guards_dead and _is_main_guard(st):
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
