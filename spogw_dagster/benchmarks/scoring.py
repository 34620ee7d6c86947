"""Scorers: pure functions from (gold, model answer) to a ScoreDetail, plus the async dispatcher `score`.

- GSM8K (`score_gsm8k`): the final number of the answer vs the gold, |pred - gold| <= 1e-6. The final
  number is, in this order: the first number after the last `####`; the last number inside the last
  `\\boxed{}` (a simple fraction there, `a/b` or `\\frac{a}{b}`, is evaluated); the first number after the
  last "the answer is" / "answer:" (on the same line); the last number in the text. A marked answer wins
  over numbers written after it ("The answer is 5. Check: 5 + 3 = 8" reads 5). Thousands separators are
  removed, also when written `1{,}234` or with thin spaces; a minus belongs to its number across whitespace,
  thin spaces, LaTeX spacing, a currency symbol and opening brackets ("- 18", "-\\,18", "-$5", "-{18}"),
  written as any dash (ASCII, U+2212, en/em dashes...) or as the word "minus"/"negative", unless an operand
  stands before it ("20 - 2" is a subtraction). A line-start bullet "- 18" therefore reads -18: an answer
  written ambiguously gets no credit.
- MATH (`score_math`): the content of the last `\\boxed{}` (nested braces kept) vs the gold, equal if the
  normalised strings match or math-verify finds them symbolically equal. With no `\\boxed{}`, the answer
  after the last "the answer is" / "answer:" is read whole (the first `$...$` span after it, else the
  rest of that line without a final period: "The answer is $\\frac{1}{2}$." reads `\\frac{1}{2}`); with
  neither, the last number (lenient on purpose for small models). A boxed answer always takes precedence.
- QA (`score_qa`): token F1 after SQuAD/DROP normalisation, max over the golds. The answer is first
  reduced to its final answer: the last `\\boxed{}`, else the text after the last "final answer:" /
  "answer:" / "the answer is" (up to the end of that line, markdown and a final period stripped), else
  the whole text.
- Code (`code_tests.score_code`): pass@1 by running the hidden tests against the solution in two sandboxed
  processes (`verdict.judge`, in the `CodeSandbox` the caller passes).

math-verify bounds its work with SIGALRM, which only exists in the main thread: `math_equal` passes its
timeouts only there and runs without them elsewhere (answers longer than MAX_MATH_CHARS are then only
compared as strings, to bound the work). The dispatcher runs math scoring inline (not in a worker
thread) so that, in the usual case of an event loop in the main thread, the timeouts apply.

The predicted answer is written by the workflow under training, so it is screened before math-verify
(`unsafe_math_answer`). An answer that is not equal to the gold as a normalised string and fails the
screen scores 0, its detail says why. The screen (on the answer with spacing, `\\left`/`\\right` and
whitespace removed; `**` counts as `^`):

- at most MAX_PRED_CHARS (300) characters and bracket nesting ({, (, [) at most MAX_PRED_DEPTH (10) deep
  (MATH golds: at most 159 characters, 3 deep). Deep nesting makes math-verify's LaTeX parser fail and
  its fallback extract a bare number: `\\frac{1}{\\frac{1}{...2}}` 200 deep "equalled" 1/2;
- only LaTeX commands from a fixed list (fractions, roots, Greek letters but not \\Gamma/\\gamma,
  trig/log, relations, set and text commands, environments...): \\binom, \\sum, \\prod, \\int, \\lim,
  \\operatorname, \\Gamma... can make sympy compute huge integers or matrices;
- factorials only of a literal integer of at most 4 digits, or of a single letter (`2004!`, `n!`),
  never of a group or of a factorial (`(10^{10})!` would take sympy minutes);
- powers small and flat: an exponent holds at most 4 digits and no `^`/`!`; a base (the number, letter,
  bracketed group or command with its arguments before the `^`) holds no `^`/`!` and at most 8 digits;
  no `a^b^c`. So every power is below 10^(8*9999) and no tower like `(9^{9999})^{9999}` (whose big-integer
  arithmetic runs in C, holding the GIL, where no timeout can stop it) gets through.

These bound the big-integer work. Symbolic work (e.g. expanding `(x+1)^{99}(x+2)^{99}`) is pure Python and
bounded by math-verify's timeouts in the main thread only.
"""

from __future__ import annotations

import html
import logging
import re
import string
import threading
from collections import Counter
from typing import Any

