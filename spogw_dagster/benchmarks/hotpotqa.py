"""HotpotQA, read from a user-given file in the standard `hotpot_dev_distractor_v1.json` format.

Format: a JSON list of {"_id", "question", "answer", "context": [[title, [sentence, ...]], ...],
"supporting_facts": [[title, sentence_index], ...], "type", "level"}.

Per question: question = the context paragraphs ("Title: sentences", one per paragraph) then the
question; golds = [answer]. Supporting facts, type and level are kept in meta.
"""

from __future__ import annotations

from pathlib import Path

from ..contracts import Problem
from .dataio import BenchmarkDataError, read_json, require, resolve_data_path

FILE_FORMAT = (
    "HotpotQA JSON (hotpot_dev_distractor_v1.json): a list of {_id, question, answer, "
    "context: [[title, [sentences]]], supporting_facts, type, level}"
)
STANDARD_NAMES = ("hotpot_dev_distractor_v1.json", "hotpot_dev_fullwiki_v1.json", "hotpot_train_v1.1.json")


def make_question(context: list[tuple[str, list[str]]], question: str) -> str:
    paragraphs = "\n".join(f"{title}: {''.join(sents).strip()}" for title, sents in context)
    return f"Context:\n{paragraphs}\n\nQuestion: {question.strip()}"


def load_hotpotqa(path: str | Path | None = None) -> list[Problem]:
    bench = "hotpotqa"
    p = resolve_data_path(bench, path, file_format=FILE_FORMAT, standard_names=STANDARD_NAMES)
    data = read_json(p, bench, FILE_FORMAT, top=list)
    problems: list[Problem] = []
    seen: set[str] = set()
    for i, rec in enumerate(data):
        where = f"{p} item {i}"
        if not isinstance(rec, dict):
            raise BenchmarkDataError(f"benchmark {bench!r}: {where} is not an object; expected {FILE_FORMAT}")
        qid = require(rec, "_id", str, benchmark=bench, where=where)
        where = f"{where} (_id {qid})"
        question = require(rec, "question", str, benchmark=bench, where=where)
        answer = require(rec, "answer", str, benchmark=bench, where=where)
        raw_ctx = require(rec, "context", list, benchmark=bench, where=where)
        context: list[tuple[str, list[str]]] = []
        for j, para in enumerate(raw_ctx):
            if not (
                isinstance(para, (list, tuple))
                and len(para) == 2
                and isinstance(para[0], str)
                and isinstance(para[1], list)
                and all(isinstance(s, str) for s in para[1])
            ):
                raise BenchmarkDataError(
                    f"benchmark {bench!r}: {where}: context[{j}] is not [title, [sentences]]"
                )
            context.append((para[0], list(para[1])))
        pid = f"hotpotqa/{qid}"
        if pid in seen:
            raise BenchmarkDataError(f"benchmark {bench!r}: {where}: duplicate _id")
        seen.add(pid)
        problems.append(
            Problem(
                benchmark=bench,
                id=pid,
                question=make_question(context, question),
                answer=answer,
                family="qa",
                golds=[answer],
                meta={
                    "dataset": bench,
                    "type": rec.get("type", ""),
                    "level": rec.get("level", ""),
                    "supporting_facts": rec.get("supporting_facts", []),
                },
            )
        )
    if not problems:
        raise BenchmarkDataError(f"benchmark {bench!r}: {p} holds no questions; expected {FILE_FORMAT}")
    return problems
