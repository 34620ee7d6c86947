"""Whose answer is it? The provenance of a workflow run's final answer (pure).

The generator designs a workflow; the executor answers. A workflow is free to carry text of its own (string
literals, strings it builds), and a generator that can see the task could write the solution itself and
return it, pass it through `test`, launder it through data flow after a real call, or ask the executor to
repeat it. Such an answer measures the generator's coding, not its workflow design, so it earns no credit.

The rule, decided at run time by the parent (the workflow cannot reach any of this):

- **Executor text** E: every executor reply of this run (the raw chat text: `custom`, `code_generate`,
  `review`, a `test` repair, ...), and the output of a program run by `programmer` when that program is
  itself the executor's by this rule. Operators that pass their input on (`test` whose public tests pass,
  `sc_ensemble`'s pick, a single-solution ensemble) add nothing: their output keeps its input's origin.
- **Workflow text** W: the workflow's own literals (every string constant in its code), and
  every operator argument *at the moment it is sent*, minus what is already executor text then. So a
  literal the executor is asked to echo is workflow text before the executor ever repeats it, while a draft
  the executor wrote and the workflow hands to `review` stays the executor's.
- Texts are compared as sequences of case-folded tokens (identifiers, numbers, single punctuation
  characters; layout and whitespace ignored) through their K-grams (K = 4; an answer shorter than K is one
  window). A token of the answer is *executor-credited* when some K-gram of the answer containing it occurs in
  E and none occurs in W. A code answer is judged without its comments.
- Math and QA: E is the set of answers the executor's replies would be scored as (the scorer's extractor
  normalises "1,200" and "1200" alike), so the answer is credited only when some reply answers it; a number a
  reply merely mentions is not its answer.
- The answer is what the scorer reads (`benchmarks.scored_text`: the tested code, the extracted number or
  short answer). For code, tokens covered by the problem statement (the signature and docstring any answer
  repeats) are neutral and left out, so the *substance* is the body; when nothing but the statement is left,
  every token counts.
- `share` = executor-credited substance tokens / substance tokens. The answer is the executor's when
  `share >= THRESHOLD` (0.5): honest post-processing (strip, extract a code block, prepend an import) keeps
  nearly all of it, a literal keeps almost none (measured: docs/security.md, "Whose answer is it?").
- Code, judged on the code the tests can run (`benchmarks.live_code`, which says what is live and neutral):
  shadowed definitions, unused helpers and `__main__` blocks do not count, nor do imports and aliases of the
  answer's own functions (unless an import binds a tested name). **Every** live statement must be the
  executor's (its own share >= THRESHOLD): an executor draft with the workflow's own entry point after it, or
  the workflow's code hidden behind executor helpers, is the workflow's. `share` is then the lowest live
  statement's share.

Origins: "executor" (credited), "workflow" (not: scores 0 and forfeits the reward's answer and executes
rungs) and "none" (nothing scorable was returned; it scores 0 by the benchmark anyway).

What it cannot see: a solution the executor is led to write without ever being sent it whole (dictated in
one prompt in pieces under K tokens with other text between them, or in another encoding the executor
decodes) is the executor's text. Pieces echoed by separate calls and joined by the workflow are not: every
window across a join is in no reply. Code the tests reach only through a name computed at run time
(`globals()[a + b]`) is not seen as live.
"""

from __future__ import annotations

import ast
import contextlib
import io
import re
import tokenize
from dataclasses import dataclass, field
from typing import Callable, Iterable

from ..benchmarks.live_code import live_statements

__all__ = ["K", "THRESHOLD", "EXECUTOR", "WORKFLOW", "NONE", "Provenance", "Origin", "tokens", "workflow_literals",
           "answer_origin", "code_origin"]

K = 4
THRESHOLD = 0.5
_TOKEN = re.compile(r"[A-Za-z_][A-Za-z_0-9]*|\d+|\S")
EXECUTOR, WORKFLOW, NONE = "executor", "workflow", "none"


def tokens(text: str) -> list[str]:
    """Case-folded tokens: a change of case (`.lower()` on an upper-case literal) keeps a text the same text."""
    return _TOKEN.findall((text or "").casefold())


