"""From a generator's raw text to a validated workflow, or a precise reason why not.

Two statuses come out of here: `format_error` (no workflow code could be found in the text) and `invalid`
(code found, but it does not parse or breaks a rule). The rules are an allow-list: only the offered
operators, a fixed set of builtins, no imports except `math`, no dunder or frame attributes, no
`format` tricks, and size limits. They are the first wall; the sandbox is the second.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from ..contracts import Status
from .template import OPERATORS, WORKFLOW_HEADER, operator_names

SAFE_BUILTINS: frozenset[str] = frozenset({
    "abs", "all", "any", "bool", "dict", "enumerate", "filter", "float", "int", "isinstance", "len", "list",
    "map", "max", "min", "print", "range", "reversed", "round", "set", "sorted", "str", "sum", "tuple", "zip",
    "Exception", "ValueError", "TypeError", "KeyError", "IndexError", "RuntimeError", "OperatorError",
    "True", "False", "None",
})
# C-implemented module with no submodules: nothing reachable from it by attribute access.
ALLOWED_IMPORTS: frozenset[str] = frozenset({"math"})

# The only attributes a workflow may touch on values other than `self` and `math`: plain string, list,
# dict and set methods, and only as the callee of a call. Everything else (coroutine `.send`, future
# `.get_loop`, `.cr_frame`, `.format`, ...) is out: an allow-list, not a deny-list.
SAFE_METHODS: frozenset[str] = frozenset({
    # str
    "capitalize", "casefold", "center", "count", "endswith", "find", "index", "isalnum", "isalpha",
    "isdecimal", "isdigit", "islower", "isnumeric", "isspace", "istitle", "isupper", "join", "ljust", "lower",
    "lstrip", "partition", "removeprefix", "removesuffix", "replace", "rfind", "rindex", "rjust", "rpartition",
    "rsplit", "rstrip", "split", "splitlines", "startswith", "strip", "swapcase", "title", "upper", "zfill",
    # list / dict / set
    "append", "clear", "copy", "extend", "insert", "pop", "remove", "reverse", "sort", "get", "items", "keys",
    "values", "update", "setdefault", "popitem", "add", "discard", "union", "intersection", "difference",
    "issubset", "issuperset",
})

_FORBIDDEN_NODES = (
    ast.Global, ast.Nonlocal, ast.Yield, ast.YieldFrom, ast.With, ast.AsyncWith, ast.AsyncFor, ast.Match,
)
# Frame/code attributes of coroutines, generators and tracebacks lead back to globals and builtins.
_FRAME_ATTR = re.compile(r"^(gi|cr|ag|tb|f)_")
_FORBIDDEN_ATTRS = frozenset({"format", "format_map", "mro"})


@dataclass(frozen=True)
class ValidationLimits:
    max_chars: int = 6000
    max_nodes: int = 1500
    max_operator_call_sites: int = 16


@dataclass
class ParsedWorkflow:
    code: str
    operator_call_sites: int
    operators_used: tuple[str, ...]
    repaired: bool = False  # trailing text after the workflow was cut off


class WorkflowRejected(Exception):
    def __init__(self, status: Status, reason: str):
        super().__init__(reason)
        self.status = status
        self.reason = reason


_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)(?:```|\Z)", re.DOTALL)
_GRAPH = re.compile(r"<graph>(.*?)(?:</graph>|\Z)", re.DOTALL)


def extract_code(text: str) -> str:
    """Find the workflow class in free text: <graph> tags, a markdown fence, or raw code."""
    if not isinstance(text, str) or not text.strip():
        raise WorkflowRejected(Status.FORMAT_ERROR, "empty generator output")
    candidates = [m.group(1) for m in _GRAPH.finditer(text)] + [m.group(1) for m in _FENCE.finditer(text)] + [text]
    for cand in candidates:
        idx = cand.find("class Workflow")
        if idx >= 0:
            # keep the imports written above the class (the validator decides which are allowed)
            imports = [ln for ln in cand[:idx].splitlines() if re.match(r"(import|from)\s+\w", ln)]
            return "".join(ln + "\n" for ln in imports) + cand[idx:].strip("\n") + "\n"
    raise WorkflowRejected(Status.FORMAT_ERROR, "no `class Workflow` found in the generator output")


def _longest_parseable_prefix(code: str) -> tuple[str, bool]:
    """Small models often write a good workflow and then keep going; keep the longest prefix that parses."""
    try:
        ast.parse(code)
        return code, False
    except SyntaxError:
        pass
    except (RecursionError, MemoryError, ValueError):
        raise WorkflowRejected(Status.INVALID, "workflow is too deeply nested to parse") from None
    lines = code.splitlines(keepends=True)
    for end in range(len(lines) - 1, 1, -1):
        prefix = "".join(lines[:end])
        try:
            ast.parse(prefix)
            return prefix, True
        except (SyntaxError, RecursionError, MemoryError, ValueError):
            continue
    raise WorkflowRejected(Status.INVALID, "the workflow code does not parse (syntax error)")


def _bound_names(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
    return names


def validate(code: str, family: str, limits: ValidationLimits = ValidationLimits()) -> ParsedWorkflow:
    """Check workflow code against the rules; raise WorkflowRejected(INVALID, reason) on the first breach
    (size, then the class's shape, then every syntax node in `ast.walk` order, then the call sites, then
    statements that can never run)."""
    tree, nodes = _parse_bounded(code, limits)
    cls, methods = _workflow_class(tree)
    scope = _Scope.of(tree, nodes, cls, methods, family)
    calls = [op for node in nodes if (op := _check_node(node, scope)) is not None]
    if not calls:
        raise _bad("the workflow calls no operator")
    try:  # what ast.parse accepts but the compiler refuses, e.g. a repeated keyword argument
        compile(tree, "<workflow>", "exec")
    except (SyntaxError, ValueError) as e:
        raise _bad(f"syntax error: {getattr(e, 'msg', e)}") from None
    if len(calls) > limits.max_operator_call_sites:
        raise _bad(f"workflow has {len(calls)} operator call sites; the limit is {limits.max_operator_call_sites}")
    _refuse_unreachable(nodes)
    return ParsedWorkflow(code=code, operator_call_sites=len(calls), operators_used=tuple(sorted(set(calls))))


_JUMPS = (ast.Return, ast.Raise, ast.Break, ast.Continue)


def _refuse_unreachable(nodes: list[ast.AST]) -> None:
    """A statement after `return` (or `raise`, `break`, `continue`) in the same block never runs. It is refused,
    not ignored: the trainer credits every token the generator wrote, so dead code that rode along with a good
    answer would be learned as if it had earned it (a measured case: `test(solution="Write the function.")`
    after `return`, which scores 0 wherever it does run)."""
    for node in nodes:
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if not isinstance(block, list):
                continue
            for stmt, after in zip(block, block[1:]):
                if isinstance(stmt, _JUMPS):
                    keyword = type(stmt).__name__.lower()
                    raise _bad(f"line {after.lineno} never runs: it comes after `{keyword}` (line {stmt.lineno}) "
                               f"in the same block; end the block with the `{keyword}`")


def _bad(reason: str) -> WorkflowRejected:
    return WorkflowRejected(Status.INVALID, reason)


def _parse_bounded(code: str, limits: ValidationLimits) -> tuple[ast.Module, list[ast.AST]]:
    """The syntax tree and its nodes, within the size limits."""
    if len(code) > limits.max_chars:
        raise _bad(f"workflow is {len(code)} characters; the limit is {limits.max_chars}")
    try:
        tree = ast.parse(code)
        nodes = list(ast.walk(tree))
    except SyntaxError as e:
        raise _bad(f"syntax error: {e.msg} (line {e.lineno})") from None
    except (RecursionError, MemoryError, ValueError) as e:  # e.g. thousands of nested unary operators
        raise _bad(f"workflow is too deeply nested to parse ({type(e).__name__})") from None
    if len(nodes) > limits.max_nodes:
        raise _bad(f"workflow has {len(nodes)} syntax nodes; the limit is {limits.max_nodes}")
    return tree, nodes


def _workflow_class(tree: ast.Module) -> tuple[ast.ClassDef, dict[str, ast.AST]]:
    """The one top-level `class Workflow` (imports and docstrings beside it) and its methods, with `run`."""
    body = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    imports = [n for n in body if isinstance(n, (ast.Import, ast.ImportFrom))]
    classes = [n for n in body if isinstance(n, ast.ClassDef)]
    if len(classes) != 1 or classes[0].name != "Workflow" or len(body) != len(classes) + len(imports):
        raise _bad("the code must define exactly one top-level `class Workflow` and nothing else")
    cls = classes[0]
    if cls.bases or cls.keywords or cls.decorator_list:
        raise _bad("class Workflow must not have bases, keywords or decorators")
    methods: dict[str, ast.AST] = {}
    for item in cls.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if item.decorator_list:
                raise _bad(f"method {item.name!r} must not have decorators")
            methods[item.name] = item
        elif isinstance(item, ast.Pass) or (isinstance(item, ast.Expr) and isinstance(item.value, ast.Constant)):
            continue
        else:
            raise _bad("class Workflow may contain only methods")
    run = methods.get("run")
    if not isinstance(run, ast.AsyncFunctionDef):
        raise _bad("class Workflow needs an `async def run(self)` method")
    if [a.arg for a in run.args.args] != ["self"] or run.args.vararg or run.args.kwarg or run.args.kwonlyargs:
        raise _bad("`run` must take only `self`")
    if not any(isinstance(n, ast.Return) and n.value is not None for n in ast.walk(run)):
        raise _bad("`run` never returns a value (it must end with `return <solution>`)")
    return cls, methods


@dataclass(frozen=True)
class _Scope:
    """What a node's check needs to know about the whole workflow."""

    family: str
    offered: frozenset[str]  # the operators of the benchmark's family
    cls: ast.ClassDef
    methods: dict[str, ast.AST]
    async_methods: frozenset[str]
    bound: frozenset[str]  # every name the workflow binds (assignments, arguments, defs, imports)
    self_attrs: frozenset[str]  # attributes the workflow assigns on self
    module_names: frozenset[str]  # names of imported modules
    parent: dict[int, ast.AST]  # id(node) -> its parent node

    @classmethod
    def of(cls, tree: ast.Module, nodes: list[ast.AST], workflow: ast.ClassDef, methods: dict[str, ast.AST],
           family: str) -> "_Scope":
        parent: dict[int, ast.AST] = {}
        for node in nodes:
            for child in ast.iter_child_nodes(node):
                parent[id(child)] = node
        return cls(
            family=family, offered=frozenset(operator_names(family)), cls=workflow, methods=methods,
            async_methods=frozenset(n for n, m in methods.items() if isinstance(m, ast.AsyncFunctionDef)),
            bound=frozenset(_bound_names(tree)),
            self_attrs=frozenset(n.attr for n in nodes if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
                                 and isinstance(n.value, ast.Name) and n.value.id == "self"),
            module_names=frozenset((a.asname or a.name) for n in nodes if isinstance(n, ast.Import) for a in n.names),
            parent=parent)