from ..contracts import Problem
from .code_tests import CodeSandbox, ScoreDetail, score_code, solution_code
from .registry import BENCHMARK_SCORERS
from .textutil import NUMBER_RE as _NUMBER_AT
from .textutil import find_numbers, last_boxed, last_boxed_span, last_number, to_float

log = logging.getLogger(__name__)

GSM8K_TOLERANCE = 1e-6
MATH_VERIFY_TIMEOUT_S = 5
MAX_MATH_CHARS = 400
MAX_PRED_CHARS = 300  # a predicted MATH answer longer than this is refused (golds: at most 159)
MAX_PRED_DEPTH = 10  # bracket nesting deeper than this is refused (golds: at most 3)
MAX_EXPONENT_DIGITS = 4  # digits in one exponent (golds go up to 2^{4950})
MAX_BASE_DIGITS = 8  # digits in the base of a power
MAX_FACTORIAL_DIGITS = 4  # 9999! has 35,660 digits: cheap (golds: 2004!)

# ---------------------------------------------------------------------------------------------------
# GSM8K

_FRAC_RE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)\s*$")
_TEX_FRAC_RE = re.compile(r"^\s*(-?)\\d?frac\{\s*(-?\d+(?:\.\d+)?)\s*\}\{\s*(\d+(?:\.\d+)?)\s*\}\s*$")


def _fraction_value(s: str) -> float | None:
    s = s.replace("$", "").replace(",", "")
    m = _FRAC_RE.match(s)
    if m and float(m.group(2)) != 0:
        return float(m.group(1)) / float(m.group(2))
    m = _TEX_FRAC_RE.match(s)
    if m and float(m.group(3)) != 0:
        return (-1 if m.group(1) else 1) * float(m.group(2)) / float(m.group(3))
    return None


# "The answer is", "the final answer is:", "Answer:" (the last one in the text counts)
_ANSWER_IS = re.compile(r"\banswer\s*(?:is\b\s*[:：]?|[:：])", re.I)


def _after_answer_marker(text: str) -> str | None:
    """The rest of the line after the last "the answer is" / "answer:" marker, or None without one."""
    last = None
    for last in _ANSWER_IS.finditer(text):
        pass
    if last is None:
        return None
    return text[last.end() :].split("\n", 1)[0]


# Only the end of an answer is read: its final answer is there, and every pattern below stays cheap.
MAX_ANSWER_CHARS = 50_000
# Invisible characters: Unicode's default-ignorable code points (format characters, category Cf, the combining
# grapheme joiner, variation selectors, Hangul fillers, Khmer inherent vowels, Mongolian free variation
# selectors, tags...), removed before anything is read, so "-\u200c18" is "-18". A test checks that the class
# covers every Cf code point of this Python's Unicode database.
_INVISIBLE = re.compile(
    "[\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180b-\u180f\u200b-\u200f\u202a-\u202e"
    "\u2060-\u206f\ufeff\ufff0-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3"
    "\U0001d173-\U0001d17a\U000e0000-\U000e0fff\u034f\ufe00-\ufe0f\u115f\u1160\u17b4\u17b5\u3164\uffa0]")
# Every dash (Unicode category Pd) and every other minus-like sign reads as "-".
_DASHES = str.maketrans({c: "-" for c in (
    "\u058a\u05be\u1400\u1806\u2010\u2011\u2012\u2013\u2014\u2015\u2e17\u2e1a\u2e3a\u2e3b\u2e40\u2e5d\u301c"
    "\u3030\u30a0\ufe31\ufe32\ufe58\ufe63\uff0d\U00010ead"  # Pd
    "\u2212\u02d7\u207b\u208b\u2796\u2043\u02c9\u0320")})
# Combining marks drawn on a minus ("-\u0301") leave it a minus; an empty group `{}` and a group holding only a
# sign (`{-}`, `\text{-}`) render as nothing and as a minus.
_MARKED_DASH = re.compile("-[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]+")
_EMPTY_GROUP = re.compile(r"(?<![A-Za-z])\{\s*\}")
_SIGN_GROUP = re.compile(r"\\(?:text|mathrm|textrm|mbox)\{\s*(-|negative|minus)\s*\}|(?<![A-Za-z])\{\s*-\s*\}")
_EMPTY_TEXT = re.compile(r"\\(?:text|mathrm|textrm|mbox|textbf|mathbf)\{\s*\}")
# Drawn as a space (or as nothing): a braille blank, control characters that break lines.
_BLANKS = str.maketrans({c: " " for c in "\u2800\u0085\u000b\u000c\u001c\u001d\u001e\u001f\u2028\u2029"})
_UNICODE_SPACES = str.maketrans({c: " " for c in "\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
                                 "\u2007\u2008\u2009\u200a\u202f\u205f\u3000"})


