"""Checkpoint selection on the validation split (`selection` in the config): the trained adapter of iteration k
becomes checkpoint k only if, greedy on the validation queries, its answer score is at least π_{k-1}'s plus
`min_delta` (the paired difference over the same queries and executor seeds); otherwise π_{k-1} goes on.

One iteration's choice of workflow structure rests on a handful of samples (runs C, E and F of the `answers`
profile saw the same completions and ended at 6, 40 and 0 ensemble workflows out of 40), so a policy can come
out of training below its parent; this keeps such a policy from becoming the next parent or the reported
checkpoint, judged on queries the report never scores. With several training lengths (`selection.epochs`), every
trained adapter is scored in the same pass and the best on validation is the candidate (`best_length`).
No Dagster here: the asset turns errors into failures.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

import polars as pl

from spogw_dagster.pipeline.data import report_stats
from spogw_dagster.pipeline.domain import heldout as ho
from spogw_dagster.pipeline.domain.errors import DomainError

__all__ = ["Verdict", "best_length", "decide", "length_verdicts", "validation_config", "score_validation",
           "verdict_of"]


@dataclass(frozen=True)
class Verdict:
    keep: bool
    candidate: float  # greedy validation answer score of the trained adapter
    parent: float  # the same for π_{k-1}
    delta: float  # paired difference, candidate − parent
    ci_low: float | None
    ci_high: float | None
    queries: int
    min_delta: float
    epochs: int | None = None  # the candidate's training length
    # (epochs, greedy validation answer, paired Δ vs π_{k-1}) of every length tried (`selection.epochs`)
    tried: tuple[tuple[int, float, float], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def sentence(self, parent_system: str) -> str:
        ci = "" if self.ci_low is None else f" [{self.ci_low:+.3f}, {self.ci_high:+.3f}]"
        lengths = "" if not self.tried else (
            "training lengths " + ", ".join(f"{e} epochs {v:.3f} (Δ {d:+.3f})" for e, v, d in self.tried)
            + f": {self.epochs} epochs is the candidate; ")
        return (lengths + f"validation (greedy, {self.queries} queries): trained {self.candidate:.3f} vs {parent_system} "
                f"{self.parent:.3f}, Δ {self.delta:+.3f}{ci}; "
                + ("kept" if self.keep else f"below min_delta {self.min_delta:+.3f}: {parent_system} carried forward"))


def decide(delta: float, min_delta: float) -> bool:
    """Keep the trained adapter when its paired gain over π_{k-1} reaches min_delta (a tie keeps it at 0)."""
    return delta >= min_delta - 1e-12  # a mean of 0/1 scores: no float noise may turn a tie into a rejection


def best_length(tried: Sequence[tuple[int, float, float]]) -> int:
    """The index of the training length with the largest paired gain over π_{k-1} (each length is paired with
    the parent on the queries both answered, so a length that met more executor errors is not favoured); a tie
    goes to the one listed first (`selection.epochs` order)."""
    if not tried:
        raise DomainError("no trained adapter to choose among; fix: check selection.epochs")
    best = 0
    for i, t in enumerate(tried):
        if t[2] > tried[best][2] + 1e-12:  # means of 0/1 scores: float noise must not break a tie
            best = i
    return best


def validation_config(cfg):
    """`cfg` with the report narrowed to the gate's measurement: greedy only, no baselines, the validation split,
    the selection's executor seed and runs (unset: execution.runs)."""
    sel = cfg.selection
    # runs unset: execution.runs (a section lora_checkpoint hashes when selection is on), never report.runs
    report = cfg.report.model_copy(update={"split": "validation", "greedy": True, "samples": 0, "baselines": [],
                                           "baseline_samples": 0, "seed": sel.seed, "runs": sel.runs})
    return cfg.model_copy(update={"report": report})


def score_validation(pipeline, candidates: Sequence[ho.Policy], parent: ho.Policy, cfg, *, iteration: int,
                     say=lambda msg: None) -> tuple[pl.DataFrame, ho.Scored, int]:
    """Score the trained adapters and π_{k-1} greedy on the validation split; returns (the long-format report,
    the scored rows, the number of queries). The caller checks the executor outage rule, then `verdict_of`."""
    vcfg = validation_config(cfg)
    problems, info = ho.heldout_problems(vcfg)
    scored = ho.score(pipeline, [*candidates, parent], problems, vcfg, iteration=iteration, split="validation",
                      say=say)
    report = report_stats.summarize_heldout(scored.heldout, iteration=iteration, config_hash=cfg.hash,
                                            split_ids_sha256=info["ids_sha256"],
                                            resamples=cfg.report.bootstrap_resamples, seed=cfg.selection.seed)
    return report, scored, len(problems)


def verdict_of(report: pl.DataFrame, min_delta: float, queries: int, system: str | None = None) -> Verdict:
    """The verdict from the validation report's greedy answer-score rows (candidate: `system`, else the first of
    kind checkpoint)."""
    cand = report_stats.metric_row(report if system is None else report.filter(pl.col("system") == system),
                                   "checkpoint", "answer_score", "greedy")
    prev = report_stats.metric_row(report, "previous", "answer_score", "greedy")
    if cand is None or prev is None or cand["diff_vs_prev"] is None:
        raise DomainError(f"the validation report has no paired greedy answer score of the trained adapter "
                          f"{system or ''} and its parent: every validation run was an executor error; fix the "
                          "executor, then rematerialize lora_checkpoint (the trained adapter is reused)")
    delta = float(cand["diff_vs_prev"])
    return Verdict(decide(delta, min_delta), float(cand["value"]), float(prev["value"]), delta,
                   cand["diff_ci_low"], cand["diff_ci_high"], queries, min_delta)


def length_verdicts(report: pl.DataFrame, min_delta: float, queries: int, systems: Sequence[tuple[int, str]]):
    """Each training length's verdict against π_{k-1} ((epochs, system) pairs, in tie-break order). A length with
    no paired validation answer (every run of it an executor error) is left out and returned with why; only when
    every length has none is it an error. Returns ([(epochs, Verdict)], [(epochs, why)])."""
    verdicts, unpaired, first_error = [], [], None
    for e, system in systems:
        try:
            verdicts.append((e, verdict_of(report, min_delta, queries, system=system)))
        except DomainError as err:
            unpaired.append((e, str(err)))
            first_error = first_error or err
    if not verdicts:
        raise first_error
    return verdicts, unpaired
