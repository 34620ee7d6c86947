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
carries it), loops run to a fixed point, and code after `return`/`raise`/`break`, in a branch on a constant
condition (`if False`, `if 1 == 2`, `while ()`), in a loop over `range(0)` or `[]`, or before a `finally` that
returns, is dead. A condition alone does not carry a value (`return "A" if x else "B"` returns a constant),
nor do values that keep nothing of it: `len(x)`, `bool(x)`, comparisons, `x.count(..)`, `x * 0`, `x[:0]`,
`x.replace(x, y)`, `x.strip(x)`, `x and "A"`, `(x, "A")[1]`. Nested functions and lambdas are not followed.

What it cannot see (undecidable in general, so a run's trace backs it up: `runtime.WorkflowRunResult.produced`
requires that a solution-writing operator actually ran): values emptied by a computed bound (`x[len(x):]`,
`range(len(x) * 0)`), a constant that wins a vote or a `min`/`max`/`sorted` pick, a slot of a container
overwritten later (`xs[0] = "A"`: containers are updated weakly), aliases (`ys = xs; ys.append(x)`), a `try`
whose body always raises. These still earn the executes rung; the answer score, the headline, is unaffected.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from .template import VERDICT_OPERATORS

__all__ = ["returns_operator_output"]

SRC = "<operator output>"
_MUTATORS = frozenset({"append", "extend", "insert", "update", "add", "setdefault"})
_SUMMARIES = frozenset({"len", "bool", "isinstance"})  # builtins whose result says something about x, not x
_NOT_TEXT = frozenset({"count", "find", "rfind", "index", "rindex", "startswith", "endswith", "isalnum", "isalpha",
                       "isdecimal", "isdigit", "islower", "isnumeric", "isspace", "istitle", "isupper",
                       "issubset", "issuperset"})
_SELF_EMPTYING = frozenset({"strip", "lstrip", "rstrip", "split", "rsplit", "partition", "rpartition",
                            "removeprefix", "removesuffix"})
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

    mutations: dict[str, dict[str, frozenset[str]]] = field(default_factory=dict)  # method -> param -> labels

    def params(self, name: str) -> list[str]:
        a = self.methods[name].args
        named = [p.arg for p in (*a.posonlyargs, *a.args)][1:] + [p.arg for p in a.kwonlyargs]
        return named + [x.arg for x in (a.vararg, a.kwarg) if x is not None]

    def positional(self, name: str) -> tuple[list[str], str | None]:
        """The method's positional parameters (self excluded) and its *args name."""
        a = self.methods[name].args
        return [p.arg for p in (*a.posonlyargs, *a.args)][1:], (a.vararg.arg if a.vararg else None)


