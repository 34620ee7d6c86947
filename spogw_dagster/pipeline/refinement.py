"""W4S's multi-turn refinement (settings `refinement:`), used by sampled_workflows: run each workflow of the
last turn on a few validation queries, turn the results into feedback text, and ask the generator for a
revision. Turn t's rows are sample_idx t·m + j with parent_sample_idx j' of turn t−1 (a chain per sample)."""

from __future__ import annotations

import asyncio
from typing import Sequence

from spogw_dagster.contracts import Problem

from .resources import EvalJob, evaluate_jobs

MAX_ERROR_CHARS = 160  # per run in the feedback: enough for the exception line, not a traceback


def feedback_problems(cfg) -> list[Problem]:
    """The first `refinement.feedback_queries` of the validation split (disjoint from train and test)."""
    from spogw_dagster.evaluation import split_problems

    b = cfg.benchmark
    problems, _ = split_problems(b.name, "validation", limit=cfg.refinement.feedback_queries, seed=b.split_seed,
                                 path=b.data_path)
    return problems


def feedback_text(runs: Sequence[tuple[str, float, str]]) -> str:
    """One line per example task (status, reward, the error's first line) and the mean reward; `runs` holds
    (status, reward, error) per example task."""
    lines = []
    for i, (status, reward, error) in enumerate(runs, 1):
        err = (error or "").strip().split("\n")[0][:MAX_ERROR_CHARS]
        lines.append(f"example {i}: {status}, reward {reward:.2f}" + (f" ({err})" if err else ""))
    mean = sum(r for _, r, _ in runs) / max(1, len(runs))
    lines.append(f"mean reward {mean:.2f} over {len(runs)} example tasks")
    return "\n".join(lines)


def run_feedback(pipeline, workflows: Sequence[tuple[str | None, str, str]], problems: Sequence[Problem], cfg,
                 seed: int) -> list[str]:
    """Feedback for each workflow: (code or None when it did not parse, parse status, parse error). A workflow
    that did not parse gets its parse error as feedback without running."""
    from .rewards import Ladder
    from .tables import execution_row

    jobs, owner = [], []
    for i, (code, status, err) in enumerate(workflows):
        for p in problems:
            jobs.append(EvalJob(p, code, "" if code else status, "" if code else err))
            owner.append(i)
    iso = pipeline.isolation()

    async def go():
        async with pipeline.executor() as ex:
            return await evaluate_jobs(jobs, ex.executor, iso, cfg, seed=seed)

    results = asyncio.run(go())
    ladder = Ladder(**cfg.reward.model_dump())
    per: list[list[tuple[str, float, str]]] = [[] for _ in workflows]
    for i, j, r in zip(owner, jobs, results):
        row = execution_row(0, j.problem.id, 0, workflows[i][1], r, ladder, workflow=j.code)
        per[i].append((row["status"], row["score"], row["error"]))
    return [feedback_text(runs) for runs in per]