def canonical_answer_text(text: str) -> str:
    """The answer as the scorers read it: its last MAX_ANSWER_CHARS characters, invisible characters
    removed, HTML entities decoded, every dash and minus sign as "-", empty groups and sign-only groups as what
    they render."""
    text = text[-MAX_ANSWER_CHARS:]
    if "&" in text:  # HTML entities: "&minus;18", "-&nbsp;18"
        text = html.unescape(text)
    text = _INVISIBLE.sub("", text).translate(_DASHES).translate(_BLANKS)
    if "-" in text:
        text = _MARKED_DASH.sub("-", text)
    if "{" in text:
        text = _SIGN_GROUP.sub(lambda m: " " + (m.group(1) or "-") + " ", _EMPTY_GROUP.sub("", _EMPTY_TEXT.sub("", text)))
    return text


# What may stand between a unary minus and its digits without making the number positive: whitespace of any
# width, LaTeX spacing (`\,` `\;` `\:` `\!` `\>` `\ ` `~`, `\thinspace`, `\enspace`, `\quad`, `\hskip 1pt`,
# `\mkern2mu`, `\hspace{1em}`), math delimiters (`\(` `\)` `\[` `\]`, `$`), a currency sign, markdown (`**`,
# backticks) and opening brackets or wrappers ("-(18)", "-{18}", "-\left(18\right)"; never a closing one:
# "{-}" and "\text{-}" are read as "-" beforehand, so no bracket of the text is lost).
# Each alternative starts differently and the loop is possessive, so matching stays linear.
_DIMEN = r"\s*-?[\d.]+\s*(?:em|ex|pt|mu|cm|mm|in|bp|pc|sp)\b"
_GAP = (r"(?:[\s\u1680\u2000-\u200a\u202f\u205f\u3000~*`({\[]"
        r"|\\(?:[,;:!> ()\[\]$]|left\b|thinspace\b|enspace\b|medspace\b|thickspace\b|quad\b|qquad\b"
        rf"|(?:hskip|kern|mkern|mskip){_DIMEN}|hspace\*?\{{{_DIMEN}\s*\}}"
        r"|(?:text|mathrm|mathbf|textbf|mathit|operatorname|boldsymbol|bm)\{)"
        r"|\$)*+")
_AFTER_SIGN = re.compile(rf"{_GAP}(?=\.?\d)")
_SIGN = re.compile(r"-|\b(?:minus|negative|neg\.)(?!\w)", re.I)
_OPERAND_END = frozenset("0123456789)]}%")  # what ends an operand: a minus after it is a subtraction
_SPACES = frozenset(" \t") | frozenset(map(chr, _UNICODE_SPACES))  # what may stand between an operand and "-"
# Thousands written with LaTeX braces or thin spaces: "1{,}234", "1\,234", "1 234" (narrow no-break space).
_THOUSANDS = re.compile(r"(?<=\d)(?:\{,\}(?:\\!)?|,\\!|\\,|[\u00a0\u2009\u202f]|\\thinspace\b ?)(?=\d{3}(?!\d))")


def _normalize_signs(text: str) -> str:
    """Signs and separators as `find_numbers` reads them (after `canonical_answer_text`): a unary minus, or the
    word "minus"/"negative", joins its number across spacing, markup and brackets ("- 18", "-\\,18", "- $5",
    "-{18}", "minus 18" -> "-18", "-18", "-5", "-18", "-18"); a minus with an operand before it (a digit, a
    closing bracket, %) is a subtraction and stays. LaTeX and thin-space thousands separators become commas
    ("1{,}018" -> "1,018"). Linear in the length of the text."""
    text = _THOUSANDS.sub(",", canonical_answer_text(text))
    out: list[str] = []
    last = 0
    for m in _SIGN.finditer(text):
        if m.start() < last:
            continue
        after = _AFTER_SIGN.match(text, m.end())
        if after is None:
            continue
        j = m.start() - 1
        while j >= last and text[j] in _SPACES:
            j -= 1
        if j >= 0 and text[j] in _OPERAND_END:
            continue
        out += [text[last:m.start()], "-"]
        last = after.end()
    out.append(text[last:])
    return "".join(out)


