"""W4S's multi-turn optimisation inside sampled_workflows (settings `refinement:`), as its code runs it:

* turn 0: m candidates per training query from the generator prompt;
* self-check: a candidate that does not parse gets up to `refinement.repairs` repair attempts, each shown the
  rejected workflow and the validator's error (W4S retries on the traceback, up to 3 times);
* the environment: every candidate of the turn runs on `feedback_queries` feedback queries (`feedback_problems`:
  by default train-split queries the loop does not train on; never the training query, whose answer is the
  reward); its feedback accuracy is the mean answer score;
* the state advances with the turn's best candidate (`core.methods.w4s.pick_state`); the next turn's prompt shows that
  workflow, its accuracy, up to `failure_cases` failed cases (question, its answer, the expected answer: the
  gold for math/QA, the first public test for code, whose canonical solution is never shown) and the change
  against the previous state; m candidates are sampled from that one prompt.

Rows: turn t's candidates are sample_idx t·m + j with parent_sample_idx = the state they were sampled from; a
repair is sample_idx T·m + (a running count per query), repair_of = the candidate it repairs, parent_sample_idx
= that candidate's state. `feedback_accuracy` is every evaluated row's validation accuracy."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Sequence

from spogw_dagster.benchmarks import load_split_problems
from spogw_dagster.benchmarks.queries import default_splits
from spogw_dagster.contracts import EXCLUDED_STATUSES, Problem
from spogw_dagster.pipeline.domain.jobs import EvalJob, evaluate_jobs

MAX_ERROR_CHARS = 160  # per run in the feedback: enough for the exception line, not a traceback
MAX_CASE_CHARS = 240  # per question / answer in a failure case: the gist, not the whole text


def feedback_problems(cfg) -> list[Problem]:
    """W4S's feedback queries: the last `refinement.feedback_queries` of the split `refinement.feedback_split`
    names. From `train` (the default) they are queries the loop does not train on (the first `train_queries`
    are), so no validation query is spent; from `validation` they are left out of every validation score
    (`SpogwConfig.reserved_validation`). Either way disjoint from the training queries and the test split."""

    b, r = cfg.benchmark, cfg.refinement
    splits = default_splits(b.name, seed=b.split_seed, path=b.data_path)
    problems = load_split_problems(splits, {"train": "train", "validation": "val"}[r.feedback_split], path=b.data_path)
    used = b.train_queries if r.feedback_split == "train" else 0
    if used + r.feedback_queries > len(problems):
        raise ValueError(
            f"refinement.feedback_queries={r.feedback_queries} feedback queries from the {r.feedback_split} split "
            f"of {b.name} ({len(problems)} queries" + (f", the first {used} trained on" if used else "") + "): "
            f"lower refinement.feedback_queries (or comparison.w4s_feedback_queries) to <= {len(problems) - used}"
            + (", lower benchmark.train_queries, or set refinement.feedback_split: validation" if used else ""))
    return problems[-r.feedback_queries:]


@dataclass(frozen=True)
class Run:
    """One feedback run of a workflow on one validation problem."""

    problem: Problem
    status: str
    score: float  # the answer score (1 = solved)
    answer: str
    error: str


def counted(runs: Sequence[Run]) -> list[Run]:
    """The runs that say something about the workflow: an executor error (our infrastructure failed) is
    neither a failure case nor a 0 in the accuracy, as everywhere else (`contracts.EXCLUDED_STATUSES`)."""

    excluded = {s.value for s in EXCLUDED_STATUSES}
    return [r for r in runs if r.status not in excluded]


def accuracy(runs: Sequence[Run]) -> float:
    runs = counted(runs)
    return sum(r.score for r in runs) / len(runs) if runs else 0.0


def _clip(text: str, n: int) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= n else text[: n - 3] + "..."


def expected_answer(p: Problem) -> str:
    """What a failure case shows as correct: the gold (math/QA), or for code the first public test (the
    canonical solution is never shown)."""
    if p.family == "code":
        return p.public_tests[0] if p.public_tests else "(passes the hidden tests)"
    return p.golds[0] if p.golds else p.answer


def feedback_text(runs: Sequence[Run], *, previous: float | None, max_cases: int) -> str:
    """W4S's observation: the validation accuracy, up to `max_cases` failure cases and the change against the
    previous state (`previous`: its accuracy; None at the first turn)."""
    runs = counted(runs)
    solved = sum(r.score >= 1.0 for r in runs)
    lines = [f"validation accuracy {accuracy(runs):.2f} ({solved}/{len(runs)} example tasks solved)"]
    failed = [r for r in runs if r.score < 1.0][:max_cases]
    for i, r in enumerate(failed, 1):
        err = (r.error or "").strip().split("\n")[0][:MAX_ERROR_CHARS]
        lines.append(f"failure {i}: task: {_clip(r.problem.question, MAX_CASE_CHARS)}")
        lines.append(f"  its answer ({r.status}): {_clip(r.answer, MAX_CASE_CHARS) or '(none)'}"
                     + (f" [{err}]" if err else ""))
        lines.append(f"  expected: {_clip(expected_answer(r.problem), MAX_CASE_CHARS)}")
    if previous is not None:
        d = accuracy(runs) - previous
        lines.append(f"change against the previous workflow: {d:+.2f} (it had {previous:.2f})")
    lines.append("Please improve the workflow.")
    return "\n".join(lines)


def run_feedback(pipeline, workflows: Sequence[tuple[str | None, str, str]], problems: Sequence[Problem], cfg,
                 seed: int) -> list[list[Run]]:
    """The runs of each workflow ((code or None when it did not parse, parse status, parse error)) on every
    feedback problem. A workflow that did not parse scores 0 on each without running."""
    jobs, owner = [], []
    for i, (code, status, err) in enumerate(workflows):
        for p in problems:
            jobs.append(EvalJob(p, code, "" if code else status, "" if code else err))
            owner.append(i)
    iso = pipeline.isolation()

    async def go():
        async with pipeline.executor() as ex:
            return await evaluate_jobs(jobs, ex.executor, iso, cfg, seed=seed)

    results = asyncio.run(go()) if jobs else []
    per: list[list[Run]] = [[] for _ in workflows]
    for i, j, r in zip(owner, jobs, results):
        per[i].append(Run(j.problem, r.status.value, float(r.score), r.answer or "", r.error or ""))
    return per
