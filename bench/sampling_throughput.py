"""Throughput of our sampling backend over a raw `model.generate`, side by side in one run.

Same model (the bundled SmolLM2 on the CPU), same prompts, same batches, same seeds:

  - ours: `TransformersSampler.generate` (tokenization, left padding, our log-prob recorder and stop
    criterion, per-row post-processing: text, token ids, log-probs, finish reason);
  - raw:  `model.generate(input_ids, attention_mask, do_sample=..., temperature=...)` on the same
    left-padded batches, with the same per-batch seeds.

Because our recorder hands `generate` exactly the tempered logits it would compute itself, both sides
draw the same tokens (the script checks it), so they do the same work and tokens/s compare directly.
Variants alternate over several rounds; the best round of each is reported (the least disturbed by
other load on the machine), with the median beside it.

    python bench/sampling_throughput.py [--prompts 16] [--batch-size 8] [--max-tokens 48] [--rounds 2] [--threads N]
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

from spogw_dagster.core.sampling import SamplingParams, TransformersSampler, _derive_seed  # noqa: E402

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
        torch.manual_seed(_derive_seed(seed, b))
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=att, max_new_tokens=p.max_tokens,
                                 pad_token_id=tok.pad_token_id, eos_token_id=eos, **kw)
        for row in out[:, P:].tolist():
            k = next((j + 1 for j, t in enumerate(row) if t == eos), len(row))
            seqs.append(row[:k])
            tokens += k
    return tokens, seqs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    t0 = time.perf_counter()
    sampler = TransformersSampler("smollm2", batch_size=args.batch_size, seed=args.seed)
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


if __name__ == "__main__":
    main()