# What may stand around the number in a box or after "####": labels and units (in \text{...}, where their own
# operators do not count: "km/h"), degree, currency and percent signs, spacing, markdown, braces, a box.
_TEXT_WRAP = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mathit|mbox|bm|boldsymbol|underline)"
                        r"\{([^{}]*)\}(?:\s*\^\s*(?:\d|\{\s*\d\s*\}))?")  # a unit's own power: "\text{ m}^2"
_BOX_WRAP = re.compile(r"\\(?:boxed|fbox)\{([^{}]*)\}")
_DECOR = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ|°|\\[%$,;:!> ]|[%$]|\\(?:thinspace|quad|qquad|displaystyle"
                    r"|textstyle|scriptstyle|left|right|dfrac|tfrac)\b|[{}~*`]")
# Before the number: nothing that makes it part of an expression (an operator, a command such as \sqrt, a
# digit). After it: no operator, no exponent or vulgar fraction, no digit group ("18 000"), no binary minus.
_BEFORE_EXPR = re.compile(r"[\d\\^√∛∜×÷*/+=<>!-]")  # a "-" left before the number is binary ("[x] - 18")
_AFTER_EXPR = re.compile(r"\s*(?:[\^!×÷*/+<>\\\u00b2\u00b3\u00b9\u2070-\u2079\u00bc-\u00be\u2150-\u215e‰‱]"
                         r"|-\s*[\d(.\\]|:\s*\d|\d)")


def _lone_number(s: str, *, prose_after: bool = False) -> str | None:
    """The number that `s` (a box's content, or what follows "####") states, or None for an expression or for
    no number. What follows the last "=" is the value ("2 \\times 9 = 18" reads 18); a simple fraction is
    evaluated ("3/4" -> "0.75"). "18", "-18", "\\$1,018.50", "18 \\text{ km/h}", "\\text{18}", "18^\\circ", "**18**"
    state 18; "18 - 36", "2^{18}", "\\sqrt{18}", "18!", "18²", "18 000" state none. `prose_after`: words and
    more numbers may follow the number (a "####" line: "#### 18 (20 - 2)"); in a box there must be no other."""
    s = s.rsplit("=", 1)[-1]
    frac = _fraction_value(s)
    if frac is not None:
        return repr(frac)
    s = _BOX_WRAP.sub(r" \1 ", s)
    s = _TEXT_WRAP.sub(lambda m: " " + re.sub(r"[/^*+=<>×÷\\]", " ", m.group(1)) + " ", s)
    s = _DECOR.sub(" ", s)
    m = _NUMBER_AT.search(s)
    if m is None or _BEFORE_EXPR.search(s[: m.start()]) or _AFTER_EXPR.match(s, m.end()):
        return None
    if not prose_after and find_numbers(s[m.end():]):
        return None
    return m.group(0).replace(",", "")


def _negated_box(text: str, start: int) -> bool:
    """Whether a unary minus stands right before the box at `start` ("-\\boxed{18}" is -18)."""
    m = re.search(r"(^|[^\d)\]}%\s])\s*-\s*\$?\s*$", text[max(0, start - 40) : start])
    return m is not None


def extract_gsm8k_answer(text: str) -> str | None:
    """The final number of a GSM8K answer as a string (commas removed), or None if it has none.

    After "####" (the rest of that line) and in the last box, exactly one number must stand
    (`_lone_number`): "#### 18 - 36", "\\boxed{\\sqrt{18}}", "\\boxed{2^{18}}" read no number, not 18."""
    if not text:
        return None
    text = _normalize_signs(text)
    if "####" in text:
        tail = text.rsplit("####", 1)[1].strip()
        return _lone_number(tail.split("\n", 1)[0], prose_after=True) if tail else None
    span = last_boxed_span(text)
    if span is not None:
        num = _lone_number(span[1])
        if num is not None and _negated_box(text, span[0]):
            num = num[1:] if num.startswith("-") else "-" + num
        return num
    marked = _after_answer_marker(text)
    if marked is not None:
        nums = find_numbers(marked)
        if nums:
            return nums[0]
    return last_number(text)


