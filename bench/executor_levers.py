"""The embedded executor's speed levers, measured side by side on the calls of a real run.

Replays requests stored in an `answers` run's call cache (`<assets>/call_cache.sqlite`: what the operators
really sent, seeds included) against two single-thread, single-slot llama.cpp workers (the pipeline's layout),
in these modes, alternating over rounds, on the same requests:

  base      the reproducible mode as it was: the portable build, no stop string
  stop      + `executor.stop_after_code`: a code reply ends where its fenced block closes
  avx512    + the runtime variant for this CPU's AVX-512 units (skipped where not built or not supported)
  ngram     + prompt-lookup (n-gram) speculation: the whole `executor.reproducible: false` mode

For each mode: wall seconds, generated tokens, and how many replies equal the base mode's, compared on what
the mode asks for (a stop mode's text against the base text cut at the same stop), and how many of the answers
the scorer would take (`solution_code`) equal the base mode's. Prints

    RATIO executor stop/base = X          (wall of base over wall of stop)
    RATIO executor avx512/stop = Y
    RATIO executor ngram/avx512 = Z       (or ngram/stop where no AVX-512 variant runs)
    RATIO executor fast/base = W          (`executor.reproducible: false`, ngram, against the base)

    python bench/executor_levers.py --cache <assets>/call_cache.sqlite [--limit 32] [--rounds 1]
        [--model qwen2.5-coder-0.5b] [--modes base,stop,avx512,ngram]

`--offline` serves nothing: over every code call in the cache it prints the share of completion tokens after
the code block's closing fence (estimated by characters) and how many answers the cut would change.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from spogw_dagster.benchmarks.code_tests import solution_code  # noqa: E402
from spogw_dagster.benchmarks.registry import load_benchmark  # noqa: E402
from spogw_dagster.bundled_models import resolve_gguf  # noqa: E402
from spogw_dagster.contracts import SamplingParams  # noqa: E402
from spogw_dagster.executors.cache import stored_calls  # noqa: E402
from spogw_dagster.executors.embedded import FAST_SERVER_ARGS, EmbeddedExecutor, LlamaServer  # noqa: E402
from spogw_dagster.executors.llama_runtime import AVX512, PORTABLE, _built, host_variants  # noqa: E402
from spogw_dagster.workflow.operators import ANSWER_HINT, CODE_STOP  # noqa: E402


def load_requests(cache: Path, limit: int) -> list[tuple[list[dict], SamplingParams]]:
    """`limit` requests spread evenly over the cache (in the order they were made), stop strings dropped: the
    modes add their own."""
    if not cache.is_file():
        sys.exit(f"{cache}: no call cache; fix: run `spogw run --profile answers` first and pass its "
                 "<assets>/call_cache.sqlite")
    reqs = [(c.messages, replace(c.params, stop=())) for c in stored_calls(cache)]
    if not reqs:
        sys.exit(f"{cache}: holds no requests")
    step = max(1, len(reqs) // limit)
    return reqs[::step][:limit]


def asks_for_code(messages: list[dict]) -> bool:
    return messages[-1]["content"].endswith(ANSWER_HINT["code"])


def cut_at_stop(text: str) -> str:
    """What llama.cpp returns under CODE_STOP: the text before the first stop string."""
    cuts = [text.find(s) for s in CODE_STOP if s in text]
    return text[: min(cuts)] if cuts else text


def mode_setup(mode: str) -> tuple[bool, object, tuple[str, ...]] | None:
    """(stop, runtime, server args) of a mode, or None where it cannot run on this machine."""
    best = host_variants()[0]
    if mode == "base":
        return False, _built(PORTABLE), ()
    if mode == "stop":
        return True, _built(PORTABLE), ()
    if mode == "avx512":
        rt = _built(AVX512) if best is AVX512 else None
        return (True, rt, ()) if rt else None
    if mode.startswith("ngram"):  # "ngram" (the fast mode's flags) or "ngram:N/M" (lookup N tokens, draft M)
        rt = _built(AVX512) if best is AVX512 else None
        args = FAST_SERVER_ARGS
        if ":" in mode:
            n, m = mode.split(":", 1)[1].split("/")
            args = ("--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", n, "--spec-ngram-simple-size-m", m)
        return True, rt or _built(PORTABLE), args
    raise SystemExit(f"unknown mode {mode}")


def run_mode(gguf: Path, requests, stop: bool, runtime, args: tuple[str, ...], workers: int):
    servers = [LlamaServer(gguf, threads=1, runtime=runtime, extra_args=args) for _ in range(workers)]
    try:
        ex = EmbeddedExecutor(gguf, servers=servers)

        async def go():
            sem = asyncio.Semaphore(workers)
            out: list = [None] * len(requests)

            async def one(i, msgs, params):
                if stop and asks_for_code(msgs):
                    params = replace(params, stop=CODE_STOP)
                async with sem:
                    out[i] = await ex.chat(msgs, params)

            t0 = time.perf_counter()
            try:
                await asyncio.gather(*(one(i, m, p) for i, (m, p) in enumerate(requests)))
            finally:
                await ex.aclose()
            return time.perf_counter() - t0, out

        return asyncio.run(go())
    finally:
        for s in servers:
            s.stop()


COPY_RUN = 24


def copied_chars(reply: str, prompt: str) -> int:
    """Characters of `reply` inside a run of at least COPY_RUN characters that also occurs in `prompt`."""
    grams = {prompt[i : i + COPY_RUN] for i in range(len(prompt) - COPY_RUN + 1)}
    covered = [False] * len(reply)
    for i in range(len(reply) - COPY_RUN + 1):
        if reply[i : i + COPY_RUN] in grams:
            covered[i : i + COPY_RUN] = [True] * COPY_RUN
    return sum(covered)


def offline(cache: Path) -> None:
    calls = stored_calls(cache)
    problems = load_benchmark("humaneval")
    n = changed = cut_calls = 0
    tokens = after = copied = chars = 0.0
    examples = []
    for msgs, _params, text, ct in calls:
        if not asks_for_code(msgs):
            continue
        n += 1
        tokens += ct
        copied += copied_chars(text, msgs[-1]["content"])
        chars += len(text)
        cut = cut_at_stop(text)
        if cut != text:
            cut_calls += 1
            after += ct * (len(text) - len(cut)) / max(1, len(text))
        p = next((p for p in problems if p.question.strip() and p.question.strip() in msgs[-1]["content"]), None)
        if p is not None and solution_code(p, cut) != solution_code(p, text):
            changed += 1
            examples.append(text)
    print(f"{n} code calls in {cache}: {cut_calls} would stop early; completion tokens {tokens:.0f}, after the "
          f"closing fence about {after:.0f} ({after / max(1, tokens):.1%}); answers changed by the cut: {changed}")
    print(f"of the replies' characters, {copied / max(1, chars):.1%} lie in runs of {COPY_RUN}+ characters copied "
          "from the prompt: what prompt-lookup speculation can draft")
    for t in examples[:3]:
        print("---- a changed answer's reply:\n" + t[:1500])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--offline", action="store_true")
    ap.add_argument("--cache", type=Path, required=True)
    ap.add_argument("--limit", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--modes", default="base,stop,avx512,ngram")
    ap.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    a = ap.parse_args()
    if a.offline:
        return offline(a.cache)
    gguf = resolve_gguf(a.model)
    requests = load_requests(a.cache, a.limit)
    problems = load_benchmark("humaneval")
    where = [next((p for p in problems if p.question.strip() and p.question.strip() in m[-1]["content"]), None)
             for m, _ in requests]
    modes = []
    for m in a.modes.split(","):
        setup = mode_setup(m)
        if setup is None:
            print(f"{m}: skipped (no AVX-512 variant built for this CPU: `spogw runtime install --variant host`)")
        else:
            modes.append((m, setup))
    code = sum(asks_for_code(m) for m, _ in requests)
    print(f"{len(requests)} requests from {a.cache} ({code} ask for code); {a.workers} single-thread workers; "
          f"{a.rounds} round(s); host variants {[v.name for v in host_variants()]}")
    walls: dict[str, list[float]] = {m: [] for m, _ in modes}
    replies: dict[str, list] = {}
    for _ in range(a.rounds):
        for m, (stop, rt, args) in modes:
            s, out = run_mode(gguf, requests, stop, rt, args, a.workers)
            walls[m].append(s)
            replies[m] = out
            print(f"  {m}: {s:.1f} s ({rt.variant}, {' '.join(args) or 'no server flags'})", flush=True)
    base = replies.get("base")
    print(f"\n{'mode':<8} {'wall s':>8} {'gen tok':>8} {'gen tok/s':>10} {'same text':>10} {'same answer':>12}")
    med = {m: statistics.median(v) for m, v in walls.items()}
    for m, (stop, _, _) in modes:
        out = replies[m]
        gen = sum(r.completion_tokens for r in out)
        same_text = same_answer = "-"
        if base is not None:
            want = [cut_at_stop(b.text) if stop and asks_for_code(q[0]) else b.text for b, q in zip(base, requests)]
            same_text = f"{sum(r.text == w for r, w in zip(out, want))}/{len(out)}"
            ans = [(solution_code(p, r.text), solution_code(p, b.text)) for r, b, p in zip(out, base, where) if p]
            same_answer = f"{sum(x == y for x, y in ans)}/{len(ans)}"
        print(f"{m:<8} {med[m]:>8.1f} {gen:>8} {gen / med[m]:>10.1f} {same_text:>10} {same_answer:>12}")
    names = [m for m, _ in modes]
    ref = "avx512" if "avx512" in names else "stop"  # the n-gram modes run on the best variant
    pairs = [("base", "stop"), ("stop" if "stop" in names else "base", "avx512")] + \
        [(ref if ref in names else "base", m) for m in names if m.startswith("ngram")]
    for a_, b_ in pairs:
        if a_ in med and b_ in med:
            print(f"RATIO executor {b_}/{a_} = {med[a_] / med[b_]:.2f}")
    if "base" in med and "ngram" in med:  # the fast mode as `executor.reproducible: false` runs it
        print(f"RATIO executor fast/base = {med['base'] / med['ngram']:.2f}")


if __name__ == "__main__":
    main()
