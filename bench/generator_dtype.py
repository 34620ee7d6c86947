"""The generator in bfloat16 against float32 on this CPU, side by side in one run: sampling, the first step's
importance ratio, and training (speed and peak memory).

    python bench/generator_dtype.py [--profile answers] [--queries 2] [--m 4] [--max-tokens 160] [--rounds 2]

On the profile's generator (`answers`: Qwen2.5-Coder-0.5B, the anchored prompt, T = 1.0) and its first
`--queries` training queries:

- sampling: `TransformersSampler` (the pipeline's sampler, its per-device path) in each dtype, m samples per
  prompt, alternating the dtype's turn each round; generated tokens per second. Prints
  ``RATIO sampling bfloat16/float32 = X``.
- agreement: for each dtype, the sampler's recorded log-probs (the `answers` profile trains with
  `old_logprobs: data`, so they are π_old) against the trainer's teacher-forced log-probs of the same tokens in
  the same dtype (`score_completions`, the path the trainer's forward takes): mean and largest |Δ log p|, and the
  share of tokens whose first-step ratio exp(Δ) lies outside the clip range [1 − ε, 1 + ε].
- training: `train_lora` with the profile's training config in each dtype, one epoch over the sampled rows
  (advantages ±1), each in a fresh process (for its own peak RSS), alternating; optimizer-step seconds, the
  π_ref pass, and peak RSS. Prints ``RATIO training bfloat16/float32 = X`` (step throughput) and
  ``RATIO peak-rss bfloat16/float32 = X``.

The CPU's native bfloat16 (AVX512-BF16 or AMX) is printed first: without it, bfloat16 is emulated and slow.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see bench/sampling_throughput.py

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DTYPES = ("float32", "bfloat16")


def cpu_bf16() -> dict[str, bool]:
    from spogw_dagster.core.device_paths import cpu_features

    return cpu_features()


def profile_prompts(profile: str, queries: int):
    from spogw_dagster.pipeline.defs.resources import _queries
    from spogw_dagster.pipeline.settings import load_config
    from spogw_dagster.workflow.template import generator_prompt

    cfg = load_config(profile, None, {})
    b, g = cfg.benchmark, cfg.generator
    train = list(_queries(b.name, b.data_path, b.split_seed, b.train_queries, b.heldout_queries)[0])[:queries]
    return cfg, [generator_prompt(p.family, p.question, g.prompt) for p in train]


def sampling_and_agreement(args) -> list[dict]:
    import torch

    from spogw_dagster.core.inference.sampling import SamplingParams, TransformersSampler
    from spogw_dagster.core.training.logprobs import score_completions
    from spogw_dagster.workflow.template import GENERATOR_STOP

    cfg, prompts = profile_prompts(args.profile, args.queries)
    g = cfg.generator
    samplers = {d: TransformersSampler(g.model, batch_size=g.batch_size, seed=g.seed, dtype=d) for d in DTYPES}
    s0 = samplers["float32"]
    lens = [len(s0.encode(x)) for x in prompts]
    print(f"profile {args.profile}: generator {g.model}, {len(prompts)} training queries (prompt tokens {lens}), "
          f"m = {args.m}, max_new_tokens {args.max_tokens}, T = {g.temperature}, torch threads "
          f"{torch.get_num_threads()}, prefix sharing {s0.prefix_sharing}")
    for s in samplers.values():  # first-call allocations before anything is timed
        s.generate(prompts[:1], SamplingParams(temperature=g.temperature, max_tokens=2), n=2)
    tps: dict[str, list[float]] = {d: [] for d in DTYPES}
    kept: dict[str, list] = {}
    for r in range(args.rounds):
        for d in (DTYPES if r % 2 == 0 else DTYPES[::-1]):
            p = SamplingParams(temperature=g.temperature, top_p=g.top_p, max_tokens=args.max_tokens, seed=r,
                               stop=tuple(GENERATOR_STOP))
            t = time.perf_counter()
            res = samplers[d].generate(prompts, p, n=args.m)
            dt = time.perf_counter() - t
            flat = [(i, x) for i, row in enumerate(res) for x in row]
            ntok = sum(len(x.token_ids) for _, x in flat)
            tps[d].append(ntok / dt)
            kept[d] = flat
            print(f"  round {r} {d:>8}: {ntok} tokens in {dt:.1f}s = {ntok / dt:.1f} tok/s", flush=True)
    for d in DTYPES:
        print(f"sampling {d:>8}: {statistics.median(tps[d]):.1f} tok/s (median of {args.rounds})")
    print(f"RATIO sampling bfloat16/float32 = {statistics.median(tps['bfloat16']) / statistics.median(tps['float32']):.2f}")

    eps = cfg.train_config().clip_eps
    for d in DTYPES:
        s = samplers[d]
        flat = [(i, x) for i, x in kept[d] if x.token_ids]
        ids = [s.encode(prompts[i]) for i, _ in flat]
        with torch.no_grad():
            teacher = score_completions(s.model, ids, [list(x.token_ids) for _, x in flat], s.tokenizer.pad_token_id,
                                        temperature=g.temperature, batch_size=g.batch_size)
        deltas = [a - b for (_, x), t in zip(flat, teacher) for a, b in zip(t, x.logprobs)]
        outside = sum(abs(pow(2.718281828459045, v) - 1) > eps for v in deltas)
        print(f"agreement {d:>8}: {len(deltas)} tokens, mean |Δ log p| {statistics.mean(abs(v) for v in deltas):.4f}, "
              f"largest {max(abs(v) for v in deltas):.4f}, first-step ratio outside [1 - {eps}, 1 + {eps}]: "
              f"{outside} ({outside / len(deltas):.2%})")
    out = []
    for i, x in kept["float32"]:
        if x.token_ids:
            out.append({"prompt": prompts[i], "ids": list(x.token_ids), "logprobs": list(x.logprobs)})
    return out


def train_one(args) -> None:
    """In this fresh process: one epoch of `train_lora` in `args.dtype`; prints a JSON line."""
    from spogw_dagster.core.training import TrainConfig, TrainExample, train_lora
    from spogw_dagster.pipeline.settings import load_config

    cfg = load_config(args.profile, None, {})
    rows = json.loads(Path(args.rows).read_text())
    examples = [TrainExample(r["prompt"], "", advantage=1.0 if k % 2 == 0 else -1.0, score=float(k % 2 == 0),
                             completion_token_ids=r["ids"], old_logprobs=r["logprobs"], group_id=str(k // 4))
                for k, r in enumerate(rows)]
    tcfg = TrainConfig.from_dict({**cfg.train_config().to_dict(), "dtype": args.dtype, "epochs": 1,
                                  "old_logprobs": "recompute", "eval_after": False})
    Path("/proc/self/clear_refs").write_text("5")  # the high-water mark from here on
    with tempfile.TemporaryDirectory() as d:
        s = train_lora(examples, tcfg, Path(d) / "adapter", base_model=cfg.generator.model,
                       reuse_existing=False).stats["summary"]
    hwm = next(int(x.split()[1]) for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmHWM"))
    print("TRAIN " + json.dumps({"dtype": args.dtype, "train_seconds": s["train_seconds"],
                                 "steps": s["optimizer_steps"], "precompute_seconds": s["precompute_seconds"],
                                 "first_loss": s["first_loss"], "peak_rss_gib": hwm / 2**20}))


def training(args, rows: list[dict]) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(rows, f)
    res: dict[str, list[dict]] = {d: [] for d in DTYPES}
    try:
        for r in range(args.rounds):
            for d in (DTYPES if r % 2 == 0 else DTYPES[::-1]):
                out = subprocess.run([sys.executable, __file__, "--case", "train-one", "--dtype", d, "--rows", f.name,
                                      "--profile", args.profile], capture_output=True, text=True)
                if out.returncode:
                    raise SystemExit(f"training in {d} failed:\n{out.stderr[-3000:]}")
                x = json.loads(next(ln for ln in out.stdout.splitlines() if ln.startswith("TRAIN "))[6:])
                res[d].append(x)
                print(f"  round {r} {d:>8}: {x['steps']} steps in {x['train_seconds']:.1f}s, π_ref pass "
                      f"{x['precompute_seconds']:.1f}s, first loss {x['first_loss']:.5f}, peak RSS "
                      f"{x['peak_rss_gib']:.2f} GiB", flush=True)
    finally:
        os.unlink(f.name)
    med = {d: {k: statistics.median(x[k] for x in res[d]) for k in ("train_seconds", "precompute_seconds",
                                                                     "peak_rss_gib")} for d in DTYPES}
    print(f"RATIO training bfloat16/float32 = {med['float32']['train_seconds'] / med['bfloat16']['train_seconds']:.2f}")
    print(f"RATIO precompute bfloat16/float32 = "
          f"{med['float32']['precompute_seconds'] / med['bfloat16']['precompute_seconds']:.2f}")
    print(f"RATIO peak-rss bfloat16/float32 = {med['bfloat16']['peak_rss_gib'] / med['float32']['peak_rss_gib']:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", choices=("all", "train-one"), default="all")
    ap.add_argument("--profile", default="answers")
    ap.add_argument("--queries", type=int, default=2)
    ap.add_argument("--m", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dtype", choices=DTYPES, help=argparse.SUPPRESS)
    ap.add_argument("--rows", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case == "train-one":
        return train_one(args)
    print(f"CPU: {cpu_bf16()}")
    rows = sampling_and_agreement(args)
    training(args, rows)


if __name__ == "__main__":
    main()