def score_gsm8k(answer_text: str, gold: str) -> ScoreDetail:
    gold_v = to_float(gold)
    if gold_v is None:
        raise ValueError(f"GSM8K gold {gold!r} is not a number")
    pred = extract_gsm8k_answer(answer_text)
    if pred is None:
        return ScoreDetail(0.0, "no number in the answer")
    pred_v = to_float(pred)
    if pred_v is not None and abs(pred_v - gold_v) <= GSM8K_TOLERANCE:
        return ScoreDetail(1.0, f"correct: {pred}", pred)
    return ScoreDetail(0.0, f"wrong: {pred} (gold {gold})", pred)


# ---------------------------------------------------------------------------------------------------
# MATH


def _strip_math(s: str) -> str:
    s = s.strip().strip("$").strip()
    s = re.sub(r"\\(left|right|!|,|;|:|displaystyle)", "", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\\text\{\s*([^{}]*)\}", r"\1", s)
    s = re.sub(r"\s+", "", s)
    return s.rstrip(".")


def _first_math_span(rest: str) -> str | None:
    """The content of the first `$$...$$`, `$...$` or `\\(...\\)` span in `rest`, found with str.find (a lazy
    regex is quadratic on many unclosed openers); None if there is none."""
    starts = [(i, o, c) for o, c in (("$$", "$$"), ("$", "$"), ("\\(", "\\)")) if (i := rest.find(o)) >= 0]
    for i, o, c in sorted(starts, key=lambda t: (t[0], -len(t[1]))):
        j = rest.find(c, i + len(o))
        if j > i + len(o):
            return rest[i + len(o) : j]
    return None


def _marked_math_answer(text: str) -> str | None:
    """The answer after the last "the answer is" marker, read whole: its first `$...$` / `\\(...\\)` span,
    else the rest of the sentence (its first number if that has words in it: "5 apples"); None if there is
    nothing there."""
    rest = _after_answer_marker(text)
    if rest is None:
        return None
    ans = _first_math_span(rest)
    if ans is None:
        ans = re.split(r"\.(?:\s|$)", rest.strip().strip("*").strip(), maxsplit=1)[0]
        if re.search(r"(?<![\\A-Za-z])[A-Za-z]{2,}", ans):  # prose ("5 apples"): its first number, signed
            nums = find_numbers(_normalize_signs(ans))  # as GSM8K reads it ("minus 18", "− 18" are -18)
            ans = nums[0] if nums else ""
    ans = ans.strip()
    return ans or None


def extract_math_answer(text: str) -> tuple[str | None, str]:
    """(answer, how): the last `\\boxed{}` content ("boxed"), else the answer after the last "the answer
    is" ("answer_is"), else the last number ("last_number"). Read from `canonical_answer_text` (every dash a
    "-", invisible characters gone: math-verify would silently drop an en dash, "\\boxed{– 18}" read 18)."""
    text = canonical_answer_text(text or "").translate(_UNICODE_SPACES)
    span = last_boxed_span(text)
    if span is not None:
        return (f"-({span[1]})" if _negated_box(text, span[0]) else span[1]), "boxed"
    marked = _marked_math_answer(text or "")
    if marked is not None:
        return marked, "answer_is"
    num = last_number(_normalize_signs(text or ""))
    if num is not None:
        return num, "last_number"
    return None, "none"


# Commands a predicted answer may use (after _strip_math): everything in MATH's gold answers plus common
# harmless notation. Anything else is refused before math-verify (see the module docstring).
_SAFE_COMMANDS = frozenset("""
frac dfrac tfrac cfrac sqrt text textbf textrm textit textnormal mbox mathrm mathbf mathit mathbb mathcal
boxed fbox begin end hline phantom quad qquad overline underline bar hat vec widehat tilde
pi infty circ degree cup cap setminus emptyset varnothing pm mp cdot times div ast star
le leq ge geq lt gt ne neq approx sim simeq cong equiv propto in notin ni subset subseteq supset supseteq
sin cos tan cot sec csc arcsin arccos arctan sinh cosh tanh log ln exp
alpha beta delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu xi omicron rho varrho
sigma varsigma tau upsilon phi varphi chi psi omega Delta Theta Lambda Xi Pi Sigma Upsilon Phi Psi Omega
triangle angle measuredangle perp parallel mid vert lvert rvert Vert lVert rVert
lfloor rfloor lceil rceil langle rangle lbrace rbrace lbrack rbrack
dots ldots cdots vdots ddots to rightarrow leftarrow Rightarrow Leftarrow leftrightarrow Leftrightarrow
iff implies land lor wedge vee forall exists prime left right displaystyle
""".split())
_OPEN, _CLOSE = "{([", "})]"
_CMD_RE = re.compile(r"\\([A-Za-z]+)")


def _matching_open(s: str, close: int) -> int:
    """Index of the bracket that opens the group closed at `close` (any bracket kind), or -1."""
    depth = 0
    for i in range(close, -1, -1):
        if s[i] in _CLOSE:
            depth += 1
        elif s[i] in _OPEN:
            depth -= 1
            if depth == 0:
                return i
    return -1


def _matching_close(s: str, open_: int) -> int:
    depth = 0
    for i in range(open_, len(s)):
        if s[i] in _OPEN:
            depth += 1
        elif s[i] in _CLOSE:
            depth -= 1
            if depth == 0:
                return i
    return -1


def _power_base(s: str, caret: int) -> str | None:
    """The base of the power whose `^` is at `caret`: a number, a letter, or a bracketed group together
    with any groups and the command just before it (`\\frac{a}{b}^2` -> `\\frac{a}{b}`). None if unclear."""
    i = caret - 1
    if i < 0:
        return None
    if s[i] in _CLOSE:
        start = _matching_open(s, i)
        while start > 0 and s[start - 1] == "}":  # earlier arguments of the same command (\frac{a}{b})
            start = _matching_open(s, start - 1)
        if start < 0:
            return None
        m = re.search(r"\\[A-Za-z]+$", s[:start])
        if m:
            start = m.start()
        return s[start:caret]
    if s[i].isdigit() or s[i] == ".":
        j = i
        while j > 0 and (s[j - 1].isdigit() or s[j - 1] == "."):
            j -= 1
        return s[j:caret]
    return s[i]


def _power_exponent(s: str, caret: int) -> tuple[str, int] | None:
    """(exponent text, index just after it) of the `^` at `caret`; None if unclear."""
    i = caret + 1
    if i >= len(s):
        return None
    if s[i] in _OPEN:
        j = _matching_close(s, i)
        return (s[i : j + 1], j + 1) if j >= 0 else None
    if s[i] == "\\":  # a command and the groups right after it: ^\frac{1}{2}
        m = re.match(r"\\[A-Za-z]+", s[i:])
        j = i + (m.end() if m else 2)
        while j < len(s) and s[j] == "{":
            k = _matching_close(s, j)
            if k < 0:
                return None
            j = k + 1
        return s[i:j], j
    m = re.match(r"[-+]?[0-9.]+", s[i:])  # take a whole digit run: 2^99999 may be read as 2^{99999}
    j = i + (m.end() if m else 1)
    return s[i:j], j


def _digits(s: str) -> int:
    return sum(c.isdigit() for c in s)


def unsafe_math_answer(pred: str) -> str | None:
    """Why `pred` (a predicted final answer) must not go to math-verify, or None if it may.

    See the module docstring for the rules; they bound the size of the integers sympy may compute and
    the parser's recursion, whatever the (workflow-controlled) answer says."""
    if len(pred) > MAX_PRED_CHARS:
        return f"answer too long for symbolic comparison ({len(pred)} > {MAX_PRED_CHARS} characters)"
    s = _strip_math(pred).replace("**", "^")
    depth = top = 0
    for c in s:
        if c in _OPEN:
            depth += 1
            top = max(top, depth)
        elif c in _CLOSE:
            depth = max(0, depth - 1)
    if top > MAX_PRED_DEPTH:
        return f"brackets nested too deep for symbolic comparison ({top} > {MAX_PRED_DEPTH})"
    bad = sorted({m.group(1) for m in _CMD_RE.finditer(pred)} - _SAFE_COMMANDS)  # before spaces are gone
    if bad:
        return "command(s) not allowed in a compared answer: " + ", ".join("\\" + b for b in bad[:5])
    for i, c in enumerate(s):
        if c == "!":
            j = i
            while j > 0 and s[j - 1].isdigit():
                j -= 1
            run = s[j:i]
            if run:
                if len(run) > MAX_FACTORIAL_DIGITS or (j > 0 and s[j - 1] in "^_."):
                    return f"factorial of a number too large for symbolic comparison ({run}!)"
            elif not (i > 0 and s[i - 1].isalpha()):
                return "factorial of an expression (only an integer of at most 4 digits or a letter)"
        elif c == "^":
            exp = _power_exponent(s, i)
            base = _power_base(s, i)
            if exp is None or base is None:
                return "malformed power"
            text, after = exp
            if "^" in text or "!" in text or _digits(text) > MAX_EXPONENT_DIGITS:
                return f"exponent too large for symbolic comparison (^{text})"
            if "^" in base or "!" in base or _digits(base) > MAX_BASE_DIGITS:
                return f"power of a power or of a large number ({base}^...)"
            if after < len(s) and s[after] == "^":
                return "power tower (a^b^c)"
    return None


def math_equal(pred: str, gold: str, timeout_s: int | None = MATH_VERIFY_TIMEOUT_S) -> bool:
    """Whether two final answers (LaTeX, no `\\boxed`) are equal: as normalised strings, or by math-verify.

    `pred` is untrusted: one that `unsafe_math_answer` refuses is only compared as a string. Safe from
    any thread: math-verify's signal-based timeouts are used only in the main thread.
    """
    if not pred.strip() or not gold.strip():
        return False
    if _strip_math(pred) == _strip_math(gold):
        return True
    if unsafe_math_answer(pred) is not None:
        return False
    main = threading.current_thread() is threading.main_thread()
    if not main and max(len(pred), len(gold)) > MAX_MATH_CHARS:
        return False
    from math_verify import parse, verify  # imported lazily: it pulls sympy

    t = timeout_s if main else None
    try:
        g = parse("\\boxed{" + gold + "}", parsing_timeout=t)
        p = parse("\\boxed{" + pred + "}", parsing_timeout=t)
        if not g or not p:
            return False
        return bool(verify(g, p, timeout_seconds=t))
    except ValueError as e:
        if "threaded environment" in str(e):  # our bug, not the answer's: never a silent 0
            raise
        log.debug("math-verify failed on %r vs %r: %s", pred, gold, e)
        return False
    except Exception as e:  # math-verify's own failures (timeouts included) mean "not shown equal"
        log.debug("math-verify failed on %r vs %r: %s", pred, gold, e)
        return False


def score_math(answer_text: str, gold: str) -> ScoreDetail:
    pred, how = extract_math_answer(answer_text)
    if pred is None:
        return ScoreDetail(0.0, "no \\boxed{} answer and no number")
    tag = {"boxed": "", "answer_is": " (no \\boxed{}; the answer after 'the answer is' used)"}.get(
        how, " (no \\boxed{}; last number used)")
    if _strip_math(pred) != _strip_math(gold):
        why = unsafe_math_answer(pred)
        if why is not None:
            short = pred if len(pred) <= 120 else pred[:120] + "..."
            return ScoreDetail(0.0, f"refused: {why}: {short} (gold {gold}){tag}", pred[:MAX_PRED_CHARS])
    if math_equal(pred, gold):
        return ScoreDetail(1.0, f"correct: {pred}{tag}", pred)
    return ScoreDetail(0.0, f"wrong: {pred} (gold {gold}){tag}", pred)


# ---------------------------------------------------------------------------------------------------
# QA

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)
_NUM_TOKEN = re.compile(r"^-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?$|^-?\.\d+$")