class _Function:
    """One method's analysis under the program's current summaries."""

    def __init__(self, prog: _Program, fn: ast.AsyncFunctionDef | ast.FunctionDef):
        self.prog, self.fn = prog, fn
        self.returns: frozenset[str] = frozenset()
        self.attr_writes: dict[str, frozenset[str]] = {}
        self._loops: list[dict[str, list[State]]] = []  # per enclosing loop: states at its break / continue
        self._raised: list[State] = []  # states at a raise (a try's handlers start from them)
        self.exits: list[State] = []  # states where the method returns (what its parameters hold then)
        self.mutations: dict[str, frozenset[str]] = {}

    def run(self) -> None:
        params = self.prog.params(self.fn.name)
        state: State = {p: frozenset({f"param:{p}"}) for p in params}
        end = self.block(self.fn.body, state)
        self.exits.extend([end] if end is not None else [])
        self.mutations = {p: frozenset().union(*(e.get(p, frozenset()) for e in self.exits)) - {f"param:{p}"}
                          for p in params}
        self.mutations = {p: v for p, v in self.mutations.items() if v}

    # ------------------------------------------------------------------ expressions
    def ev(self, node: ast.AST | None, st: State) -> frozenset[str]:
        if node is None:
            return frozenset()
        if isinstance(node, ast.Name):
            return st.get(node.id, frozenset())
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            local = st.get(f"self.{node.attr}")  # set earlier in this method: what it holds here
            return local if local is not None else self.prog.attrs.get(node.attr, frozenset())
        if isinstance(node, ast.Await):
            return self.ev(node.value, st)
        if isinstance(node, ast.Call):
            return self.call(node, st)
        if isinstance(node, ast.IfExp):  # the condition picks a value; it does not carry one
            truth = _constant_truth(node.test)
            return ((self.ev(node.body, st) if truth is not False else frozenset())
                    | (self.ev(node.orelse, st) if truth is not True else frozenset()))
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And):
            for v in node.values[:-1]:  # returned only when falsy (empty): they carry nothing
                self.ev(v, st)
            return self.ev(node.values[-1], st)
        if (isinstance(node, ast.Subscript) and isinstance(node.value, (ast.Tuple, ast.List, ast.Dict))
                and isinstance(node.slice, ast.Constant)):
            picked = _literal_item(node.value, node.slice.value)
            if picked is not None:  # (x, 'A')[1], {'k': 'A'}['k']: only that element
                return self.ev(picked, st)
        if isinstance(node, (ast.Compare, ast.UnaryOp)) and (isinstance(node, ast.Compare)
                                                             or isinstance(node.op, ast.Not)):
            self.ev(node.left if isinstance(node, ast.Compare) else node.operand, st)  # (walrus stores)
            return frozenset()  # a truth value is no solution
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) and (_is_zero(node.left)
                                                                             or _is_zero(node.right)):
            return frozenset()  # x * 0 (or * -1) is empty, whatever x held
        if isinstance(node, ast.Subscript) and _empty_slice(node.slice):
            return frozenset()  # x[:0], x[3:3]
        if isinstance(node, ast.NamedExpr):
            v = self.ev(node.value, st)
            self.assign(node.target, v, st)
            return v
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            if any(_constant_truth(c) is False for g in node.generators for c in g.ifs) or any(
                    _empty_iterable(g.iter) for g in node.generators):
                return frozenset()  # no element is ever produced
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
            if f.attr in VERDICT_OPERATORS:  # check(solution=x) is "pass"/"fail": nothing of x is in it
                return frozenset()
            if f.attr in self.prog.methods:  # the method's summary, its parameters bound to these arguments
                summary = self.prog.summaries.get(f.attr, frozenset())
                names, star = self.prog.positional(f.attr)
                bound = dict(zip(names, args))
                if star is not None:
                    bound[star] = frozenset().union(*args[len(names):])
                bound.update({k: v for k, v in kwargs.items() if k})

                def resolve(labels: frozenset[str]) -> frozenset[str]:
                    out = labels & {SRC}
                    for label in labels:
                        if label.startswith("param:"):
                            out |= bound.get(label[6:], frozenset())
                    return frozenset(out)

                # arguments the method fills (xs.append(...) on a parameter) now hold what it put there
                exprs = dict(zip(names, node.args))
                exprs.update({kw.arg: kw.value for kw in node.keywords if kw.arg})
                for param, labels in self.prog.mutations.get(f.attr, {}).items():
                    if param in exprs and resolve(labels):
                        self.weak(exprs[param], resolve(labels), st)
                return resolve(summary)
            return everything  # another operator (test, review, sc_ensemble): a function of its inputs
        if isinstance(f, ast.Attribute):  # a str/list/dict method: of its receiver and its arguments
            receiver = self.ev(f.value, st)
            if node.args and ast.dump(node.args[0]) == ast.dump(f.value):
                if f.attr == "replace":  # x.replace(x, y) is y
                    return frozenset().union(*args[1:], *kwargs.values())
                if f.attr in _SELF_EMPTYING:  # x.strip(x), x.split(x), x.removeprefix(x): nothing of x is left
                    return frozenset()
            if f.attr in _NOT_TEXT:  # x.count(y), x.startswith(y), x.find(y): a number or a truth value
                return frozenset()
            if f.attr in _MUTATORS and everything:
                self.weak(f.value, everything, st)
            return receiver | everything
        if isinstance(f, ast.Name) and f.id in _SUMMARIES:  # len(x), bool(x), isinstance(x, str): not a solution
            return frozenset()
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
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
            self.attr_writes[target.attr] = self.attr_writes.get(target.attr, frozenset()) | v
            st[f"self.{target.attr}"] = v  # strong here; other methods see every value it was given
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
        while isinstance(target, ast.Subscript) or (isinstance(target, ast.Call)
                                                    and isinstance(target.func, ast.Attribute)):
            target = target.value if isinstance(target, ast.Subscript) else target.func.value
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
            self.attr_writes[target.attr] = self.attr_writes.get(target.attr, frozenset()) | v
            key = f"self.{target.attr}"
            st[key] = st.get(key, frozenset()) | v
        elif isinstance(target, ast.Name):
            st[target.id] = st.get(target.id, frozenset()) | v

    # ------------------------------------------------------------------ statements
    # A state is None where control cannot reach (after return, raise, break, continue, in a dead branch).
    def block(self, body: list[ast.stmt], st: State | None) -> State | None:
        for stmt in body:
            if st is None:
                return None  # the rest is dead code: what it computes is never returned
            st = self.stmt(stmt, st)
        return st

    def stmt(self, s: ast.stmt, st: State) -> State | None:
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
            if isinstance(s.op, ast.Mult) and _is_zero(s.value):
                v = frozenset()
                if isinstance(s.target, ast.Name):
                    st[s.target.id] = v
            elif isinstance(s.target, ast.Name):
                st[s.target.id] = st.get(s.target.id, frozenset()) | v
            else:
                self.weak(s.target, v, st)
        elif isinstance(s, ast.Expr):
            self.ev(s.value, st)
        elif isinstance(s, ast.Return):
            self.returns |= self.ev(s.value, st)
            self.exits.append(st)
            return None
        elif isinstance(s, ast.Raise):
            self.ev(s.exc, st)
            self._raised.append(st)
            return None
        elif isinstance(s, (ast.Break, ast.Continue)):
            if self._loops:
                self._loops[-1]["break" if isinstance(s, ast.Break) else "continue"].append(st)
            return None
        elif isinstance(s, ast.If):
            self.ev(s.test, st)  # for walrus assignments in the condition
            truth = _constant_truth(s.test)
            body = self.block(s.body, dict(st)) if truth is not False else None
            orelse = self.block(s.orelse, dict(st)) if truth is not True else None
            return _join_opt(body, orelse)
        elif isinstance(s, (ast.For, ast.AsyncFor, ast.While)):
            return self.loop(s, st)
        elif isinstance(s, ast.Try) or type(s).__name__ == "TryStar":
            saved_returns, self.returns = self.returns, frozenset()
            raised_before = len(self._raised)
            seen = [st]  # an exception may leave the body between any two of its statements
            cur: State | None = dict(st)
            for stmt in s.body:
                if cur is None:
                    break
                cur = self.stmt(stmt, cur)
                if cur is not None:
                    seen.append(cur)
            seen += self._raised[raised_before:]
            del self._raised[raised_before:]  # raised inside this try: the handlers may catch them
            anywhere: State = {}
            for state in seen:
                anywhere = _join(anywhere, state)
            out = self.block(s.orelse, cur) if cur is not None else None
            for h in s.handlers:
                out = _join_opt(out, self.block(h.body, dict(anywhere)))
            inner_returns, self.returns = self.returns, saved_returns
            if s.finalbody:
                out = self.block(s.finalbody, out if out is not None else dict(anywhere))
                if out is None:  # the finally block always returns or raises: it replaces what the try returned
                    return None
            self.returns |= inner_returns
            return out
        elif isinstance(s, ast.Delete):
            for t in s.targets:
                if isinstance(t, ast.Name):
                    st.pop(t.id, None)
        return st

    def loop(self, s: ast.For | ast.AsyncFor | ast.While, st: State) -> State | None:
        if isinstance(s, ast.While) and _constant_truth(s.test) is False or (
                not isinstance(s, ast.While) and _empty_iterable(s.iter)):
            return self.block(s.orelse, st)  # the body never runs
        head = st
        exits: list[State] = []
        for _ in range(64):  # labels only grow, so this converges; the bound is a guard
            body_in = dict(head)
            if isinstance(s, ast.While):
                self.ev(s.test, body_in)
            else:
                self.assign(s.target, self.ev(s.iter, body_in), body_in)
            self._loops.append({"break": [], "continue": []})
            end = self.block(s.body, body_in)
            jumps = self._loops.pop()
            exits = jumps["break"]
            new_head = head
            for state in [end, *jumps["continue"]]:
                if state is not None:
                    new_head = _join(new_head, state)
            if new_head == head:
                break
            head = new_head
        forever = isinstance(s, ast.While) and _constant_truth(s.test) is True
        out = None if forever else self.block(s.orelse, head)  # `while True` ends only by break
        for state in exits:
            out = _join_opt(out, state)
        return out