def _check_node(node: ast.AST, sc: _Scope) -> str | None:
    """Raise on the first rule `node` breaks; the operator's name when it is an operator call site."""
    if isinstance(node, _FORBIDDEN_NODES):
        raise _bad(f"`{type(node).__name__}` statements are not allowed in a workflow")
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        for m in mods:
            if m not in ALLOWED_IMPORTS or (isinstance(node, ast.ImportFrom) and node.level):
                raise _bad(f"import of {m!r} is not allowed (allowed: {sorted(ALLOWED_IMPORTS)})")
    if isinstance(node, ast.ClassDef) and node is not sc.cls:
        raise _bad("nested classes are not allowed")
    if isinstance(node, ast.Name):
        if node.id.startswith("__"):
            raise _bad(f"dunder name {node.id!r} is not allowed")
        if isinstance(node.ctx, ast.Load) and node.id not in sc.bound and node.id not in SAFE_BUILTINS:
            raise _bad(f"name {node.id!r} is not allowed (not an allowed builtin and never assigned)")
    if isinstance(node, ast.Attribute):
        _check_attribute(node, sc)
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)) and (
        "__" in (node.value if isinstance(node.value, str) else node.value.decode("latin-1"))
    ):
        raise _bad("string constants containing '__' are not allowed")
    if isinstance(node, ast.Call):
        return _check_operator_call(node, sc)
    return None


