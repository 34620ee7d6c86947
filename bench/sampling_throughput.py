"""Sampling throughput, side by side in one run. Two cases:

``--case shared-prefix`` (default), the realistic one: the real generator prompts of `sampled_workflows`
(`generator_prompt` for the `tiny` profile's HumanEval training queries, ~450-700 tokens each), m samples
each (the profile's m = 8), the profile's generator budget (max_new_tokens, T, top_p, stop strings, batch
size). The same prompts go through

  - shared-prefix: `TransformersSampler(prefix_sharing=True)`, one prefill per prompt (and one for the
    few-shot header all prompts share), its KV cache expanded for the prompt's m samples;
  - per-sample:    `TransformersSampler(prefix_sharing=False)`, `model.generate` on batches that prefill
    every sample's prompt again.

The two paths draw from different random streams, so the samples (and their lengths) differ; tokens/s
(generated tokens over wall time, tokenization and post-processing included) is the comparison. Prints
tokens/s of both and one line ``RATIO shared-prefix/per-sample = X.XX`` (target >= 2.5).

    python bench/sampling_throughput.py [--queries 2] [--m 8] [--threads N]

``--case overhead``: our per-sample path against a raw `model.generate` on the same left-padded batches and
seeds (short synthetic prompts); both draw the same tokens (checked), so tokens/s compare directly.
Prints ``RATIO ours/raw`` (target >= 0.9).

    python bench/sampling_throughput.py --case overhead [--prompts 16] [--batch-size 8] [--max-tokens 48] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

# With busy-waiting OpenMP threads, torch on a shared 2-core machine slows down ~8x as soon as anything
# else runs; passive waiting avoids it. Must be set before torch loads its OpenMP runtime.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from spogw_dagster.core.inference.sampling import SamplingParams, TransformersSampler  # noqa: E402
from spogw_dagster.seeds import sampler_seed  # noqa: E402

TASKS = [
    "add two numbers", "reverse a string", "check if a number is prime", "sum a list of integers",
    "count vowels in a word", "find the maximum of a list", "compute a factorial", "merge two sorted lists",
    "remove duplicates from a list", "compute the nth Fibonacci number", "check for a palindrome",
    "flatten a nested list", "convert Celsius to Fahrenheit", "find the gcd of two numbers",
    "count words in a sentence", "sort a dictionary by value",
]


def make_prompts(n: int) -> list[str]:
    return [
        f"# Task: {TASKS[i % len(TASKS)]}.\n# A Python workflow that solves it with LLM calls.\n"
        f"class Workflow:\n    def __call__(self, problem):\n"
        for i in range(n)
    ]


def raw_generate(model, tok, prompts, p: SamplingParams, batch_size: int, seed: int) -> tuple[int, list[list[int]]]:
    """The baseline: plain generate on the same left-padded batches and seeds as the sampler uses."""
    enc = [list(tok(x)["input_ids"]) for x in prompts]
    order = sorted(range(len(prompts)), key=lambda i: -len(enc[i]))
    eos = model.generation_config.eos_token_id
    tokens, seqs = 0, []
    for b, s in enumerate(range(0, len(order), batch_size)):
        rows = [enc[i] for i in order[s : s + batch_size]]
        P = max(len(r) for r in rows)
        ids = torch.full((len(rows), P), tok.pad_token_id, dtype=torch.long)
        att = torch.zeros_like(ids)
        for i, r in enumerate(rows):
            ids[i, P - len(r) :] = torch.tensor(r)
            att[i, P - len(r) :] = 1
        kw = dict(do_sample=True, temperature=p.temperature, top_k=0, top_p=1.0) if p.temperature > 0 else dict(do_sample=False)
        torch.manual_seed(sampler_seed(seed, b))
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=att, max_new_tokens=p.max_tokens,
                                 pad_token_id=tok.pad_token_id, eos_token_id=eos, **kw)
        for row in out[:, P:].tolist():
            k = next((j + 1 for j, t in enumerate(row) if t == eos), len(row))
            seqs.append(row[:k])
            tokens += k
    return tokens, seqs


def overhead_case(args) -> None:
    t0 = time.perf_counter()
    sampler = TransformersSampler("smollm2", batch_size=args.batch_size, seed=args.seed, prefix_sharing=False)
    print(f"model load: {time.perf_counter() - t0:.2f}s (includes the one-off GGUF conversion if not cached)")
    prompts = make_prompts(args.prompts)
    p = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed)

    # warm-up (first-call allocations), not timed
    sampler.generate(prompts[:2], SamplingParams(temperature=args.temperature, max_tokens=4))

    ours_tps, raw_tps, matches = [], [], []
    for r in range(args.rounds):
        t = time.perf_counter()
        res = sampler.generate(prompts, p)
        dt = time.perf_counter() - t
        ours_tokens = sum(len(row[0].token_ids) for row in res)
        ours_tps.append(ours_tokens / dt)

        t = time.perf_counter()
        raw_tokens, raw_seqs = raw_generate(sampler.model, sampler.tokenizer, prompts, p, args.batch_size, args.seed)
        dt_raw = time.perf_counter() - t
        raw_tps.append(raw_tokens / dt_raw)

        enc = [sampler.encode(x) for x in prompts]
        order = sorted(range(len(prompts)), key=lambda i: -len(enc[i]))
        same = sum(res[i][0].token_ids == raw_seqs[k] for k, i in enumerate(order))
        matches.append(same / len(prompts))
        print(f"round {r}: ours {ours_tokens} tok in {dt:.2f}s = {ours_tps[-1]:.1f} tok/s | "
              f"raw {raw_tokens} tok in {dt_raw:.2f}s = {raw_tps[-1]:.1f} tok/s | identical samples {same}/{len(prompts)}")

    best = max(ours_tps) / max(raw_tps)
    med = statistics.median(ours_tps) / statistics.median(raw_tps)
    print(f"\nbatch {args.batch_size}, {args.prompts} prompts, max_tokens {args.max_tokens}, T={args.temperature}, "
          f"torch threads {torch.get_num_threads()}")
    print(f"ours {max(ours_tps):.1f} tok/s, raw generate {max(raw_tps):.1f} tok/s")
    print(f"RATIO ours/raw (best rounds) = {best:.3f}   (median rounds = {med:.3f}; target >= 0.9)")
    print(f"identical samples: {min(matches) * 100:.0f}%")


def generator_prompts(profile: str, queries: int | None):
    """The prompts and sampling params `sampled_workflows` uses for `profile` (see pipeline/defs/assets/sampled_workflows.py)."""
    from spogw_dagster.pipeline.settings import load_config
    from spogw_dagster.pipeline.defs.resources import _queries
    from spogw_dagster.workflow.template import GENERATOR_STOP, generator_prompt

    cfg = load_config(profile, None, {})
    b, g = cfg.benchmark, cfg.generator
    train = list(_queries(b.name, b.data_path, b.split_seed, b.train_queries, b.heldout_queries)[0])
    if queries is not None:
        if queries < 1:
            raise SystemExit(f"--queries must be >= 1, got {queries}")
        train = train[:queries]
    prompts = [generator_prompt(p.family, p.question) for p in train]
    params = SamplingParams(temperature=g.temperature, top_p=g.top_p if g.temperature > 0 else 1.0,
                            max_tokens=g.max_new_tokens, seed=g.seed, stop=tuple(GENERATOR_STOP))
    return cfg, prompts, params


def shared_prefix_case(args) -> None:
    cfg, prompts, p = generator_prompts(args.profile, args.queries)
    m = args.m if args.m is not None else cfg.curation.m
    t0 = time.perf_counter()
    shared = TransformersSampler("smollm2", batch_size=cfg.generator.batch_size, seed=args.seed)
    per_sample = TransformersSampler(model=shared.model, tokenizer=shared.tokenizer,
                                     batch_size=cfg.generator.batch_size, seed=args.seed, prefix_sharing=False)
    print(f"model load: {time.perf_counter() - t0:.2f}s")
    lens = [len(shared.encode(x)) for x in prompts]
    print(f"profile {args.profile}: {len(prompts)} {cfg.benchmark.name} training queries, prompt tokens "
          f"{min(lens)}-{max(lens)} (mean {statistics.mean(lens):.0f}), m = {m}, max_new_tokens {p.max_tokens}, "
          f"T = {p.temperature}, top_p {p.top_p}, batch {cfg.generator.batch_size}, "
          f"torch threads {torch.get_num_threads()}")

    warm = SamplingParams(temperature=p.temperature, max_tokens=2, stop=p.stop)  # first-call allocations
    shared.generate(prompts[:1], warm, n=2)
    per_sample.generate(prompts[:1], warm, n=2)

    tps = {}
    for name, sampler in (("shared-prefix", shared), ("per-sample", per_sample)):
        t = time.perf_counter()
        res = sampler.generate(prompts, p, n=m)
        dt = time.perf_counter() - t
        flat = [r for row in res for r in row]
        ntok = sum(len(r.token_ids) for r in flat)
        tps[name] = ntok / dt
        stops = sum(r.finish_reason == "stop" for r in flat)
        print(f"{name:>13}: {len(flat)} samples, {ntok} tokens in {dt:.1f}s = {tps[name]:.1f} tok/s "
              f"({dt / len(prompts):.1f}s per query; {stops}/{len(flat)} ended by a stop string or EOS)")
    print(f"RATIO shared-prefix/per-sample = {tps['shared-prefix'] / tps['per-sample']:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", choices=("shared-prefix", "overhead"), default="shared-prefix")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--seed", type=int, default=0)
    g = ap.add_argument_group("shared-prefix case")
    g.add_argument("--profile", default="tiny", help="whose queries, m and generator budget (default tiny)")
    g.add_argument("--queries", type=int, default=None, help="first N training queries only (default: all)")
    g.add_argument("--m", type=int, default=None, help="samples per query (default: the profile's m)")
    o = ap.add_argument_group("overhead case")
    o.add_argument("--prompts", type=int, default=16)
    o.add_argument("--batch-size", type=int, default=8)
    o.add_argument("--max-tokens", type=int, default=48)
    o.add_argument("--temperature", type=float, default=0.8)
    o.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.case == "overhead":
        overhead_case(args)
    else:
        shared_prefix_case(args)


if __name__ == "__main__":
    main()