def _join_opt(a: State | None, b: State | None) -> State | None:
    if a is None:
        return b
    if b is None:
        return a
    return _join(a, b)


_FOLDABLE = (ast.Constant, ast.Tuple, ast.List, ast.Set, ast.Dict, ast.Compare, ast.BoolOp, ast.UnaryOp,
             ast.Load, ast.Not, ast.And, ast.Or, ast.USub, ast.UAdd, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt,
             ast.GtE, ast.Is, ast.IsNot, ast.In, ast.NotIn, ast.expr_context)


def _constant_truth(node: ast.AST) -> bool | None:
    """The truth of a condition made only of constants (`False`, `()`, `not True`, `1 == 2`), None otherwise.
    No arithmetic is folded (no `10 ** 10 ** 10` to compute), so evaluating it is cheap and safe."""
    if not all(isinstance(n, _FOLDABLE) for n in ast.walk(node)):
        return None
    try:
        return bool(eval(compile(ast.Expression(body=node), "<condition>", "eval"), {"__builtins__": {}}, {}))
    except Exception:  # e.g. 1 < 'a': not a constant truth
        return None


def _is_zero(node: ast.AST) -> bool:
    """A constant that makes a product with a string empty: 0, False, a negative int."""
    v = _const_int(node)
    if v is None and isinstance(node, ast.Constant) and isinstance(node.value, bool):
        v = int(node.value)
    return v is not None and v <= 0