def code_without_comments(code: str) -> str:
    """`code` without its comments, so that executor-written comments cannot pad an answer the workflow wrote
    (left as it is when it does not tokenize)."""
    try:
        toks = [t for t in tokenize.generate_tokens(io.StringIO(code).readline) if t.type != tokenize.COMMENT]
        return tokenize.untokenize(toks)
    except (tokenize.TokenError, IndentationError, SyntaxError, ValueError, RecursionError, MemoryError):
        return code


class NgramIndex:
    """Every n-gram (n = 1..K) of the texts added."""

    def __init__(self) -> None:
        self.grams: set[tuple[str, ...]] = set()

    def add(self, toks: list[str], keep=None) -> None:
        """Add toks' n-grams; with `keep`, only those for which keep(gram) is true."""
        for n in range(1, K + 1):
            for i in range(len(toks) - n + 1):
                g = tuple(toks[i:i + n])
                if keep is None or keep(g):
                    self.grams.add(g)

    def __contains__(self, gram: tuple[str, ...]) -> bool:
        return gram in self.grams


def _windows(n_tokens: int) -> list[tuple[int, int]]:
    """(start, end) of the K-windows over a sequence (one window when it is shorter than K)."""
    if n_tokens == 0:
        return []
    if n_tokens < K:
        return [(0, n_tokens)]
    return [(i, i + K) for i in range(n_tokens - K + 1)]


def _covered(toks: list[str], index: NgramIndex) -> list[bool]:
    """Per token: does some window of `toks` containing it occur in `index`?"""
    out = [False] * len(toks)
    for a, b in _windows(len(toks)):
        if tuple(toks[a:b]) in index:
            for j in range(a, b):
                out[j] = True
    return out


def workflow_literals(code: str) -> list[str]:
    """Every string constant in the workflow's code (f-string parts included). Numbers are left out: they are
    the workflow's structure (`range(3)`, `xs[0]`), and a number it computes is credited only where an executor
    reply holds it too."""
    try:
        tree = ast.parse(code or "")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
            v = node.value
            out.append(v.decode("latin-1") if isinstance(v, bytes) else v)
    return out


@dataclass(frozen=True)
class Origin:
    origin: str  # executor | workflow | none
    share: float  # executor-credited share of the answer's substance tokens (0 when there is none)
    substance_tokens: int


def answer_origin(scored: str, executor: NgramIndex, workflow: NgramIndex, neutral: NgramIndex | None = None,
                  threshold: float = THRESHOLD) -> Origin:
    toks = tokens(scored)
    if not toks:
        return Origin(NONE, 0.0, 0)
    in_e, in_w = _covered(toks, executor), _covered(toks, workflow)
    substance = list(range(len(toks)))
    if neutral is not None:
        is_neutral = _covered(toks, neutral)
        substance = [j for j in substance if not is_neutral[j]] or substance
    credited = sum(1 for j in substance if in_e[j] and not in_w[j])
    share = credited / len(substance)
    return Origin(EXECUTOR if share >= threshold else WORKFLOW, share, len(substance))


def code_origin(code: str, executor: NgramIndex, workflow: NgramIndex, neutral: NgramIndex | None,
                roots: Iterable[str], threshold: float = THRESHOLD) -> Origin:
    """The origin of a code answer (comments already left out), judged on its live statements: each must be the
    executor's. Windows are taken over the whole text, as `answer_origin` takes them, so an answer whose every
    statement is live is judged on the same windows; dead statements only stop counting. Without `roots`, or
    when the code does not parse or binds none of them, the whole text is judged (`answer_origin`)."""
    roots = tuple(roots)
    live = live_statements(code, roots) if roots else None
    if live is None:
        return answer_origin(code, executor, workflow, neutral, threshold)
    judged = [st for st in live if not st.neutral]
    owner = [-1] * (len(code) + 1)  # per character: the judged statement it belongs to
    for k, st in enumerate(judged):
        owner[st.start:st.end] = [k] * (st.end - st.start)
    # casefold character by character, keeping each folded character's source position (a fold may lengthen)
    folded, source = [], []
    for i, c in enumerate(code):
        f = c.casefold()
        folded.append(f)
        source.extend([i] * len(f))
    ms = list(_TOKEN.finditer("".join(folded)))
    toks = [m.group() for m in ms]
    stmt = [owner[source[m.start()]] for m in ms]
    if not any(k >= 0 for k in stmt):
        return answer_origin(code, executor, workflow, neutral, threshold)
    in_e, in_w = _covered(toks, executor), _covered(toks, workflow)
    is_neutral = _covered(toks, neutral) if neutral is not None else [False] * len(toks)
    per: dict[int, list[int]] = {}
    for j, k in enumerate(stmt):
        if k >= 0 and not is_neutral[j]:
            per.setdefault(k, []).append(j)
    if not per:  # nothing but the statement is left: every live token counts
        per = {-1: [j for j, k in enumerate(stmt) if k >= 0]}
    shares = [sum(1 for j in js if in_e[j] and not in_w[j]) / len(js) for js in per.values()]
    share = min(shares)
    return Origin(EXECUTOR if share >= threshold else WORKFLOW, share, sum(len(js) for js in per.values()))


