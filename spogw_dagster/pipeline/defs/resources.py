"""Dagster resources: the pipeline settings (typed config + assets directory) and per-step services.

`PipelineResource` is what every asset and check receives. Its fields (profile, config file, overrides, assets
directory) show in the UI's launchpad; `config()` turns them into a validated `SpogwConfig`. It also builds
the services an asset needs for one step: the benchmark queries, the sandbox (`detect_isolation`, recorded in
metadata), the generator sampler and the executor (the embedded llama.cpp model or an OpenAI-compatible
endpoint) wrapped in the persistent call cache under the assets directory, whose hit/miss counters prove that
a rerun makes no new executor calls.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, AsyncIterator

import dagster as dg

from spogw_dagster.benchmarks import BenchmarkDataError
from spogw_dagster.benchmarks.queries import default_split_sizes, held_out_problems, split_problems, training_problems
from spogw_dagster.contracts import Problem
from spogw_dagster.core.inference.sampling import make_sampler
from spogw_dagster.executors.attribution import FaultAttributingExecutor
from spogw_dagster.executors.base import time_split_of
from spogw_dagster.executors.factory import make_executor
from spogw_dagster.models import resolve_dtype
from spogw_dagster.pipeline.data.storage import AssetStore
from spogw_dagster.pipeline.settings import ConfigValidationError, SpogwConfig, parse_config
from spogw_dagster.sandboxing import detect_isolation


@lru_cache(maxsize=16)
def _parse(config_json: str) -> SpogwConfig:
    """Validate the resolved configuration (merged once, by `load_config`); no profile or file is read again."""
    return parse_config(json.loads(config_json))


@lru_cache(maxsize=16)
def _queries(benchmark: str, data_path: str | None, split_seed: int, d: int, h: int) -> tuple[tuple[Problem, ...], tuple[Problem, ...]]:
    n_train, n_val, n_test = default_split_sizes(benchmark, path=data_path)
    if d > n_train:
        raise ValueError(f"benchmark.train_queries={d} but the train split of {benchmark} has {n_train} queries")
    if h > n_test:
        raise ValueError(f"benchmark.heldout_queries={h} but the test split of {benchmark} has {n_test} queries")
    train = training_problems(benchmark, limit=d, seed=split_seed, path=data_path)
    heldout = held_out_problems(benchmark, limit=h, seed=split_seed, path=data_path)
    overlap = {p.id for p in train} & {p.id for p in heldout}
    if overlap:  # pragma: no cover - the splits are disjoint by construction
        raise RuntimeError(f"train and held-out queries overlap: {sorted(overlap)[:3]}")
    return tuple(train), tuple(heldout)


def check_benchmark_data(cfg: SpogwConfig) -> None:
    """Read the benchmark's training and report queries once, before a command writes anything: a missing or
    malformed data file (wrong top-level type, missing fields, bad encoding, too few queries) is one error naming
    the file, what is wrong and the fix, instead of a failed first step."""


    b, rep = cfg.benchmark, cfg.report
    try:
        _queries(b.name, b.data_path, b.split_seed, b.train_queries, b.heldout_queries)
        split_problems(b.name, rep.split, limit=b.heldout_queries if rep.split == "test" else b.validation_queries,
                       seed=b.split_seed, path=b.data_path,
                       reserve=cfg.reserved_validation(rep.split))
    except (BenchmarkDataError, ValueError) as e:
        fix = ("point benchmark.data_path at the benchmark's standard file (or fix the file); nothing was written"
               if isinstance(e, BenchmarkDataError) else "lower the count or pick another split; nothing was written")
        what = str(e) if str(e).startswith("benchmark ") else f"benchmark {b.name!r}: {e}"
        raise ConfigValidationError(f"{what}. Fix: {fix}") from None


class PipelineResource(dg.ConfigurableResource):
    """Pipeline settings: the resolved configuration (profile, YAML file and overrides already merged by
    `load_config`; the UI's launchpad shows it in full) and where materialized assets live."""

    assets_dir: str
    config_json: str

    @classmethod
    def from_config(cls, cfg: SpogwConfig, assets_dir: str | Path) -> "PipelineResource":
        return cls(assets_dir=str(assets_dir), config_json=cfg.model_dump_json())

    def config(self) -> SpogwConfig:
        return _parse(self.config_json)

    def store(self) -> AssetStore:
        return AssetStore(self.assets_dir)

    def train_queries(self) -> list[Problem]:
        b = self.config().benchmark
        return list(_queries(b.name, b.data_path, b.split_seed, b.train_queries, b.heldout_queries)[0])

    def heldout_queries(self) -> list[Problem]:
        b = self.config().benchmark
        return list(_queries(b.name, b.data_path, b.split_seed, b.train_queries, b.heldout_queries)[1])

    def isolation(self):
        e = self.config().execution
        return detect_isolation(e.isolation, e.allow_unsandboxed)

    def cache_path(self) -> Path:
        p = Path(self.config().executor.cache_file).expanduser()
        return p if p.is_absolute() else Path(self.assets_dir) / p

    def sampler(self, adapter_path: str | Path | None, seed: int):
        g = self.config().generator
        # "auto" resolved here for every backend: vLLM's own "auto" (the checkpoint's type, fp16 on older GPUs)
        # could differ from the trainer's, and π_old must come from the type training recomputes it in
        return make_sampler(g.backend, model_spec=g.model, adapter_path=str(adapter_path) if adapter_path else None,
                            batch_size=g.batch_size, seed=seed, dtype=resolve_dtype(g.dtype))

    @contextlib.asynccontextmanager
    async def executor(self) -> AsyncIterator["ExecutorSession"]:
        """A fresh executor for one asyncio.run (asyncio primitives must not cross event loops)."""

        e = self.config().executor
        ex = make_executor(e.endpoints(), e.model, cache_path=self.cache_path(), use_cache=e.cache,
                           api_key_env=e.api_key_env, max_concurrency=e.max_concurrency, timeout_s=e.timeout_s,
                           workers=e.workers, threads=e.threads, reproducible=e.reproducible)
        session = ExecutorSession(ex)
        try:
            yield session
        finally:
            await ex.aclose()
            cache = getattr(ex, "cache", None)
            if cache is not None:
                cache.close()


@dataclass
class ExecutorSession:
    executor: Any

    @property
    def model(self) -> str:
        return self.executor.model

    def counters(self) -> dict[str, int]:
        ex = self.executor

        node = ex  # the attributing layer sits under the cache (CachingExecutor.inner)
        while node is not None and not isinstance(node, FaultAttributingExecutor):
            node = vars(node).get("inner")
        faults = node.request_faults_of() if node is not None else {}
        return {"cache_hits": int(getattr(ex, "hits", 0)), "new_calls": int(getattr(ex, "misses", 0)),
                "uncacheable_calls": int(getattr(ex, "uncacheable", 0)), **faults}

    def time_split(self) -> dict[str, float]:
        """Where the executor's served calls spent their time (`executors.time_split_of`), rounded."""
        return {k: round(v, 2) if isinstance(v, float) else v for k, v in time_split_of(self.executor).items()}