def _normalize_number(tok: str) -> str:
    bare = tok.strip(string.punctuation.replace("-", "").replace(".", "")).rstrip(".")
    if _NUM_TOKEN.match(bare):
        v = float(bare.replace(",", ""))
        return str(int(v)) if v.is_integer() else repr(v).replace(".", "_")
    return tok


def normalize_answer(s: str) -> str:
    """SQuAD normalisation (lowercase, drop punctuation and a/an/the, collapse whitespace), with two
    DROP-style touches: hyphens separate words, and numbers are canonical ("1,000" = "1000",
    "12.0" = "12", while "2.5" stays distinct from "25")."""
    s = (s or "").lower().replace("-", " ").replace("–", " ")
    toks = [_normalize_number(t) for t in s.split()]
    s = " ".join(toks)
    s = "".join(ch for ch in s if ch not in _PUNCT or ch == "_")
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def f1_score(prediction: str, gold: str) -> float:
    """Token F1 between normalised strings (1.0 if both are empty, 0.0 if only one is)."""
    p = normalize_answer(prediction).split()
    g = normalize_answer(gold).split()
    if not p or not g:
        return float(p == g)
    common = Counter(p) & Counter(g)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(p)
    recall = same / len(g)
    return 2 * precision * recall / (precision + recall)


