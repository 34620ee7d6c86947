"""Overhead of our executor client over raw httpx, measured side by side in one run.

Starts the fake OpenAI-compatible server (tests/fake_openai_server.py) in a subprocess, answering
instantly, then times the same N chat calls

  - sequentially, and at concurrency C (asyncio.gather),
  - through: direct httpx POSTs (the baseline), OpenAICompatExecutor, and the full per-run stack
    MeteredExecutor(CachingExecutor(OpenAICompatExecutor)) on cache misses and on cache hits,

alternating the variants over several rounds and reporting the median. Prints per-call time, the
overhead per call over direct httpx and the ratio ours / direct.

    python bench/executor_overhead.py [--n 300] [--concurrency 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from spogw_dagster.executors import CachingExecutor, CallCache, MeteredExecutor  # noqa: E402
from spogw_dagster.executors.openai_compat import OpenAICompatExecutor  # noqa: E402
from spogw_dagster.contracts import SamplingParams  # noqa: E402

MODEL = "fake-model"
PARAMS = SamplingParams(temperature=0.0, max_tokens=64, seed=0)


def messages(i: int) -> list[dict]:
    return [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": f"Question {i}: what is {i} plus {i}?"}]


def start_server() -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "fake_openai_server.py"), "--model", MODEL],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip() if proc.stdout else ""
    if not line.startswith("PORT "):
        proc.kill()
        raise RuntimeError(f"fake server did not start (got {line!r})")
    return proc, f"http://127.0.0.1:{int(line.split()[1])}/v1"


async def run_calls(chat, n: int, concurrency: int, offset: int) -> float:
    """Seconds for n calls of `chat(i)`, at most `concurrency` at a time (1 = sequential)."""
    t0 = time.perf_counter()
    if concurrency <= 1:
        for i in range(n):
            await chat(offset + i)
    else:
        sem = asyncio.Semaphore(concurrency)

        async def one(i: int) -> None:
            async with sem:
                await chat(offset + i)

        await asyncio.gather(*(one(offset + i) for i in range(n)))
    return time.perf_counter() - t0


async def bench(base_url: str, n: int, concurrency: int, rounds: int) -> None:
    tmp = tempfile.TemporaryDirectory()
    direct_client = httpx.AsyncClient(timeout=httpx.Timeout(120.0, connect=10.0),
                                      limits=httpx.Limits(max_connections=max(concurrency, 1),
                                                          max_keepalive_connections=max(concurrency, 1)))

    async def direct(i: int) -> str:
        body = {"model": MODEL, "messages": messages(i), "temperature": PARAMS.temperature,
                "top_p": PARAMS.top_p, "max_tokens": PARAMS.max_tokens, "seed": PARAMS.seed}
        r = await direct_client.post(f"{base_url}/chat/completions", json=body)
        r.raise_for_status()
        return r.json()["choices"][0]["message"]["content"]

    ours_exec = OpenAICompatExecutor(base_url, MODEL, api_key_env=None, max_concurrency=max(concurrency, 1))

    async def ours(i: int) -> str:
        return (await ours_exec.chat(messages(i), PARAMS)).text

    cache = CallCache(Path(tmp.name) / "bench_cache.sqlite")
    stack = CachingExecutor(OpenAICompatExecutor(base_url, MODEL, api_key_env=None,
                                                 max_concurrency=max(concurrency, 1)), cache)
    miss_counter = [10**9]  # fresh prompts every round: always misses

    async def stack_miss(i: int) -> str:
        return (await MeteredExecutor(stack).chat(messages(miss_counter[0] + i), PARAMS)).text

    async def stack_hit(i: int) -> str:  # prompts 0..n-1 are stored by the warm-up below
        return (await MeteredExecutor(stack).chat(messages(i % n), PARAMS)).text

    variants = {"direct httpx": direct, "OpenAICompatExecutor": ours,
                "metered+cache (miss)": stack_miss, "metered+cache (hit)": stack_hit}

    # Warm-up: connections, imports, and the cache entries the hit variant reads.
    for name, fn in variants.items():
        await run_calls(fn, min(n, 50), 1, 0)
    for i in range(n):
        await stack.chat(messages(i), PARAMS)

    results: dict[tuple[str, int], list[float]] = {}
    for r in range(rounds):
        for conc in (1, concurrency):
            for name, fn in variants.items():
                miss_counter[0] += 10 * n
                secs = await run_calls(fn, n, conc, 0)
                results.setdefault((name, conc), []).append(secs)

    await direct_client.aclose()
    await ours_exec.aclose()
    await stack.aclose()
    cache.close()
    tmp.cleanup()

    print(f"\nexecutor overhead: n={n} calls per measurement, median of {rounds} rounds, "
          f"instant fake server at {base_url}")
    for conc in (1, concurrency):
        label = "sequential" if conc == 1 else f"concurrency {conc}"
        base = statistics.median(results[("direct httpx", conc)]) / n
        print(f"\n  {label}:")
        print(f"    {'variant':<24}{'per call':>12}{'overhead/call':>16}{'ratio vs direct':>18}")
        for name in variants:
            per = statistics.median(results[(name, conc)]) / n
            print(f"    {name:<24}{per * 1e6:>10.0f}us{(per - base) * 1e6:>14.0f}us{per / base:>17.2f}x")


def sandbox_start_cost(n: int = 20) -> None:
    """Per-run start cost of the sandbox, side by side with a plain Python subprocess in the same run.

    The same trivial program, interleaved so machine noise hits all alike: a plain `python -I -S -c pass`
    subprocess (the floor); under bwrap, the bare bwrap command line without and with the seccomp filter
    (the filter's cost: a memfd per start plus loading the BPF program); `run_code` in the sandbox; and a full
    one-operator workflow run through the sandboxed runner with an instant in-process executor.
    """
    import statistics
    import subprocess
    import sys
    import time

    from spogw_dagster.sandboxing import SandboxUnavailableError, detect_isolation, run_code
    from spogw_dagster.contracts import ChatResult, Problem
    from spogw_dagster.workflow.runtime import execute_workflow

    try:
        iso = detect_isolation()
    except SandboxUnavailableError as e:
        print(f"\nsandbox start cost: no sandbox here ({e})")
        return

    class Instant:
        model = "instant"

        async def chat(self, messages, params):
            return ChatResult(text="\\boxed{1}")

        async def aclose(self):
            pass

    problem = Problem("gsm8k", "bench", "1+0?", answer="1", family="math")
    code = "class Workflow:\n    async def run(self):\n        return await self.custom(instruction='x')\n"
    plain, sandboxed, workflow, bare_bwrap, filtered_bwrap = [], [], [], [], []

    async def one_round() -> None:
        t = time.perf_counter()
        subprocess.run([sys.executable, "-I", "-S", "-c", "pass"], check=True)
        plain.append(time.perf_counter() - t)
        if iso.name == "bwrap":
            for with_filter, times in ((False, bare_bwrap), (True, filtered_bwrap)):
                t = time.perf_counter()
                bwrap_pass(iso, with_filter)
                times.append(time.perf_counter() - t)
        t = time.perf_counter()
        r = await run_code("pass", iso)
        assert r.status.value == "ok", r.error
        sandboxed.append(time.perf_counter() - t)
        t = time.perf_counter()
        w = await execute_workflow(code, problem, Instant(), iso)
        assert w.status.value == "ok", w.error
        workflow.append(time.perf_counter() - t)

    async def run_all() -> None:
        for _ in range(n):
            await one_round()

    asyncio.run(run_all())
    base = statistics.median(plain)
    print(f"\nsandbox start cost ({iso.name}, median of {n}):")
    print(f"    plain python subprocess     {base * 1e3:7.1f} ms   1.00x")
    rows = (("bwrap, no seccomp filter", bare_bwrap), ("bwrap + seccomp filter", filtered_bwrap),
            ("run_code (sandboxed)", sandboxed), ("workflow run, 1 operator", workflow))
    for name, xs in rows:
        if not xs:
            continue
        m = statistics.median(xs)
        print(f"    {name:<27} {m * 1e3:7.1f} ms   {m / base:.2f}x")


def bwrap_pass(iso, with_filter: bool) -> None:
    """`python -I -S -c pass` under the bare bwrap command line, with or without the --seccomp argument."""
    import os
    import subprocess

    from spogw_dagster.sandboxing import Limits, RunIdentity, seccomp

    fd = seccomp.program_fd()
    try:
        cmd = iso.command([sys.executable, "-I", "-S", "-c", "pass"], Limits(), [], RunIdentity(seccomp_fd=fd))
        if not with_filter:
            at = cmd.index("--seccomp")
            del cmd[at:at + 2]
        subprocess.run(cmd, check=True, pass_fds=(fd,) if with_filter else (), env={"PATH": "/usr/bin:/bin"})
    finally:
        os.close(fd)


def scoring_cost(n: int) -> None:
    """Per-answer cost of HumanEval scoring, the two-process verdict beside the old one-process path, in the
    same run (bench/scoring_overhead.py, which can also be run on its own)."""
    import runpy
    import sys
    from pathlib import Path

    print()
    saved = sys.argv
    sys.argv = ["scoring_overhead.py", "--n", str(n)]
    try:
        runpy.run_path(str(Path(__file__).with_name("scoring_overhead.py")), run_name="__main__")
    finally:
        sys.argv = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=300, help="calls per measurement")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sandbox-only", action="store_true", help="only the sandbox start cost")
    ap.add_argument("--sandbox-n", type=int, default=20, help="rounds of the sandbox start cost (median)")
    args = ap.parse_args()
    if args.sandbox_only:
        sandbox_start_cost(args.sandbox_n)
        scoring_cost(args.sandbox_n)
        return
    proc, base_url = start_server()
    try:
        asyncio.run(bench(base_url, args.n, args.concurrency, args.rounds))
    finally:
        if proc.stdin:
            proc.stdin.close()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
    sandbox_start_cost(args.sandbox_n)
    scoring_cost(args.sandbox_n)


if __name__ == "__main__":
    main()
