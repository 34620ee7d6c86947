"""Code benchmarks: getting code out of a model's text, building the test programs, scoring by running them.

The programs built here are plain Python scripts; running them is the job of an injected `run_code`
(the sandbox, `spogw_dagster/isolation.py`), an async callable `(program: str) -> result` whose result
has `.status` (a `Status` or its value), `.returncode`, `.stdout`, `.stderr`.

A hidden-test program prints a pass token (derived from the program's text) after the last check; a
program that passes must exit 0 *and* print it. So a solution that calls `sys.exit(0)` / `os._exit(0)`
while being imported, before any test ran, does not pass.

Before the hidden tests run, the entry point is rebound to a wrapper that lets only plain data out:
None, bool, int, float, complex, str, bytes, and list/tuple/dict/set/frozenset of those (recursively),
by exact type (C-implemented numeric/string subclasses such as numpy.float64 and numpy scalars are
also accepted; they cannot be defined by the solution). Anything else (e.g. an object whose `__eq__`
always returns True, which would pass every `assert candidate(x) == y`) raises a TypeError, so the tests
fail. While the entry point runs, its global name is the unwrapped function again (recursion stays
direct and is checked once, at the top), then the wrapper is put back.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from ..types import Problem, Status

PUBLIC_RESULT_PREFIX = "@@spogw-public-test "

RunCode = Callable[[str], Awaitable[Any]]


class ScoringInfrastructureError(RuntimeError):
    """The scoring machinery itself failed (not the solution): never turned into a score."""


@dataclass(frozen=True)
class ScoreDetail:
    """One score in [0, 1] with a short human-readable detail (extracted answer or failure reason)."""

    score: float
    detail: str = ""
    extracted: str = ""  # the answer/code that was compared or run (truncated for code)

    def __post_init__(self) -> None:
        if not (0.0 <= self.score <= 1.0):
            raise ValueError(f"score must be in [0, 1], got {self.score}")


# ---------------------------------------------------------------------------------------------------
# extraction

_FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)
_PY_LANGS = {"", "python", "py", "python3", "py3"}
_CODE_START = re.compile(r"^(?:def |async def |class |import |from \S+ import |@)", re.M)
_MAX_TRIM_LINES = 200


def _fenced_blocks(text: str) -> list[str]:
    return [body for lang, body in _FENCE_RE.findall(text) if lang.lower() in _PY_LANGS]


def _defines(tree: ast.Module, name: str) -> bool:
    return any(
        isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == name for n in tree.body
    )


def _parse_prefix(src: str) -> tuple[str, ast.Module] | None:
    """The longest prefix of `src` (by whole lines, dropping at most _MAX_TRIM_LINES) that parses."""
    lines = src.splitlines()
    for cut in range(len(lines), max(len(lines) - _MAX_TRIM_LINES, 0), -1):
        chunk = "\n".join(lines[:cut])
        try:
            return chunk, ast.parse(chunk)
        except (SyntaxError, ValueError):
            continue
    return None


def _parse_lenient(src: str) -> tuple[str, ast.Module] | None:
    """Parse `src`, blanking unindented prose lines that break the parse ("Here is the function:"),
    then falling back to the longest parsable prefix."""
    lines = src.splitlines()
    for _ in range(50):
        chunk = "\n".join(lines)
        try:
            return chunk, ast.parse(chunk)
        except (SyntaxError, ValueError) as e:
            k = (getattr(e, "lineno", None) or 0) - 1
            if 0 <= k < len(lines) and lines[k].strip() and not lines[k][0].isspace() and not _CODE_START.match(lines[k]):
                lines[k] = ""
                continue
            break
    return _parse_prefix("\n".join(lines))


def _referenced_names(nodes: list[ast.stmt]) -> set[str]:
    return {n.id for node in nodes for n in ast.walk(node) if isinstance(n, ast.Name)}


def _keep_definitions(src: str, tree: ast.Module) -> str:
    """Top-level imports, functions and classes, plus module-level assignments they use; test calls,
    prints and `if __name__ == "__main__":` blocks are dropped."""
    lines = src.splitlines()
    kinds = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    kept = {id(n) for n in tree.body if isinstance(n, kinds)}
    assigns = [n for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))]
    changed = True
    while changed:  # an assignment is kept if a kept definition or kept assignment uses its names
        changed = False
        used = _referenced_names([n for n in tree.body if id(n) in kept and not isinstance(n, (ast.Import, ast.ImportFrom))])
        for node in assigns:
            if id(node) in kept:
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            if names & used:
                kept.add(id(node))
                changed = True
    keep = [n for n in tree.body if id(n) in kept]
    chunks = []
    for node in keep:
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        seg = lines[first - 1 : node.end_lineno]
        # cut the last line where the statement ends: `import os; os._exit(0)` keeps only the import
        # (ast column offsets count UTF-8 bytes)
        raw = seg[-1].encode()
        if raw[node.end_col_offset :].lstrip().startswith(b";"):
            seg[-1] = raw[: node.end_col_offset].decode(errors="ignore")
        chunks.append("\n".join(seg))
    return "\n\n".join(chunks).strip()


def extract_code(text: str, entry_point: str = "") -> str:
    """Python code from a model's answer: markdown fences or raw text; "" when none is found.

    From fenced blocks (```python / ```py / ``` ; an unclosed last fence counts, for cut-off output)
    take the last one that defines `entry_point`, else the longest. Without fences, take the whole
    text, or (if that does not yield the entry point) the text from the first line that begins a
    definition or import. Unindented prose lines that break parsing are blanked; trailing lines that
    still do not parse (cut-off output) are dropped. Of the result keep only imports, functions,
    classes and the module-level assignments they use, in their original order and text.
    """
    if not text or not text.strip():
        return ""
    text = text.replace("\r\n", "\n")
    blocks = _fenced_blocks(text)
    candidates: list[str]
    if blocks:
        with_entry = [b for b in blocks if entry_point and re.search(rf"\bdef\s+{re.escape(entry_point)}\s*\(", b)]
        candidates = [with_entry[-1]] if with_entry else [max(blocks, key=len)]
    else:
        m = _CODE_START.search(text)
        candidates = [text] + ([text[m.start() :]] if m and m.start() > 0 else [])
    results = []
    for cand in candidates:
        parsed = _parse_lenient(cand.strip("\n"))
        if parsed is None:
            continue
        code = _keep_definitions(*parsed)
        if code:
            results.append(code + "\n")
    for code in results:
        if not entry_point or _code_defines(code, entry_point):
            return code
    return results[0] if results else ""


def solution_code(problem: Problem, text: str) -> str:
    """The program to test for `problem` from a model's answer.

    For HumanEval-style problems whose question is the function header (prompt completion), an answer
    that is only the function body is accepted: if the extracted code does not define the entry point
    but the prompt does, the prompt + the answer are tried instead.
    """
    code = extract_code(text, problem.entry_point)
    ep = problem.entry_point
    if ep and not _code_defines(code, ep) and _code_defines(problem.question, ep):
        blocks = _fenced_blocks(text)
        completion = (blocks[-1] if blocks else text).strip("\n")
        joined = problem.question.rstrip("\n") + "\n" + completion + "\n"
        # only a completion that parses as a whole with the prompt (no trimming) and gives the entry
        # point a body: the bare prompt's function has nothing but its docstring
        if completion.strip() and _has_body(joined, ep):
            return extract_code(joined, ep)
    return code


def _has_body(code: str, name: str) -> bool:
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
                body = body[1:]  # the docstring
            return bool(body)
    return False


def _code_defines(code: str, name: str) -> bool:
    try:
        return _defines(ast.parse(code), name)
    except (SyntaxError, ValueError):
        return False


# ---------------------------------------------------------------------------------------------------
# programs


def _preamble(problem: Problem) -> str:
    return str(problem.meta.get("code_preamble") or "").strip()


def _test_style(problem: Problem) -> str:
    style = problem.meta.get("test_style")
    if style in ("check", "asserts"):
        return style
    return "check" if re.search(r"^def check\(", problem.hidden_tests, re.M) else "asserts"


def pass_token(program_without_token: str) -> str:
    return "SPOGW-HIDDEN-TESTS-PASSED-" + hashlib.sha256(program_without_token.encode()).hexdigest()[:16]


def build_test_program(problem: Problem, solution_code: str) -> str:
    """Solution + hidden tests (+ `check(<entry_point>)` for HumanEval-style tests) + the pass token.

    Layout: the prompt's preamble (imports and helpers, HumanEval), the solution, the result guard
    (rebinds the entry point to a wrapper accepting only plain-data results, see the module docstring),
    the hidden tests (HumanEval: the `test` program then `check(entry_point)`; MBPP: setup code then the
    asserts), then a line printing the pass token. Exit status 0 and the token on stdout mean every test
    passed.
    """
    return _test_program_and_token(problem, solution_code)[0]


# Rebinds the entry point (name in {name!r}) to a wrapper that rejects non-plain results. Types come from
# literals (and a frozenset constant), not builtin names, so a solution that patched builtins at import
# time cannot widen the check; type(), __flags__ and __mro__ are read through `type`'s own descriptors.
_RESULT_GUARD = """
def __spogw_guard_entry_point(__fn, __name):
    _type = (0).__class__.__class__
    _flags = _type.__dict__["__flags__"].__get__
    _mro = _type.__dict__["__mro__"].__get__
    _scalars = (None.__class__, True.__class__, (0).__class__, (0.0).__class__, (0j).__class__,
                "".__class__, b"".__class__)
    _frozenset = frozenset
    for c in (lambda: 0 in {{0}}).__code__.co_consts:  # the compiler folds {{0}} into a frozenset constant
        if c.__class__ not in _scalars:
            _frozenset = c.__class__
    _containers = ([].__class__, ().__class__, {{0}}.__class__, _frozenset)
    _dict = {{}}.__class__

    def _native_scalar(t):  # a C-implemented scalar type, e.g. numpy.float64 / numpy.int64
        if _flags(t) & (1 << 9):  # a heap type: defined in Python (by the solution, possibly)
            return False
        for b in _mro(t):
            if b in _scalars:
                return True
            if not _flags(b) & (1 << 9) and b.__module__ == "numpy" and b.__name__ in ("number", "bool_", "bool"):
                return True
        return False

    def _plain(value):
        stack = [value]
        seen = {{}}.__class__()
        while stack:
            v = stack.pop()
            t = _type(v)
            if t in _scalars:
                continue
            if t in _containers or t is _dict:
                if id(v) in seen:
                    continue
                seen[id(v)] = v
                if t is _dict:
                    for k, x in _dict.items(v):
                        stack.append(k)
                        stack.append(x)
                else:
                    stack.extend(v)
                continue
            if _native_scalar(t):
                continue
            raise TypeError(
                "%s returned a %s.%s: only None, bool, int, float, complex, str, bytes and "
                "list/tuple/dict/set/frozenset of those are accepted" % (__name, t.__module__, t.__qualname__))

    _globals = (lambda: 0).__globals__  # this module's namespace
    if _globals.get(__name) is not __fn:
        _globals = None

    def __spogw_checked(*args, **kwargs):
        if _globals is not None:
            _globals[__name] = __fn  # recursion inside the call is direct (and unchecked)
        try:
            result = __fn(*args, **kwargs)
        finally:
            if _globals is not None:
                _globals[__name] = __spogw_checked
        _plain(result)
        return result

    try:
        __spogw_checked.__name__ = __name
        __spogw_checked.__doc__ = __fn.__doc__
        __spogw_checked.__wrapped__ = __fn
    except Exception:
        pass
    return __spogw_checked


{name} = __spogw_guard_entry_point({name}, {name!r})
"""


def _result_guard(entry_point: str) -> str:
    return _RESULT_GUARD.format(name=entry_point).strip()


def _test_program_and_token(problem: Problem, solution_code: str) -> tuple[str, str]:
    if not problem.hidden_tests.strip():
        raise ValueError(f"problem {problem.id} has no hidden tests")
    parts = []
    pre = _preamble(problem)
    if pre:
        parts.append(pre)
    parts.append(solution_code.strip())
    if problem.entry_point:
        if not problem.entry_point.isidentifier():
            raise ValueError(f"problem {problem.id}: entry_point {problem.entry_point!r} is not a Python name")
        parts.append(_result_guard(problem.entry_point))
    parts.append(problem.hidden_tests.strip())
    if _test_style(problem) == "check":
        if not problem.entry_point:
            raise ValueError(f"problem {problem.id} uses check(candidate) tests but has no entry_point")
        parts.append(f"check({problem.entry_point})")
    body = "\n\n".join(parts) + "\n"
    token = pass_token(body)
    return body + f"\n__import__('sys').stdout.write({token!r} + '\\n')\n", token


def build_public_test_program(problem: Problem, solution_code: str, tests: list[str] | None = None) -> str:
    """Solution + each public test run on its own, reporting one JSON line per test.

    Each line is PUBLIC_RESULT_PREFIX + {"index", "test", "passed", "error"}; read them back with
    `parse_public_test_results`. The program exits 1 if any test failed, 0 if all passed. `tests`
    defaults to problem.public_tests. MBPP setup code (e.g. imports the asserts use) runs first.
    """
    tests = list(problem.public_tests if tests is None else tests)
    parts = []
    pre = _preamble(problem)
    if pre:
        parts.append(pre)
    parts.append(solution_code.strip())
    setup = str(problem.meta.get("test_setup_code") or "").strip()
    if setup:
        parts.append(setup)
    runner = f"""
def __spogw_run_public_tests(__tests):
    import json as _json, sys as _sys
    _failed = 0
    for _i, _t in enumerate(__tests):
        try:
            exec(compile(_t, "<public test %d>" % _i, "exec"), globals())
            _rec = {{"index": _i, "test": _t, "passed": True, "error": ""}}
        except BaseException as _e:  # a failing test must not stop the others (SystemExit included)
            _failed += 1
            _rec = {{"index": _i, "test": _t, "passed": False, "error": (type(_e).__name__ + ": " + str(_e))[:300]}}
        _sys.stdout.write({PUBLIC_RESULT_PREFIX!r} + _json.dumps(_rec) + "\\n")
        _sys.stdout.flush()
    _sys.exit(1 if _failed else 0)


__spogw_run_public_tests({json.dumps(tests)})
"""
    parts.append(runner.strip())
    return "\n\n".join(parts) + "\n"


def parse_public_test_results(stdout: str) -> list[dict[str, Any]]:
    """The per-test records printed by a public-test program (in order; tests never reached are absent)."""
    out = []
    for line in (stdout or "").splitlines():
        if line.startswith(PUBLIC_RESULT_PREFIX):
            try:
                rec = json.loads(line[len(PUBLIC_RESULT_PREFIX) :])
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and "passed" in rec:
                out.append(rec)
    return out


# ---------------------------------------------------------------------------------------------------
# scoring


def _status_of(result: Any) -> Status:
    raw = getattr(result, "status", None)
    try:
        return raw if isinstance(raw, Status) else Status(raw)
    except ValueError:
        raise ScoringInfrastructureError(f"run_code returned an unknown status {raw!r}") from None


def _last_line(s: str, limit: int = 200) -> str:
    lines = [ln for ln in (s or "").strip().splitlines() if ln.strip()]
    return lines[-1][:limit] if lines else ""


async def score_code(problem: Problem, solution_text: str, run_code: RunCode) -> ScoreDetail:
    """pass@1 of one answer: 1.0 if the hidden tests pass, else 0.0.

    No code, a syntax error or a missing entry point give 0.0 without running anything. Otherwise the
    test program runs through `run_code`; it passes when the status is OK, the return code 0 and the
    pass token was printed. If `run_code` raises, or reports EXECUTOR_ERROR (an infrastructure failure,
    not the solution's), the error propagates: it is never turned into a score.
    """
    code = solution_code(problem, solution_text or "")
    if not code.strip():
        return ScoreDetail(0.0, "no code found in the answer")
    try:
        compile(code, "<solution>", "exec")
    except (SyntaxError, ValueError) as e:
        return ScoreDetail(0.0, f"syntax error: {getattr(e, 'msg', e)}", code[:2000])
    ep = problem.entry_point
    if ep and not _code_defines(code, ep) and not _code_defines(_preamble(problem), ep):
        return ScoreDetail(0.0, f"the answer does not define {ep}", code[:2000])
    program, token = _test_program_and_token(problem, code)
    result = await run_code(program)
    status = _status_of(result)
    if status is Status.EXECUTOR_ERROR:
        raise ScoringInfrastructureError(f"run_code reported executor_error for {problem.id}: {_last_line(getattr(result, 'stderr', ''))}")
    rc = getattr(result, "returncode", None)
    stdout = getattr(result, "stdout", "") or ""
    if status is Status.OK and rc == 0 and token and token in stdout:
        return ScoreDetail(1.0, "passed", code[:2000])
    if status is not Status.OK:
        why = f"{status.value}"
    elif rc != 0:
        why = f"exit code {rc}"
    else:
        why = "exited before the tests finished"
    err = _last_line(getattr(result, "stderr", "") or "")
    return ScoreDetail(0.0, f"failed: {why}" + (f": {err}" if err else ""), code[:2000])
