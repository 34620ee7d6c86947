"""Does a workflow's answer come from a solution an operator wrote? A static data-flow check (pure).

A workflow that calls a solution-writing operator but returns something else (`await self.code_generate(...)`
then `return await self.test(solution=False)`) did not attempt the task: the call is dead. This module
follows values through the workflow's code, the way a taint analysis does, and says whether the value
`run` returns can depend on the output of one of the `producing` operators.

What carries a value along: assignment (tuples, starred, walrus, `+=`), any expression built from it
(`x.strip()`, `x + y`, f-strings, subscripts, `a or b`, comprehensions), a container it was put into
(`xs.append(x)`, `d[k] = x`, `xs.extend(...)`, `d.update(...)`), an attribute of `self` (across methods),
a call of another operator with it as an argument (`test(solution=x)`, `sc_ensemble(solutions=[x])`), and
the workflow's own methods (their return value, from their arguments or their own operator calls).

It is flow-sensitive: a value that is overwritten before it is returned is dead (`x = await self.custom(..)`;
`x = "A"`; `return x` returns a constant), branches join (the answer may depend on the output if any path
carries it), loops run to a fixed point. A condition alone does not carry a value: `return "A" if x else "B"`
returns a constant. Nested functions and lambdas are not followed (a value only they carry does not count).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

__all__ = ["returns_operator_output"]

SRC = "<operator output>"
_MUTATORS = frozenset({"append", "extend", "insert", "update", "add", "setdefault"})
Labels = frozenset
State = dict  # variable name -> Labels


def _join(a: State, b: State) -> State:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, frozenset()) | v
    return out


@dataclass
class _Program:
    producing: frozenset[str]
    methods: dict[str, ast.AsyncFunctionDef | ast.FunctionDef]
    summaries: dict[str, frozenset[str]] = field(default_factory=dict)  # method -> labels of its return
    attrs: dict[str, frozenset[str]] = field(default_factory=dict)  # self.<attr> -> labels (all methods)

    def params(self, name: str) -> list[str]:
        a = self.methods[name].args
        return [p.arg for p in (*a.posonlyargs, *a.args)][1:] + [p.arg for p in a.kwonlyargs]


class _Function:
    """One method's analysis under the program's current summaries."""

    def __init__(self, prog: _Program, fn: ast.AsyncFunctionDef | ast.FunctionDef):
        self.prog, self.fn = prog, fn
        self.returns: frozenset[str] = frozenset()
        self.attr_writes: dict[str, frozenset[str]] = {}

    def run(self) -> None:
        state: State = {p: frozenset({f"param:{p}"}) for p in self.prog.params(self.fn.name)}
        self.block(self.fn.body, state)

    # ------------------------------------------------------------------ expressions
    def ev(self, node: ast.AST | None, st: State) -> frozenset[str]:
        if node is None:
            return frozenset()
        if isinstance(node, ast.Name):
            return st.get(node.id, frozenset())
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            return self.prog.attrs.get(node.attr, frozenset())
        if isinstance(node, ast.Await):
            return self.ev(node.value, st)
        if isinstance(node, ast.Call):
            return self.call(node, st)
        if isinstance(node, ast.IfExp):  # the condition picks a value; it does not carry one
            return self.ev(node.body, st) | self.ev(node.orelse, st)
        if isinstance(node, ast.NamedExpr):
            v = self.ev(node.value, st)
            self.assign(node.target, v, st)
            return v
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            inner = dict(st)
            for gen in node.generators:
                self.assign(gen.target, self.ev(gen.iter, inner), inner)
            elts = (node.key, node.value) if isinstance(node, ast.DictComp) else (node.elt,)
            return frozenset().union(*(self.ev(e, inner) for e in elts))
        if isinstance(node, (ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef)):
            return frozenset()
        out: frozenset[str] = frozenset()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.expr, ast.keyword, ast.comprehension, ast.FormattedValue)):
                out |= self.ev(child, st)
        return out

    def call(self, node: ast.Call, st: State) -> frozenset[str]:
        f = node.func
        args = [self.ev(a, st) for a in node.args]
        kwargs = {kw.arg: self.ev(kw.value, st) for kw in node.keywords}
        everything = frozenset().union(*args, *kwargs.values())
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self":
            if f.attr in self.prog.producing:
                return frozenset({SRC})
            if f.attr in self.prog.methods:  # the method's summary, its parameters bound to these arguments
                summary = self.prog.summaries.get(f.attr, frozenset())
                bound = dict(zip(self.prog.params(f.attr), args))
                bound.update({k: v for k, v in kwargs.items() if k})
                out = summary & {SRC}
                for label in summary:
                    if label.startswith("param:"):
                        out |= bound.get(label[6:], frozenset())
                return frozenset(out)
            return everything  # another operator (test, review, sc_ensemble): a function of its inputs
        if isinstance(f, ast.Attribute):  # a str/list/dict method: of its receiver and its arguments
            receiver = self.ev(f.value, st)
            if f.attr in _MUTATORS and everything:
                self.weak(f.value, everything, st)
            return receiver | everything
        return everything | (self.ev(f, st) if not isinstance(f, ast.Name) else frozenset())

    # ------------------------------------------------------------------ stores
    def assign(self, target: ast.AST, v: frozenset[str], st: State, value: ast.AST | None = None) -> None:
        """Store `v` (the labels of `value`, when the caller has that expression) into `target`."""
        if (isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List))
                and len(target.elts) == len(value.elts)
                and not any(isinstance(e, ast.Starred) for e in (*target.elts, *value.elts))):
            labels = [self.ev(e, st) for e in value.elts]  # `a, b = x, y`: element by element
            for t, lv, ve in zip(target.elts, labels, value.elts):
                self.assign(t, lv, st, ve)
            return
        if isinstance(target, ast.Name):
            st[target.id] = v  # a strong update: what it held before is dead
        elif isinstance(target, (ast.Tuple, ast.List)):
            for e in target.elts:
                self.assign(e, v, st)
        elif isinstance(target, ast.Starred):
            self.assign(target.value, v, st)
        else:
            self.weak(target, v, st)

    def weak(self, target: ast.AST, v: frozenset[str], st: State) -> None:
        """Add `v` to what `target` (a container, an element of one, or an attribute of self) holds."""
        while isinstance(target, ast.Subscript):
            target = target.value
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
            self.attr_writes[target.attr] = self.attr_writes.get(target.attr, frozenset()) | v
        elif isinstance(target, ast.Name):
            st[target.id] = st.get(target.id, frozenset()) | v

    # ------------------------------------------------------------------ statements
    def block(self, body: list[ast.stmt], st: State) -> State:
        for stmt in body:
            st = self.stmt(stmt, st)
        return st

    def stmt(self, s: ast.stmt, st: State) -> State:
        st = dict(st)
        if isinstance(s, ast.Assign):
            v = self.ev(s.value, st)
            for t in s.targets:
                self.assign(t, v, st, s.value)
        elif isinstance(s, ast.AnnAssign):
            if s.value is not None:
                self.assign(s.target, self.ev(s.value, st), st)
        elif isinstance(s, ast.AugAssign):
            v = self.ev(s.value, st)
            if isinstance(s.target, ast.Name):
                st[s.target.id] = st.get(s.target.id, frozenset()) | v
            else:
                self.weak(s.target, v, st)
        elif isinstance(s, ast.Expr):
            self.ev(s.value, st)
        elif isinstance(s, ast.Return):
            self.returns |= self.ev(s.value, st)
        elif isinstance(s, ast.If):
            self.ev(s.test, st)  # for walrus assignments in the condition
            st = _join(self.block(s.body, dict(st)), self.block(s.orelse, dict(st)))
        elif isinstance(s, (ast.For, ast.AsyncFor, ast.While)):
            st = self.loop(s, st)
        elif isinstance(s, ast.Try) or type(s).__name__ == "TryStar":
            after_body = self.block(s.body, dict(st))
            anywhere = _join(st, after_body)  # an exception may leave the body at any point
            out = self.block(s.orelse, after_body)
            for h in s.handlers:
                out = _join(out, self.block(h.body, dict(anywhere)))
            st = self.block(s.finalbody, out)
        elif isinstance(s, ast.Delete):
            for t in s.targets:
                if isinstance(t, ast.Name):
                    st.pop(t.id, None)
        return st

    def loop(self, s: ast.For | ast.AsyncFor | ast.While, st: State) -> State:
        head = st
        for _ in range(64):  # labels only grow, so this converges; the bound is a guard
            body_in = dict(head)
            if isinstance(s, ast.While):
                self.ev(s.test, body_in)
            else:
                self.assign(s.target, self.ev(s.iter, body_in), body_in)
            new_head = _join(head, self.block(s.body, body_in))
            if new_head == head:
                break
            head = new_head
        return self.block(s.orelse, head)


def returns_operator_output(code: str, producing: frozenset[str]) -> bool | None:
    """Whether the value `Workflow.run` returns can depend on the output of a call of a `producing` operator
    (calls of other operators pass their inputs through). None for code that does not parse or has no
    `Workflow.run` (not a workflow at all)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Workflow"), None)
    methods = {n.name: n for n in (cls.body if cls else []) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    if "run" not in methods:
        return None
    prog = _Program(frozenset(producing), methods)
    try:
        for _ in range(32):  # method summaries and self attributes to a fixed point
            changed = False
            for name, fn in methods.items():
                f = _Function(prog, fn)
                f.run()
                if prog.summaries.get(name) != f.returns:
                    prog.summaries[name] = f.returns
                    changed = True
                for attr, v in f.attr_writes.items():
                    if not v <= prog.attrs.get(attr, frozenset()):
                        prog.attrs[attr] = prog.attrs.get(attr, frozenset()) | v
                        changed = True
            if not changed:
                break
    except RecursionError:  # a pathologically nested workflow: no credit it cannot be shown to earn
        return False
    return SRC in prog.summaries.get("run", frozenset())
