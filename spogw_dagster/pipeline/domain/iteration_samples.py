"""Iteration k's sampled rows: m workflows per training query from π_{k-1} (the base model at k = 0), then, with
W4S refinement on (refinement.turns = T > 1), its turns: self-check repairs, feedback runs on validation queries,
the best candidate advancing each query's state, the next turn sampled from a prompt showing it
(`domain/refinement.py` holds the feedback pieces, `core/methods/w4s.py` the state rule); with
`generator.anchors`, the prompt's own workflows as rows after the m samples (`domain/anchors.py`). No Dagster: the asset
`sampled_workflows` and the comparison's own data for W4S call it with a `PipelineResource`'s services and a
`say` for progress lines."""

from __future__ import annotations

from typing import Callable

import polars as pl

from spogw_dagster.core.methods.w4s import pick_state
from spogw_dagster.pipeline.data import tables
from spogw_dagster.pipeline.domain.anchors import anchor_rows
from spogw_dagster.pipeline.domain.generation import generate_samples, sample_prompts
from spogw_dagster.pipeline.domain.refinement import accuracy, feedback_problems, feedback_text, run_feedback
from spogw_dagster.seeds import derive_seed
from spogw_dagster.workflow.template import refinement_prompt, repair_prompt

__all__ = ["sample_iteration"]

Say = Callable[[str], None]


def _quiet(msg: str) -> None:
    pass


def sample_iteration(pipeline, cfg, k: int, parent, problems, seed: int, say: Say = _quiet,
                     timing: dict[str, float] | None = None) -> tuple[pl.DataFrame, float]:
    """Iteration k's rows: m workflows per query from π_{k-1} (`parent`, None = the base model), then W4S's turns
    when refinement is on. Returns (rows, generation tokens/s of the first turn); `timing` (when given) gets the
    first turn's sampler load, prefill and decode seconds."""
    prompts, samples, tps = generate_samples(pipeline, parent.path if parent else None, problems, n=cfg.curation.m,
                                             temperature=cfg.generator.temperature, seed=seed, timing=timing)
    df = tables.sampled_frame(
        k, [p.id for p in problems], prompts, samples, problems[0].family,
        parent_iteration=parent.iteration if parent else None, parent_sha256=parent.sha256 if parent else None,
        generator=cfg.generator.model,
    )
    if cfg.refinement.enabled:
        df = _refine(say, pipeline, cfg, k, parent, problems[0].family, df)
    if cfg.generator.anchors:
        anchors = anchor_rows(cfg, k, parent, problems, first_idx=cfg.curation.m)
        say(f"added {anchors.height} anchor rows (the prompt's {anchors.height // len(problems)} workflows per query)")
        df = pl.concat([df, anchors], how="vertical").sort(["query_id", "sample_idx"])
    return df, tps


