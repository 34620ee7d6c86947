"""Small text helpers shared by loaders and scorers: `\\boxed{}` extraction and number finding."""

from __future__ import annotations

import re

_BOX_CMDS = ("\\boxed", "\\fbox")

# A number as people write it: optional sign, thousands separators (only in groups of three), decimals.
# Not inside a word ("x2", "v1.5") but a unit may follow ("5km", "10am"). Not the base of a power or of
# scientific notation ("18²", "18^2", "18e3" are other numbers): the number is matched whole (atomic), then
# must not be followed by an exponent.
_NUMBER_RE = re.compile(r"(?<![\w.])-?(?>(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)"
                        r"(?![\u00b2\u00b3\u00b9\u2070-\u2079^]|[eE][+-]?\d)")


def _boxed_at(text: str, start: int) -> str | None:
    """Content of the box command beginning at `start`, or None if it is malformed (e.g. cut off)."""
    i = start
    for cmd in _BOX_CMDS:
        if text.startswith(cmd, i):
            i += len(cmd)
            break
    else:
        return None
    # `\boxed{...}`, possibly with spaces before the brace.
    j = i
    while j < len(text) and text[j] == " ":
        j += 1
    if j < len(text) and text[j] == "{":
        depth = 0
        k = j
        while k < len(text):
            c = text[k]
            if c == "\\" and k + 1 < len(text) and text[k + 1] in "{}":
                k += 2  # `\{` / `\}` are literal braces, not grouping
                continue
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    return text[j + 1 : k]
            k += 1
        return None  # unbalanced: the box was cut off
    # `\boxed 5` form: one space then a token up to whitespace or `$`.
    if i < len(text) and text[i] == " ":
        m = re.match(r" +([^\s$]+)", text[i:])
        if m:
            return m.group(1)
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last well-formed `\\boxed{...}` (or `\\fbox{...}`) in `text`, nested braces kept.

    A box that is cut off (unbalanced braces) is skipped in favour of the previous well-formed one.
    Returns None when there is none.
    """
    if not text:
        return None
    starts = sorted(m.start() for m in re.finditer(r"\\(?:boxed|fbox)(?![A-Za-z])", text))
    for s in reversed(starts):
        content = _boxed_at(text, s)
        if content is not None:
            return content.strip()
    return None


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