_ANSWER_MARKERS = [
    re.compile(r"final\s+answer\s*(?:is)?\s*[:：]", re.I),
    re.compile(r"\banswer\s*[:：]", re.I),
    re.compile(r"\bthe\s+(?:final\s+)?answer\s+is\b\s*[:：]?", re.I),
]


def _clean_answer_line(s: str) -> str:
    lines = [ln for ln in s.strip().splitlines() if ln.strip()]
    s = lines[0] if lines else ""
    for _ in range(2):  # "**The Danube**." -> "The Danube"
        s = s.strip().strip("*_`").strip()
        s = re.sub(r"^\\text\{(.*)\}$", r"\1", s)
        s = s.strip().strip('"').strip("'").strip()
        s = s[:-1] if s.endswith(".") else s
    return s.strip()


def extract_qa_answer(text: str) -> str:
    """The final answer of a verbose QA response (see the module docstring for the rules); only its last
    MAX_ANSWER_CHARS characters are read."""
    text = (text or "")[-MAX_ANSWER_CHARS:].strip()
    if not text:
        return ""
    boxed = last_boxed(text)
    if boxed:
        return _clean_answer_line(boxed)
    best: tuple[int, int] | None = None  # (end of marker, marker priority) of the latest marker
    for prio, pat in enumerate(_ANSWER_MARKERS):
        for m in pat.finditer(text):
            if best is None or m.start() > best[0]:
                best = (m.end(), prio)
    if best is not None:
        ans = _clean_answer_line(text[best[0] :])
        if ans:
            return ans
    return text