def _literal_item(container: ast.AST, key: object) -> ast.AST | None:
    """The element of a tuple/list/dict literal at a constant index or key, or None if it cannot be told."""
    if isinstance(container, (ast.Tuple, ast.List)) and type(key) is int:
        if any(isinstance(e, ast.Starred) for e in container.elts) or not -len(container.elts) <= key < len(container.elts):
            return None
        return container.elts[key]
    if isinstance(container, ast.Dict):
        hit = None
        for k, v in zip(container.keys, container.values):
            if k is None or not isinstance(k, ast.Constant):
                return None  # a computed key or **spread: any value may be the one
            if k.value == key:
                hit = v  # the last one wins, as in Python
        return hit
    return None


def _const_int(node: ast.AST | None) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        v = _const_int(node.operand)
        return None if v is None else -v
    return None


def _empty_slice(node: ast.AST) -> bool:
    """`[:0]`, `[n:n]`, `[5:2]` with constant bounds (and no step): an empty result."""
    if not isinstance(node, ast.Slice) or node.upper is None or (node.step is not None
                                                                 and _const_int(node.step) != 1):
        return False
    lo, hi = (0 if node.lower is None else _const_int(node.lower)), _const_int(node.upper)
    return lo is not None and hi is not None and lo >= 0 and hi >= 0 and hi <= lo


def _empty_iterable(node: ast.AST) -> bool:
    """`range(0)`, `range(5, 2)`, `[]`, `()`, `''`: a loop over it never runs its body."""
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)) and not node.elts:
        return True
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)) and not node.value:
        return True
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range"
            and not node.keywords and 1 <= len(node.args) <= 2):
        bounds = [_const_int(a) for a in node.args]
        if None in bounds:
            return False
        lo, hi = (0, bounds[0]) if len(bounds) == 1 else bounds
        return hi <= lo
    return False


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
                if prog.mutations.get(name, {}) != f.mutations:
                    prog.mutations[name] = f.mutations
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
