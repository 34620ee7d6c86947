"""Scoring policies and static baselines on held-out (or validation) queries: shared by `benchmark_report` and
`spogw evaluate`. No Dagster here: callers pass a `PipelineResource` (or one built by hand) for the services.

Seeds, so that the comparison with π_{k-1} is paired:
- greedy mode: one workflow per query (temperature 0), executed with executor seed `report.seed` (the seed
  `spogw baseline` uses, so greedy baselines reproduce its numbers);
- sampled mode: one sampler call per policy with n = k, the same prompts in the same order, the same batch
  size and the same seed `derive_seed(report.seed, "report-sampler")`, so sample j of query q gets the
  same per-row seed (the sampler derives it from (seed, query index, j)) under both policies; its runs use executor seed `derive_seed(report.seed,
  "report-exec", j)` for every system, so two policies that write the same workflow get the same result
  (and the second is served from the call cache).
- static baselines have no generator: greedy = one run at `report.seed`; with `report.baseline_samples` = b
  > 0 also a sampled mode of b runs at the executor seeds of samples 0..b-1. They do not depend on the
  checkpoint, so their rows are cached by content under `<assets>/report_cache/` and reused by every
  iteration with the same benchmark split, executor, execution, reward and report settings.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import polars as pl

from spogw_dagster.benchmarks.queries import split_problems
from spogw_dagster.contracts import Problem
from spogw_dagster.evaluation import baseline_workflow
from spogw_dagster.pipeline.data import tables
from spogw_dagster.pipeline.data.storage import write_parquet_atomic
from spogw_dagster.pipeline.domain.errors import DomainError
from spogw_dagster.pipeline.domain.generation import generate_samples
from spogw_dagster.pipeline.domain.jobs import EvalJob, evaluate_jobs
from spogw_dagster.pipeline.settings import executor_identity
from spogw_dagster.seeds import derive_seed
from spogw_dagster.workflow.copies import copied_from

CACHE_DIR = "report_cache"


def heldout_problems(cfg) -> tuple[list, dict[str, Any]]:
    """The report's queries (test or validation split) and the record of the split; `DomainError` when the split
    cannot give them (too few queries, a missing data file)."""

    rep, b = cfg.report, cfg.benchmark
    try:
        return split_problems(b.name, rep.split, limit=b.heldout_queries if rep.split == "test" else
                              b.validation_queries, seed=b.split_seed, path=b.data_path,
                              reserve=cfg.reserved_validation(rep.split))
    except ValueError as e:
        raise DomainError(f"report.split={rep.split}: {e}") from None


@dataclass(frozen=True)
class Policy:
    """A generator policy to score: base model (adapter None) or base + LoRA adapter."""

    system: str  # "spogw@0001", "base", ...
    kind: str  # checkpoint | previous
    adapter: Path | None = None
    checkpoint_iteration: int | None = None
    adapter_sha256: str | None = None


def previous_policy(parent) -> Policy:
    """π_{k-1} as a policy: the base model at k = 0 (`parent` None), else the parent checkpoint's adapter
    (`data.checkpoints.ParentCheckpoint`)."""
    if parent is None:
        return Policy("base", "previous")
    return Policy(f"spogw@{parent.partition}", "previous", parent.path, parent.iteration, parent.sha256)


def report_sampler_seed(report_seed: int) -> int:
    return derive_seed(report_seed, "report-sampler")


def exec_seed(report_seed: int, mode: str, j: int) -> int:
    return report_seed if mode == "greedy" else derive_seed(report_seed, "report-exec", j)


def modes(cfg) -> list[tuple[str, int, float]]:
    """(mode, samples per query, temperature) the report scores policies in."""
    rep = cfg.report
    out = [("greedy", 1, 0.0)] if rep.greedy else []
    if rep.samples:
        out.append(("sampled", rep.samples, cfg.report_temperature()))
    return out


Planned = list[tuple[tables.HeldoutSample, EvalJob]]


def policy_jobs(pipeline, policy: Policy, problems: Sequence[Problem], cfg) -> Planned:
    """Generate the policy's workflows in every mode and plan their executions."""
    family = problems[0].family
    seed = report_sampler_seed(cfg.report.seed)
    out: Planned = []
    for mode, n, temp in modes(cfg):
        _, samples, _ = generate_samples(pipeline, policy.adapter, problems, n=n, temperature=temp, seed=seed)
        for p, row in zip(problems, samples):
            for j, s in enumerate(row):
                code, status, err = tables.parse_completion(s.text, family)
                ok = status == "ok"
                hs = tables.HeldoutSample(policy.system, policy.kind, mode, p.id, j, seed,
                                          exec_seed(cfg.report.seed, mode, j), temp, status, code, s.finish_reason,
                                          len(s.token_ids), policy.checkpoint_iteration, policy.adapter_sha256,
                                          copied_from(code, family) if ok else None)
                out.append((hs, EvalJob(p, code if ok else None, "" if ok else status, err)))
    return out


def baseline_jobs(method: str, problems: Sequence[Problem], cfg) -> Planned:
    code = baseline_workflow(problems[0].family, method)
    rep = cfg.report
    plan = ([("greedy", 0)] if rep.greedy else []) + [("sampled", j) for j in range(rep.baseline_samples)]
    return [(tables.HeldoutSample(f"baseline:{method}", "baseline", mode, p.id, j, None,
                                  exec_seed(rep.seed, mode, j), None, "ok", code), EvalJob(p, code))
            for mode, j in plan for p in problems]


def heldout_runs(cfg) -> int:
    """Executor runs per held-out workflow (its answer score the mean): `report.runs`, else `execution.runs`."""
    return cfg.report.runs if cfg.report.runs is not None else cfg.execution.runs