def _refine(say: Say, pipeline, cfg, k: int, parent, family: str, first: pl.DataFrame) -> pl.DataFrame:
    """W4S's turns (`pipeline/domain/refinement.py`): self-check each turn's candidates, run them on the feedback
    queries, advance each query's state with its best candidate and sample the next turn's m candidates from
    one prompt showing the state and its feedback. Returns every candidate and repair of every turn."""
    rc, m = cfg.refinement, cfg.curation.m
    fb_problems = feedback_problems(cfg)
    base_prompt = {r["query_id"]: r["prompt"] for r in first.iter_rows(named=True)}
    sample = _turn_sampler(pipeline, cfg, k, parent, family)
    next_repair = {q: rc.turns * m for q in base_prompt}  # repairs are numbered after every turn's candidates
    frames, state_acc, cur = [], {}, first
    for t in range(rc.turns):
        cur, effective = _self_check(say, sample, cur, t, rc.repairs, next_repair)
        if t == rc.turns - 1:
            frames.append(cur)
            break
        say(f"turn {t}: running {len(effective)} candidates on {len(fb_problems)} validation queries")
        runs = run_feedback(pipeline, [(r["workflow"] if r["parse_status"] == "ok" else None, r["parse_status"],
                                        r["parse_error"] or "") for r in effective], fb_problems, cfg,
                            seed=derive_seed(cfg.execution.seed, "feedback", k, t))
        acc = {(r["query_id"], r["sample_idx"]): accuracy(ru) for r, ru in zip(effective, runs)}
        accf = pl.DataFrame({"query_id": [q for q, _ in acc], "sample_idx": [i for _, i in acc],
                             "feedback_accuracy": list(acc.values())},
                            schema={"query_id": pl.String(), "sample_idx": pl.Int64(), "feedback_accuracy": pl.Float64()})
        frames.append(cur.drop("feedback_accuracy").join(accf, on=["query_id", "sample_idx"], how="left")
                      .select(list(tables.SAMPLED_SCHEMA)))
        prompts, parents = [], []
        for q in base_prompt:
            mine = [(i, r) for i, r in enumerate(effective) if r["query_id"] == q]
            best = pick_state([(r["sample_idx"], acc[(q, r["sample_idx"])]) for _, r in mine])
            i, r = next((i, r) for i, r in mine if r["sample_idx"] == best)
            prompts.append(refinement_prompt(base_prompt[q], r["workflow"] or "",
                                             feedback_text(runs[i], previous=state_acc.get(q),
                                                           max_cases=rc.failure_cases)))
            parents.append(best)
            state_acc[q] = acc[(q, best)]
        say(f"turn {t}: states advanced, mean validation accuracy of the states "
                     f"{sum(state_acc.values()) / max(1, len(state_acc)):.2f}")
        cur = sample(list(base_prompt), prompts, m, t + 1, [[(t + 1) * m + j for j in range(m)] for _ in prompts],
                     [[p] * m for p in parents], None, ("turn", t + 1))
    return pl.concat(frames, how="vertical").sort(["query_id", "sample_idx"])


def _turn_sampler(pipeline, cfg, k: int, parent, family: str):
    """sample(query_ids, prompts, n, turn, sample_idx, parent_sample_idx, repair_of, seed_tag) -> rows."""
    def sample(qids, prompts, n, turn, idx, parents, repairs, tag) -> pl.DataFrame:
        samples, _ = sample_prompts(pipeline, parent.path if parent else None, prompts, n=n,
                                    temperature=cfg.generator.temperature,
                                    seed=derive_seed(cfg.generator.seed, "sample", k, *tag))
        return tables.sampled_frame(
            k, qids, prompts, samples, family, parent_iteration=parent.iteration if parent else None,
            parent_sha256=parent.sha256 if parent else None, generator=cfg.generator.model, turn=turn,
            sample_idx=idx, parent_sample_idx=parents, repair_of=repairs)

    return sample


def _self_check(say: Say, sample, cur: pl.DataFrame, t: int, repairs: int, next_repair: dict[str, int]):
    """W4S's self-check: up to `repairs` attempts to rewrite each unparsed candidate from its validator error.
    Returns (the turn's rows with the repair rows, the effective candidate of each slot: the candidate, or its
    last repair)."""
    rows = cur.sort(["query_id", "sample_idx"]).to_dicts()
    effective = {(r["query_id"], r["sample_idx"]): r for r in rows}
    pending = [(r, r) for r in rows if r["parse_status"] != "ok"]  # (candidate, its latest attempt)
    frames = [cur]
    for attempt in range(repairs):
        if not pending:
            break
        idx = []
        for cand, _ in pending:
            idx.append([next_repair[cand["query_id"]]])
            next_repair[cand["query_id"]] += 1
        fr = sample([c["query_id"] for c, _ in pending],
                    [repair_prompt(last["prompt"], last["workflow"] or "", last["parse_error"] or "")
                     for _, last in pending], 1, t, idx, [[c["parent_sample_idx"]] for c, _ in pending],
                    [[c["sample_idx"]] for c, _ in pending], ("repair", t, attempt))
        frames.append(fr)
        by_idx = {(r["query_id"], r["sample_idx"]): r for r in fr.to_dicts()}
        nxt = []
        for (cand, _), i in zip(pending, idx):
            new = by_idx[(cand["query_id"], i[0])]
            effective[(cand["query_id"], cand["sample_idx"])] = new
            if new["parse_status"] != "ok":
                nxt.append((cand, new))
        say(f"turn {t}: repair attempt {attempt + 1}: {len(pending) - len(nxt)} of {len(pending)} "
                     "rejected candidates now parse")
        pending = nxt
    return pl.concat(frames, how="vertical"), list(effective.values())