def score_qa(answer_text: str, golds: list[str]) -> ScoreDetail:
    golds = [g for g in golds if g is not None]
    if not golds:
        raise ValueError("QA scoring needs at least one gold answer")
    pred = extract_qa_answer(answer_text)
    scores = [f1_score(pred, g) for g in golds]
    best = max(range(len(golds)), key=lambda i: scores[i])
    return ScoreDetail(scores[best], f"f1={scores[best]:.3f} answer={pred[:80]!r} gold={golds[best][:80]!r}", pred)


# ---------------------------------------------------------------------------------------------------
# dispatch


def scorer_for(problem: Problem) -> str:
    """"code" | "gsm8k" | "math" | "qa_f1": by benchmark when known, else by family."""
    if problem.benchmark in BENCHMARK_SCORERS:
        return BENCHMARK_SCORERS[problem.benchmark]
    by_family = {"code": "code", "math": "math", "qa": "qa_f1"}
    if problem.family not in by_family:
        raise ValueError(f"problem {problem.id}: no scorer for benchmark {problem.benchmark!r} / family {problem.family!r}")
    return by_family[problem.family]


def _as_text(answer: Any) -> str:
    if answer is None:
        return ""
    return answer if isinstance(answer, str) else str(answer)


def score_answer(problem: Problem, answer: Any) -> ScoreDetail:
    """Synchronous scoring for math and QA problems (code needs `score`, which runs tests)."""
    text = _as_text(answer)
    kind = scorer_for(problem)
    if kind == "gsm8k":
        return score_gsm8k(text, problem.answer)
    if kind == "math":
        return score_math(text, problem.answer)
    if kind == "qa_f1":
        return score_qa(text, problem.golds or [problem.answer])
    raise ValueError(f"problem {problem.id}: {kind} problems are scored with the async `score` (they run tests)")


def scored_text(problem: Problem, answer: Any) -> str:
    """The part of an answer the scorer reads: the code it tests, the number or short answer it compares
    ("" when there is none). What `workflow.provenance` judges the origin of."""
    text = _as_text(answer)
    kind = scorer_for(problem)
    if kind == "code":
        return solution_code(problem, text)
    if kind == "gsm8k":
        return extract_gsm8k_answer(text) or ""
    if kind == "math":
        return extract_math_answer(text)[0] or ""
    return extract_qa_answer(text)


async def score(problem: Problem, answer_text: Any, *, sandbox: CodeSandbox | None = None) -> ScoreDetail:
    """Score one answer to `problem`. Code problems need `sandbox` (where their tests run); an answer that
    is not a string (e.g. a workflow returning an int) is scored as its str(), None as "".
    Failures of the scoring machinery (the sandbox not starting) propagate as exceptions."""
    kind = scorer_for(problem)
    if kind == "code":
        if sandbox is None:
            raise ValueError(f"problem {problem.id} is a code problem: scoring it needs a sandbox "
                             f"(score(..., sandbox=CodeSandbox(detect_isolation())))")
        return await score_code(problem, _as_text(answer_text), sandbox)
    return score_answer(problem, answer_text)
