"""Small text helpers shared by loaders and scorers: `\\boxed{}` extraction and number finding."""

from __future__ import annotations

import re

_BOX_CMDS = ("\\boxed", "\\fbox")

# A number as people write it: optional sign, thousands separators (only in groups of three), decimals.
# Not inside a word ("x2", "v1.5") but a unit may follow ("5km", "10am"). Not the base of a power or of
# scientific notation ("18²", "18^2", "18e3" are other numbers): the number is matched whole (atomic), then
# must not be followed by an exponent.
NUMBER_RE = _NUMBER_RE = re.compile(r"(?<![\w.])-?(?>(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)"
                        r"(?![\u00b2\u00b3\u00b9\u2070-\u2079^]|[eE][+-]?\d)")


_BOX_START = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_BRACE = re.compile(r"\\[{}]|[{}]")  # `\{` / `\}` are literal braces, not grouping


def _matching_braces(text: str) -> dict[int, int]:
    """Position of each "{" -> position of the "}" that closes it (unclosed ones are absent). One pass."""
    match: dict[int, int] = {}
    stack: list[int] = []
    for m in _BRACE.finditer(text):
        c = m.group(0)
        if c == "{":
            stack.append(m.start())
        elif c == "}" and stack:
            match[stack.pop()] = m.start()
    return match


def boxed_spans(text: str) -> list[tuple[int, str]]:
    """(start, content) of every well-formed `\\boxed{...}` / `\\fbox{...}` (nested braces kept) and `\\boxed 5`
    form, in order. A box that is cut off (unbalanced braces) is left out. Linear in the text's length."""
    if not text or "\\" not in text:
        return []
    match: dict[int, int] | None = None
    out: list[tuple[int, str]] = []
    for m in _BOX_START.finditer(text):
        i = m.end()
        j = i
        while j < len(text) and text[j] == " ":
            j += 1
        if j < len(text) and text[j] == "{":
            if match is None:
                match = _matching_braces(text)
            close = match.get(j)
            if close is not None:
                out.append((m.start(), text[j + 1 : close]))
        elif i < len(text) and text[i] == " ":  # `\boxed 5`: one space, then a token up to whitespace or `$`
            t = re.match(r" +([^\s$]+)", text[i : i + 200])
            if t:
                out.append((m.start(), t.group(1)))
    return out


def last_boxed_span(text: str) -> tuple[int, str] | None:
    """(start, content stripped) of the last well-formed box, or None."""
    spans = boxed_spans(text)
    return (spans[-1][0], spans[-1][1].strip()) if spans else None


def last_boxed(text: str) -> str | None:
    """Content of the last well-formed `\\boxed{...}` (or `\\fbox{...}`) in `text`, nested braces kept.

    A box that is cut off (unbalanced braces) is skipped in favour of the previous well-formed one.
    Returns None when there is none.
    """
    span = last_boxed_span(text or "")
    return span[1] if span else None


def find_numbers(text: str) -> list[str]:
    """Every number in `text`, commas removed ("1,234.5" -> "1234.5")."""
    return [m.group(0).replace(",", "") for m in _NUMBER_RE.finditer(text or "")]


def last_number(text: str) -> str | None:
    nums = find_numbers(text)
    return nums[-1] if nums else None


def to_float(s: str) -> float | None:
    try:
        return float(s.replace(",", ""))
    except (ValueError, AttributeError):
        return None