def baseline_cache_key(method: str, problems: Sequence[Problem], cfg) -> str:
    """Everything a baseline's rows depend on (not the generator, not the checkpoint). Format 3: the executor's
    run seed no longer includes the workflow's text (common random numbers), so rows of format 2 drew otherwise.
    Format 4: rows keep the answer, and code answers are judged on the code the tests run (`benchmarks.live_code`);
    the executor's calls are the same, so the call cache serves a format-3 baseline's rerun."""

    c = cfg.canonical()
    rep = c["report"]
    doc = {"code": baseline_workflow(problems[0].family, method), "benchmark": c["benchmark"]["name"],
           "queries": [[p.id, p.question, p.answer] for p in problems], "executor": executor_identity(c["executor"]),
           "execution": c["execution"], "reward": c["reward"],
           "report": {k: rep[k] for k in ("seed", "greedy", "baseline_samples", "split")}, "format": 4}
    if rep.get("runs") is not None:  # only when set: the keys of every earlier baseline stay valid
        doc["runs"] = heldout_runs(cfg)
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def cached_baseline(root: Path, key: str, iteration: int) -> pl.DataFrame | None:
    p = root / CACHE_DIR / f"baseline-{key[:24]}.parquet"
    if not p.is_file():
        return None
    try:
        rows = pl.read_parquet(p)
    except Exception:  # a damaged cache file is recomputed, not trusted
        return None
    return tables.relabel(tables.with_baseline_columns(rows), iteration)


def store_baseline(root: Path, key: str, rows: pl.DataFrame) -> None:
    """Cache a baseline's rows unless an executor error makes them not the baseline's own result."""

    if rows.height and rows.filter(pl.col("status") == "executor_error").height == 0:
        (root / CACHE_DIR).mkdir(parents=True, exist_ok=True)
        write_parquet_atomic(rows, root / CACHE_DIR / f"baseline-{key[:24]}.parquet")


def execute(pipeline, planned: Planned, cfg, iteration: int, split: str,
            time_split: dict[str, float] | None = None) -> tuple[pl.DataFrame, dict[str, int]]:
    """Execute every planned workflow (runs of one executor seed together) and build heldout rows; where the
    executor's time went is added into `time_split` when given."""
    iso = pipeline.isolation()
    by_seed: dict[int, list[int]] = defaultdict(list)
    for i, (hs, _) in enumerate(planned):
        by_seed[hs.exec_seed].append(i)

    async def run():
        results: list[Any] = [None] * len(planned)
        async with pipeline.executor() as ex:
            for seed, idx in by_seed.items():
                res = await evaluate_jobs([planned[i][1] for i in idx], ex.executor, iso, cfg, seed=seed,
                                          runs=heldout_runs(cfg))
                for i, r in zip(idx, res):
                    results[i] = r
            if time_split is not None:
                time_split.update(ex.time_split())
            return results, {**ex.counters(), "failed_calls": int(getattr(ex.executor, "failures", 0))}

    results, counters = asyncio.run(run()) if planned else ([], {"cache_hits": 0, "new_calls": 0,
                                                                 "uncacheable_calls": 0, "failed_calls": 0})
    ladder = cfg.reward.core()
    rows = [tables.heldout_row(iteration, split, hs, r, ladder) for (hs, _), r in zip(planned, results)]
    return tables.heldout_frame(rows), counters


@dataclass
class Scored:
    heldout: pl.DataFrame
    counters: dict[str, int]
    baselines_cached: list[str]
    executed: pl.DataFrame  # the rows executed just now (valid workflows; not reused or cached ones): the
    # outage rule's input (domain/outage.py)
    generation_s: float = 0.0  # writing the policies' held-out workflows (the generator's share of the report)
    time_split: dict[str, float] = field(default_factory=dict)  # the executor's (executors.time_split_of)


def score(pipeline, policies: Sequence[Policy], problems: Sequence[Problem], cfg, *, iteration: int, split: str,
          reused: Sequence[pl.DataFrame] = (), say=lambda msg: None) -> Scored:
    """Generate and execute every policy's workflows, take the baselines from the cache (or run and cache
    them), and return all held-out rows (plus `reused` rows, e.g. π_{k-1}'s from the last report)."""
    root = Path(pipeline.assets_dir)
    planned: Planned = []
    per_policy = len(problems) * sum(n for _, n, _ in modes(cfg))
    t0 = time.monotonic()
    for policy in policies:
        say(f"generating {per_policy} {split} workflows from {policy.system}")
        planned += policy_jobs(pipeline, policy, problems, cfg)
    generation_s = time.monotonic() - t0
    parts, fresh, cached_names = list(reused), {}, []
    for method in cfg.report.baselines:
        key = baseline_cache_key(method, problems, cfg)
        cached = cached_baseline(root, key, iteration)
        if cached is not None:
            parts.append(cached)
            cached_names.append(method)
        else:
            fresh[f"baseline:{method}"] = key
            planned += baseline_jobs(method, problems, cfg)
    say(f"executing {len(planned)} workflows on {len(problems)} {split} queries"
        + (f" (baselines from the cache: {', '.join(cached_names)})" if cached_names else ""))
    split_ = {}
    rows, counters = execute(pipeline, planned, cfg, iteration, split, time_split=split_)
    for system, key in fresh.items():
        store_baseline(root, key, rows.filter(pl.col("system") == system))
    heldout = tables.heldout_frame(pl.concat([rows, *parts], how="vertical_relaxed").to_dicts())
    return Scored(heldout, counters, cached_names, rows.filter(pl.col("valid")), round(generation_s, 2), split_)
