"""Embedded executor throughput: the executor calls of a real run, served one at a time and in parallel, in one run.

Replays the requests (messages, temperature, top_p, max_tokens, seed, stop) stored in a call cache that a real
`spogw run` left behind (default: `assets/call_cache.sqlite` of `spogw run --profile tiny`), against llama.cpp
servers of our portable runtime, in these layouts, alternating over rounds, on the same requests:

  sequential   1 server, all cores' threads, one call at a time (the old embedded executor: one llama.cpp
               context behind a lock)
  solo         1 server, 1 thread, one call at a time: the same numerics as `workers`, so the same answers and
               the same work (the clean side-by-side ratio)
  workers      what the pipeline runs: one single-thread, single-slot server per core behind the embedded
               executor's router; as many calls in flight as workers (each call computed alone: reproducible)
  batched      1 server, S slots with continuous batching, all cores' threads; S calls in flight (faster only
               where the model's kernels batch well; co-scheduled calls change each other's float rounding)

Prints wall seconds, prompt and generated tokens/s (tokens counted by the server) per layout and

    RATIO parallel/sequential = X        (workers over sequential: what the pipeline uses)
    RATIO parallel/solo = Z              (workers over solo: identical answers, so identical work)
    RATIO batched/sequential = Y

    python bench/executor_throughput.py [--cache assets/call_cache.sqlite] [--limit 24] [--slots 4]
                                        [--rounds 1] [--model smollm2 --model /path/to/other.gguf]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from spogw_dagster.contracts import SamplingParams  # noqa: E402
from spogw_dagster.executors.cache import stored_calls  # noqa: E402
from spogw_dagster.executors.embedded import EmbeddedExecutor, LlamaServer  # noqa: E402
from spogw_dagster.paths import smollm2_gguf  # noqa: E402


def load_requests(cache: Path, limit: int) -> list[tuple[list[dict], SamplingParams]]:
    if not cache.is_file():
        sys.exit(f"{cache}: no call cache; fix: run `spogw run --profile tiny` (or --profile ci) first, or pass "
                 "--cache <assets>/call_cache.sqlite of a run you have")
    out = [(c.messages, c.params) for c in stored_calls(cache)]
    if not out:
        sys.exit(f"{cache}: holds no requests")
    return out[:limit]


async def serve_all(chat, requests, concurrency: int) -> tuple[float, int, int]:
    sem = asyncio.Semaphore(concurrency)
    tokens = [0, 0]

    async def one(msgs, params):
        async with sem:
            r = await chat(msgs, params)
            tokens[0] += r.prompt_tokens
            tokens[1] += r.completion_tokens

    t0 = time.perf_counter()
    await asyncio.gather(*(one(m, p) for m, p in requests))
    return time.perf_counter() - t0, tokens[0], tokens[1]


def measure(layout: str, gguf: Path, requests, slots: int, cores: int) -> tuple[float, int, int]:
    if layout == "workers":
        servers = [LlamaServer(gguf, threads=1) for _ in range(cores)]
        n = cores
    elif layout == "solo":
        servers, n = [LlamaServer(gguf, threads=1)], 1
    elif layout == "batched":
        servers, n = [LlamaServer(gguf, slots=slots, threads=cores)], slots
    else:
        servers, n = [LlamaServer(gguf, threads=cores)], 1
    try:
        ex = EmbeddedExecutor(gguf, servers=servers)  # fresh processes: every layout starts with empty caches

        async def run():
            try:
                return await serve_all(ex.chat, requests, n)
            finally:
                await ex.aclose()

        return asyncio.run(run())
    finally:
        for s in servers:
            s.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, default=REPO / "assets" / "call_cache.sqlite")
    ap.add_argument("--limit", type=int, default=24)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--model", action="append", help="smollm2 (default) or a GGUF path; repeatable")
    ap.add_argument("--layouts", default="sequential,workers,batched")
    a = ap.parse_args()
    requests = load_requests(a.cache, a.limit)
    cores = os.cpu_count() or 1
    layouts = a.layouts.split(",")
    models = [smollm2_gguf() if m in (None, "smollm2") else Path(m) for m in (a.model or ["smollm2"])]
    print(f"{len(requests)} requests from {a.cache}; {cores} cores; {a.slots} slots; {a.rounds} round(s)")
    for gguf in models:
        wall: dict[str, list[float]] = {k: [] for k in layouts}
        toks: dict[str, tuple[int, int]] = {}
        for _ in range(a.rounds):
            for layout in layouts:
                s, pt, ct = measure(layout, gguf, requests, a.slots, cores)
                wall[layout].append(s)
                toks[layout] = (pt, ct)
        print(f"\n{gguf.name}")
        print(f"{'layout':<12} {'wall s':>8} {'prompt tok/s':>13} {'gen tok/s':>10} {'prompt tok':>11} {'gen tok':>8}")
        med = {k: statistics.median(v) for k, v in wall.items()}
        for layout in layouts:
            pt, ct = toks[layout]
            print(f"{layout:<12} {med[layout]:>8.1f} {pt / med[layout]:>13.1f} {ct / med[layout]:>10.1f} "
                  f"{pt:>11} {ct:>8}")
        if "sequential" in med:
            if "workers" in med:
                print(f"RATIO parallel/sequential = {med['sequential'] / med['workers']:.2f}  ({gguf.name})")
        if "solo" in med and "workers" in med:
            print(f"RATIO parallel/solo = {med['solo'] / med['workers']:.2f}  ({gguf.name})")
        if "sequential" in med:
            if "batched" in med:
                print(f"RATIO batched/sequential = {med['sequential'] / med['batched']:.2f}  ({gguf.name})")


if __name__ == "__main__":
    main()