def _check_attribute(node: ast.Attribute, sc: _Scope) -> None:
    if node.attr.startswith("_") or _FRAME_ATTR.match(node.attr) or node.attr in _FORBIDDEN_ATTRS:
        raise _bad(f"attribute {node.attr!r} is not allowed")
    on_self = isinstance(node.value, ast.Name) and node.value.id == "self"
    on_module = isinstance(node.value, ast.Name) and node.value.id in sc.module_names
    up = sc.parent.get(id(node))
    if on_self and isinstance(node.ctx, ast.Load):
        if node.attr in OPERATORS and node.attr not in sc.offered:
            raise _bad(f"operator {node.attr!r} is not offered for {sc.family} benchmarks; "
                       f"offered: {sorted(sc.offered)}")
        if node.attr not in sc.offered and node.attr not in sc.methods and node.attr not in sc.self_attrs:
            raise _bad(f"`self.{node.attr}` is neither an offered operator nor defined by the workflow")
        if node.attr in sc.offered or node.attr in sc.async_methods:
            # The coroutine must be awaited on the spot: never stored, passed or driven by hand.
            awaited = isinstance(up, ast.Call) and up.func is node and isinstance(sc.parent.get(id(up)), ast.Await)
            if not awaited:
                raise _bad(f"`self.{node.attr}(...)` must be called and awaited directly: "
                           f"`await self.{node.attr}(...)`")
    elif not on_self and not on_module:
        if not (isinstance(up, ast.Call) and up.func is node and node.attr in SAFE_METHODS):
            raise _bad(f"attribute {node.attr!r} is not allowed (only string, list, dict and set methods, "
                       f"called directly)")