@dataclass
class Provenance:
    """One run's record: what the executor wrote and what the workflow carried (each operator output's source
    is in the run's trace: `operators.Operators._source`)."""

    literals: Iterable[str] = ()
    statement: str | None = None  # the problem statement whose tokens are neutral (code problems)
    roots: tuple[str, ...] = ()  # code: the names the hidden tests call (`benchmarks.tested_names`)
    # math / QA: the scorer's extractor (`benchmarks.scored_text` bound to the problem); None for code
    extract: Callable[[str], str] | None = None
    answers: set[str] = field(default_factory=set)  # what each executor reply would be scored as
    threshold: float = THRESHOLD
    executor: NgramIndex = field(default_factory=NgramIndex)
    workflow: NgramIndex = field(default_factory=NgramIndex)
    neutral: NgramIndex | None = None

    def __post_init__(self) -> None:
        for lit in self.literals:
            self.workflow.add(tokens(lit))
        if self.statement is not None:
            self.neutral = NgramIndex()
            self.neutral.add(tokens(self.statement))

    def sent(self, value) -> None:
        """An operator argument the workflow sent: what is not executor text yet is the workflow's."""
        texts = value if isinstance(value, list) else [value]
        for t in texts:
            if isinstance(t, str):
                self.workflow.add(tokens(t), keep=lambda g: g not in self.executor)

    def carried(self, text: str) -> None:
        """Text the workflow made itself (a number or bool it passed, converted to a string by the parent): the
        workflow's even where the executor happens to have written the same tokens."""
        self.workflow.add(tokens(text))

    def replied(self, text: str) -> None:
        """An executor reply."""
        self.executor.add(tokens(text))
        self._answer_of(text)

    def derived(self, code: str) -> None:
        """Code the parent assembled from an executor reply and the problem statement (a body-only reply joined to
        the prompt's signature): the executor's, so windows across the join do not count against it."""
        self.executor.add(tokens(code))

    def _answer_of(self, text: str) -> None:
        if self.extract is not None:  # math / QA: the answer this reply would be scored as
            with contextlib.suppress(Exception):  # an unreadable reply holds no answer
                self.answers.add(self.extract(text))

    def whole_text_origin(self, scored: str) -> Origin:
        """The code rule before it looked at what runs (every token of the text counts): for comparisons
        (`bench/provenance_rescore.py`), never for a score."""
        if self.extract is not None:
            return self.origin_of(scored)
        return answer_origin(code_without_comments(scored), self.executor, self.workflow, self.neutral,
                             self.threshold)

    def code_ran(self, program: str, stdout: str) -> bool:
        """A program an operator ran: its output is executor text only when the program is the executor's."""
        mine = answer_origin(program, self.executor, self.workflow, self.neutral, self.threshold).origin == EXECUTOR
        if mine:
            self.executor.add(tokens(stdout))
            self._answer_of(stdout)
        return mine

    def origin_of(self, scored: str) -> Origin:
        """The origin of the answer's scored part. Code: by token coverage of its live statements, comments left
        out (`code_origin`). Math / QA (with
        `extract`): the executor's when some executor reply would be scored as this very answer (`answers`; the
        extractor normalises numbers, "1,200" and "1200" alike) and no window of it is workflow text."""
        if self.extract is None:
            return code_origin(code_without_comments(scored), self.executor, self.workflow, self.neutral,
                               self.roots, self.threshold)
        if not tokens(scored):
            return Origin(NONE, 0.0, 0)
        said = NgramIndex()
        if scored in self.answers:
            said.add(tokens(scored))
        return answer_origin(scored, said, self.workflow, None, self.threshold)
