"""Code benchmarks: getting code out of a model's text, and scoring it by running the tests.

Scoring runs the solution and its tests in two sandboxed processes (`verdict.judge`): the solution's
process answers each call of the tests with plain data, the test process decides, and the parent reads
the verdict from the test process only. See verdict.py for why and for what cannot cross.

Extraction keeps the module as the model wrote it (like the official human-eval harness, which execs
prompt + completion + tests as one program): top-level statements (lookup tables filled by loops,
`try: from math import gcd` / `except ImportError:`, a set filled by `.update(...)`, a lambda entry point,
a stray example call) all run when the solution's module loads; `if __name__ == "__main__":` blocks do not
run there (the module is not `__main__`, as in the harness), and reading stdin raises OSError (as in the
harness's swallow_io). Statements the tests cannot reach (a shadowed definition, a helper nothing reads:
`live_code`) are replaced by `pass` before the module runs, so what answer provenance did not judge cannot
decide the verdict. Where we differ from the harness, we are more lenient about the text: markdown
fences are taken apart, unindented prose lines that break parsing are blanked, a bare word or constant on a
line of its own is dropped, and a tail cut off mid-statement is dropped. And stricter about the tests: they
run with the prompt's own helpers (HumanEval/32's `poly`, /38's `encode_cyclic`), so a solution cannot pass
by redefining them.

The old single-process path (`score_code_single_process`, the program from `build_test_program`) is
kept for the scoring-overhead benchmark only: it is forgeable (frame introspection, `sys.settrace`,
`os._exit`) and must not produce rewards.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import re
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from ..contracts import Problem, Status
from .live_code import live_only
from .verdict import CodeSandbox, ScoringInfrastructureError, TestJob, Verdict, judge

RunCode = Callable[[str], Awaitable[Any]]


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
# What parsing or compiling untrusted text may raise: besides syntax errors, RecursionError ("maximum recursion
# depth exceeded during ast construction / compilation": a deep expression, e.g. 1+1+...+1 with ~3,000 terms)
# and MemoryError (the parser's own stack limit, e.g. ~6,000 nested `not`). Their threshold depends on how deep
# the caller's Python stack is, so text that parsed in the `code_generate` operator can fail when scored: it
# must score 0 (unparsable), never escape as an exception (which ended the whole exec-workflow command).
_UNPARSABLE = (SyntaxError, ValueError, RecursionError, MemoryError)


def _fenced_blocks(text: str) -> list[str]:
    return [body for lang, body in _FENCE_RE.findall(text) if lang.lower() in _PY_LANGS]


def _bound_at_top(body: list[ast.stmt]) -> set[str]:
    """Names a module binds when it runs: def, class, assignments, imports, for/with targets, looking into
    if/try/for/while/with blocks (not into functions or classes)."""
    names: set[str] = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names if a.name != "*")
            continue
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and (not isinstance(node, ast.AnnAssign) or node.value):
            targets = [node.target]
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            targets = [node.target]
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            targets = [i.optional_vars for i in node.items if i.optional_vars is not None]
        names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        for field_name in ("body", "orelse", "finalbody"):
            names |= _bound_at_top(getattr(node, field_name, None) or [])
        for handler in getattr(node, "handlers", None) or []:
            names |= _bound_at_top(handler.body)
    return names


def _defines(tree: ast.Module, name: str) -> bool:
    return name in _bound_at_top(tree.body)


def _parse_prefix(src: str) -> tuple[str, ast.Module] | None:
    """The longest prefix of `src` (by whole lines, dropping at most _MAX_TRIM_LINES) that parses."""
    lines = src.splitlines()
    for cut in range(len(lines), max(len(lines) - _MAX_TRIM_LINES, 0), -1):
        chunk = "\n".join(lines[:cut])
        try:
            return chunk, ast.parse(chunk)
        except _UNPARSABLE:
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
        except _UNPARSABLE as e:
            k = (getattr(e, "lineno", None) or 0) - 1
            if 0 <= k < len(lines) and lines[k].strip() and not lines[k][0].isspace() and not _CODE_START.match(lines[k]):
                lines[k] = ""
                continue
            break
    return _parse_prefix("\n".join(lines))


def _is_prose_word(node: ast.stmt) -> bool:
    """A bare name or constant on a line of its own ("Explanation", "Done"): prose that happens to parse.
    A docstring-like string constant goes too; calls (a stray example call) stay, as in the harness."""
    return isinstance(node, ast.Expr) and isinstance(node.value, (ast.Name, ast.Constant, ast.Attribute))


def _drop_prose_words(src: str, tree: ast.Module) -> str:
    lines = src.splitlines()
    for node in tree.body:
        if _is_prose_word(node) and node.lineno == node.end_lineno:
            line = lines[node.lineno - 1]
            if line[: node.col_offset].strip() == "" and line.encode()[node.end_col_offset :].strip() == b"":
                lines[node.lineno - 1] = ""
    return "\n".join(lines)


def extract_code(text: str, entry_point: str = "") -> str:
    """Python code from a model's answer: markdown fences or raw text; "" when none is found.

    From fenced blocks (```python / ```py / ``` ; an unclosed last fence counts, for cut-off output)
    take the last one that defines `entry_point`, else the longest. Without fences, take the whole
    text, or (if that does not yield the entry point) the text from the first line that begins a
    definition or import. Unindented prose lines that break parsing are blanked; trailing lines that
    still do not parse (cut-off output) are dropped; a bare word or constant on a line of its own is
    blanked. Every other top-level statement is kept, in its original order and text (see the module
    docstring: the module runs as the model wrote it).
    """
    if not text or not text.strip():
        return ""
    text = text.replace("\r\n", "\n")
    blocks = _fenced_blocks(text)
    candidates: list[str]
    if blocks:
        with_entry = [b for b in blocks if entry_point and (
            re.search(rf"\bdef\s+{re.escape(entry_point)}\s*\(", b) or _code_defines(b, entry_point))]
        candidates = [with_entry[-1]] if with_entry else [max(blocks, key=len)]
    else:
        m = _CODE_START.search(text)
        candidates = [text] + ([text[m.start() :]] if m and m.start() > 0 else [])
    results = []
    for cand in candidates:
        parsed = _parse_lenient(cand.strip("\n"))
        if parsed is None:
            continue
        code = _drop_prose_words(*parsed).strip()
        if code and any(not _is_prose_word(n) for n in parsed[1].body):
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
    except _UNPARSABLE:
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
    except _UNPARSABLE:
        return False


# ---------------------------------------------------------------------------------------------------
# test jobs: what the test process runs


def _preamble(problem: Problem) -> str:
    return str(problem.meta.get("code_preamble") or "").strip()


def _test_style(problem: Problem) -> str:
    style = problem.meta.get("test_style")
    if style in ("check", "asserts"):
        return style
    return "check" if re.search(r"^def check\(", problem.hidden_tests, re.M) else "asserts"


def _names_in(code: str) -> tuple[set[str], set[str]]:
    """(names the code reads, names it binds anywhere: assignments, defs, imports, parameters)."""
    try:
        tree = ast.parse(code)
    except _UNPARSABLE:
        return set(), set()
    read, bound = set(), set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name):
            (read if isinstance(n.ctx, ast.Load) else bound).add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(n.name)
        elif isinstance(n, ast.arg):
            bound.add(n.arg)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in n.names)
    return read, bound


def _solution_names(problem: Problem, solution: str, test_code: str) -> tuple[str, ...]:
    """The names the tests call for the solution: the entry point, plus any other name the tests read
    that the solution defines and neither the tests, the prompt's preamble nor Python's builtins do (an
    MBPP test may call a second function of the solution). Never a builtin: a solution that defines
    `abs` must not decide what `abs(candidate(x) - y) < 1e-6` says."""
    try:
        solution_binds = _bound_at_top(ast.parse(solution).body)
    except _UNPARSABLE:
        solution_binds = set()
    extra = (_free_names(problem, test_code) & solution_binds) - {problem.entry_point}
    return tuple([problem.entry_point] if problem.entry_point else []) + tuple(sorted(extra))


def _free_names(problem: Problem, test_code: str) -> set[str]:
    """The names `test_code` reads that neither it, the prompt's preamble nor Python's builtins bind."""
    read, bound = _names_in(test_code)
    _, preamble_binds = _names_in(_preamble(problem))
    return read - bound - preamble_binds - set(dir(builtins))


def tested_names(problem: Problem) -> frozenset[str]:
    """Every name the hidden tests may call on a solution, whatever the solution: the entry point and the
    other free names of the tests (what `hidden_test_job` binds is these, less what a solution does not
    define). `workflow.provenance` judges only the code these reach."""
    names = _free_names(problem, _preamble(problem) + "\n" + problem.hidden_tests)
    return frozenset(names | ({problem.entry_point} if problem.entry_point else set()))


def hidden_test_job(problem: Problem, solution: str = "") -> TestJob:
    """The hidden tests as a test-process job. HumanEval: setup = the prompt's preamble and the `test`
    program, one test `check(<entry_point>)`. MBPP: the setup code and the asserts as one test."""
    if not problem.hidden_tests.strip():
        raise ValueError(f"problem {problem.id} has no hidden tests")
    if problem.entry_point and not problem.entry_point.isidentifier():
        raise ValueError(f"problem {problem.id}: entry_point {problem.entry_point!r} is not a Python name")
    pre = _preamble(problem)
    if _test_style(problem) == "check":
        if not problem.entry_point:
            raise ValueError(f"problem {problem.id} uses check(candidate) tests but has no entry_point")
        setup = pre + "\n\n" + problem.hidden_tests.strip() + "\n"
        tests = (f"check({problem.entry_point})",)
    else:
        setup, tests = pre + "\n", (problem.hidden_tests.strip() + "\n",)
    return TestJob(setup, tests, _solution_names(problem, solution, setup + "\n".join(tests)))


def public_test_job(problem: Problem, tests: list[str] | None = None, solution: str = "") -> TestJob:
    """Public tests (default: problem.public_tests) as a job that runs and reports each one; the MBPP
    setup code (imports the asserts use) runs first."""
    tests = list(problem.public_tests if tests is None else tests)
    setup = "\n\n".join(x for x in (_preamble(problem), str(problem.meta.get("test_setup_code") or "").strip()) if x)
    return TestJob(setup + "\n", tuple(tests), _solution_names(problem, solution, setup + "\n" + "\n".join(tests)),
                   stop_at_first_failure=False)


def _module(problem: Problem, code: str) -> str:
    """What the solution's process runs: the prompt's preamble (imports and helpers a solution that only
    redefines the entry point relies on), then the solution."""
    pre = _preamble(problem)
    return (pre + "\n\n" if pre else "") + code.strip() + "\n"


# ---------------------------------------------------------------------------------------------------
# scoring


def _unrunnable(problem: Problem, code: str) -> ScoreDetail | None:
    """A 0 score for an answer with nothing to run (no code, a syntax error, no entry point), else None."""
    if not code.strip():
        return ScoreDetail(0.0, "no code found in the answer")
    try:
        compile(code, "<solution>", "exec")
    except _UNPARSABLE as e:
        return ScoreDetail(0.0, f"syntax error: {getattr(e, 'msg', e)}", code[:2000])
    ep = problem.entry_point
    if ep and not _code_defines(code, ep) and not _code_defines(_preamble(problem), ep):
        return ScoreDetail(0.0, f"the answer does not define {ep}", code[:2000])
    return None


async def score_code(problem: Problem, solution_text: str, sandbox: CodeSandbox) -> ScoreDetail:
    """pass@1 of one answer: 1.0 if the hidden tests pass, else 0.0 with the reason.

    No code, a syntax error or a missing entry point give 0.0 without running anything. Otherwise the
    verdict comes from `verdict.judge` (two sandboxed processes). Failures of the machinery itself
    (SandboxStartError, ScoringInfrastructureError) propagate: they are never turned into a score.
    """
    code = solution_code(problem, solution_text or "")
    early = _unrunnable(problem, code)
    if early is not None:
        return early
    # only what answer provenance judged runs: a statement it calls dead cannot decide the verdict
    code = live_only(code, tested_names(problem)) or code
    verdict = await judge(_module(problem, code), hidden_test_job(problem, code), sandbox)
    return ScoreDetail(1.0 if verdict.passed else 0.0, verdict.detail, code[:2000])


async def run_public_tests(problem: Problem, code: str, sandbox: CodeSandbox,
                           tests: list[str] | None = None) -> Verdict:
    """Run public tests (what the `test` operator may see) against solution `code`; one record per test.
    An answer with nothing to run fails every test without running anything."""
    tests = list(problem.public_tests if tests is None else tests)
    early = _unrunnable(problem, code)
    if early is not None:
        records = tuple({"index": i, "test": t, "passed": False, "error": early.detail} for i, t in enumerate(tests))
        return Verdict(False, f"failed: {early.detail}", records)
    return await judge(_module(problem, code), public_test_job(problem, tests, code), sandbox)


# ---------------------------------------------------------------------------------------------------
# LEGACY single-process path: forgeable, kept only so that bench/scoring_overhead.py can compare costs.
# Never use it for a reward.


def pass_token(program_without_token: str) -> str:
    return "SPOGW-HIDDEN-TESTS-PASSED-" + hashlib.sha256(program_without_token.encode()).hexdigest()[:16]


def build_test_program(problem: Problem, solution_code: str) -> str:
    """LEGACY (one process, forgeable). Solution + hidden tests (+ `check(<entry_point>)` for HumanEval-style tests) + the pass token.

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


def _status_of(result: Any) -> Status:
    raw = getattr(result, "status", None)
    try:
        return raw if isinstance(raw, Status) else Status(raw)
    except ValueError:
        raise ScoringInfrastructureError(f"run_code returned an unknown status {raw!r}") from None


def _last_line(s: str, limit: int = 200) -> str:
    lines = [ln for ln in (s or "").strip().splitlines() if ln.strip()]
    return lines[-1][:limit] if lines else ""


async def score_code_single_process(problem: Problem, solution_text: str, run_code: RunCode) -> ScoreDetail:
    """LEGACY, UNSAFE (forgeable; the scoring-overhead benchmark only): score_code in one process.

    The test program (`build_test_program`) runs through `run_code`; it passes when the status is OK, the return code 0 and the
    pass token was printed. If `run_code` raises, or reports EXECUTOR_ERROR (an infrastructure failure,
    not the solution's), the error propagates: it is never turned into a score.
    """
    code = solution_code(problem, solution_text or "")
    early = _unrunnable(problem, code)
    if early is not None:
        return early
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