def _check_operator_call(node: ast.Call, sc: _Scope) -> str | None:
    """The operator's name when `node` calls an offered operator on self with arguments its signature takes."""
    f = node.func
    if not (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self"
            and f.attr in sc.offered):
        return None
    spec = OPERATORS[f.attr]
    if len(node.args) > len(spec.params):
        raise _bad(f"{f.attr}() takes at most {len(spec.params)} argument(s): {spec.signature}")
    for kw in node.keywords:
        if kw.arg is None or kw.arg not in spec.params:
            raise _bad(f"{f.attr}() got an unexpected argument {kw.arg!r}: {spec.signature}")
    if len(node.args) + len(node.keywords) < spec.required:
        raise _bad(f"{f.attr}() is missing a required argument: {spec.signature}")
    return f.attr


def parse_workflow(text: str, family: str, *, completion: bool = False,
                   limits: ValidationLimits = ValidationLimits()) -> ParsedWorkflow:
    """Extract, repair trailing junk, and validate.

    completion=True: `text` is a completion of `generator_prompt`, i.e. the body of `run` after the
    prefilled header and indentation.
    """
    if completion:
        if not text or not text.strip():
            raise WorkflowRejected(Status.FORMAT_ERROR, "empty generator output")
        code = _completion_code(text, limits)
    else:
        code = extract_code(text)
    if len(code) > limits.max_chars:  # before the repair loop, which parses many prefixes
        raise WorkflowRejected(Status.INVALID, f"workflow is {len(code)} characters; the limit is {limits.max_chars}")
    code, repaired = _longest_parseable_prefix(code)
    parsed = validate(code, family, limits)
    parsed.repaired = repaired
    return parsed


def _in_class(body: str) -> str:
    """The class around a completion of `generator_prompt` (which prefilled 8 spaces); a line back at column 0
    (the next "# Task", another class) ends the workflow."""
    lines = (WORKFLOW_HEADER + "        " + body).splitlines()
    end = next((i for i, ln in enumerate(lines) if i >= 2 and ln.strip() and not ln[0].isspace()), len(lines))
    return "\n".join(lines[:end]).rstrip() + "\n"


def _completion_code(text: str, limits: ValidationLimits) -> str:
    """The workflow a completion means, read as written when that parses.

    The prompt ends with the body's 8 spaces, and a BPE tokenizer gives the first word its own leading space
    (` solution`), so the first line often lands one column right of the lines after it (measured: 255 of 256
    T = 1.0 completions of Qwen2.5-Coder-0.5B began with a space; 26 of them failed to parse for that alone).
    That space is the tokenizer's, not the model's choice of block: where the text as written does not parse,
    the first line's one extra column is dropped, and then also from every later line that carries it. Deeper
    first lines are the model's own indentation (never seen in 256 samples) and are read as written."""
    written = _in_class(text)
    if len(written) > limits.max_chars:  # before the readings below, which parse up to three of them
        raise WorkflowRejected(Status.INVALID, f"workflow is {len(written)} characters; the limit is {limits.max_chars}")
    readings = [written]
    if text.startswith(" ") and not text.startswith("  "):  # the first line one column right
        first, *rest = text.split("\n")
        readings.append(_in_class(text[1:]))
        readings.append(_in_class("\n".join([first[1:]] + [ln[1:] if ln.startswith(" " * 9) else ln for ln in rest])))
    for code in readings:
        try:
            ast.parse(code)
            return code
        except (SyntaxError, RecursionError, MemoryError, ValueError):
            continue
    return written  # none parses: the prefix repair decides, on the text as written
