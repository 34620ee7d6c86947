"""DROP, read from a user-given file in the standard `drop_dataset_dev.json` format (ships in no package).

Format: {passage_id: {"passage": str, "qa_pairs": [{"question", "query_id", "answer":
{"number": str, "date": {"day", "month", "year"}, "spans": [str]}, "validated_answers": [same]}]}}.

Per question: question = "Passage: ...\\n\\nQuestion: ..."; golds = every distinct non-empty answer of
`answer` and `validated_answers` rendered as a string (a number as written; a date as its non-empty
parts "day month year", as the official DROP script joins them; several spans joined by ", ");
answer = the first gold. Questions without any non-empty answer are skipped (counted in a log warning).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ..contracts import Problem
from .dataio import BenchmarkDataError, read_json, require, resolve_data_path

log = logging.getLogger(__name__)

FILE_FORMAT = (
    "DROP JSON (drop_dataset_dev.json): an object {passage_id: {passage, qa_pairs: [{question, query_id, "
    "answer: {number, date: {day, month, year}, spans}, validated_answers: [...]}]}}"
)
STANDARD_NAMES = ("drop_dataset_dev.json", "drop_dataset_train.json")


def render_answer(ans: Any) -> tuple[str, str] | None:
    """(type, text) of one DROP answer object, or None when it is empty or malformed."""
    if not isinstance(ans, dict):
        return None
    number = str(ans.get("number") or "").strip()
    if number:
        return "number", number
    spans = [str(s).strip() for s in (ans.get("spans") or []) if str(s).strip()]
    if spans:
        return "spans", ", ".join(spans)
    date = ans.get("date") or {}
    if isinstance(date, dict):
        parts = [str(date.get(k) or "").strip() for k in ("day", "month", "year")]
        text = " ".join(p for p in parts if p)
        if text:
            return "date", text
    return None


def make_question(passage: str, question: str) -> str:
    return f"Passage: {passage.strip()}\n\nQuestion: {question.strip()}"


def load_drop(path: str | Path | None = None) -> list[Problem]:
    bench = "drop"
    p = resolve_data_path(bench, path, file_format=FILE_FORMAT, standard_names=STANDARD_NAMES)
    data = read_json(p, bench, FILE_FORMAT, top=dict)
    problems: list[Problem] = []
    seen: set[str] = set()
    skipped = 0
    for passage_id, entry in data.items():
        where = f"{p} passage {passage_id!r}"
        if not isinstance(entry, dict):
            raise BenchmarkDataError(f"benchmark {bench!r}: {where} is not an object; expected {FILE_FORMAT}")
        passage = require(entry, "passage", str, benchmark=bench, where=where)
        qa_pairs = require(entry, "qa_pairs", list, benchmark=bench, where=where)
        for i, qa in enumerate(qa_pairs):
            qwhere = f"{where} qa_pairs[{i}]"
            if not isinstance(qa, dict):
                raise BenchmarkDataError(f"benchmark {bench!r}: {qwhere} is not an object")
            question = require(qa, "question", str, benchmark=bench, where=qwhere)
            query_id = require(qa, "query_id", str, benchmark=bench, where=qwhere)
            answer = require(qa, "answer", dict, benchmark=bench, where=qwhere)
            validated = qa.get("validated_answers") or []
            if not isinstance(validated, list):
                raise BenchmarkDataError(f"benchmark {bench!r}: {qwhere}: `validated_answers` is not a list")
            golds: list[str] = []
            answer_type = ""
            for a in [answer, *validated]:
                r = render_answer(a)
                if r is None:
                    continue
                answer_type = answer_type or r[0]
                if r[1] not in golds:
                    golds.append(r[1])
            if not golds:
                skipped += 1
                continue
            pid = f"drop/{query_id}"
            if pid in seen:
                raise BenchmarkDataError(f"benchmark {bench!r}: {qwhere}: duplicate query_id {query_id!r}")
            seen.add(pid)
            problems.append(
                Problem(
                    benchmark=bench,
                    id=pid,
                    question=make_question(passage, question),
                    answer=golds[0],
                    family="qa",
                    golds=golds,
                    meta={"dataset": bench, "passage_id": passage_id, "answer_type": answer_type},
                )
            )
    if skipped:
        log.warning("drop: skipped %d question(s) of %s that have no non-empty answer", skipped, p)
    if not problems:
        raise BenchmarkDataError(f"benchmark {bench!r}: {p} holds no questions with an answer; expected {FILE_FORMAT}")
    return problems
