"""Training and sampling paths side by side on one device, no vLLM and no weights needed: the GPU bench that
runs where GPUs are lent (and, small, on the CPU as a dry run).

For each named model shape (random weights in bf16 on CUDA, float32 on the CPU; LoRA r 16 on q/k/v/o):

  training  the trainer's two forwards (`core.training.logprobs.build_batch(..., shared_prompt=)` and
            `completion_logprobs`, exactly what `train_lora` runs per micro-batch): shared-prompt (each distinct
            prompt once, its KV cache indexed out to the rows) and per-row (every row's prompt again). One
            optimizer step = the π_old no-grad pass, then forward + backward + AdamW on every micro-batch.
  sampling  `TransformersSampler` with `prefix_sharing=True` (one prefill per prompt, our decode loop) and
            `False` (`model.generate` per batch), the same prompts, n and token budget.

Each pair runs once to warm up, then `--rounds` times in alternating order (A B, B A, ...); the best time of
each counts. Prints per shape

    TRAIN <shape> shared X s per-row Y s RATIO train shared/per-row = R  tok/s ... MFU ... busy ...
    SAMPLE <shape> prefix X tok/s generate Y tok/s RATIO sample prefix/generate = R
    PLAN <shape> on <device>: spogw plan --generator-tps G --train-tps T   (the path `core.device_paths` picks)

MFU counts the model FLOPs a step needs, not what a path spends: the π_old pass 2·N·T, forward 2·N·T,
backward 2·N·T (input gradients only: the base weights are frozen; LoRA's own weight gradients, under 1% of
N, are left out), with N the matmul parameters (layers and the output head; embeddings are lookups) and T the
tokens a step must compute (each distinct prompt once per micro-batch, every completion token), plus
attention's 4·d·(context) per token and layer in each pass. Peak: bf16 dense of the GPU by name (H100/H200
989 TFLOP/s, A100 312); none on the CPU. `--profile` adds the share of a training step's wall time the GPU is
busy (union of kernel intervals from torch.profiler).

    python bench/gpu_paths.py [--shapes qwen2.5-0.5b,qwen2.5-7b] [--prompts 8] [--rows 16]
                              [--prompt-tokens 600] [--completion-tokens 256] [--micro-batch 16] [--rounds 2]
    python bench/gpu_paths.py --device cpu --shapes tiny --prompts 2 --rows 2 --prompt-tokens 32 \\
                              --completion-tokens 8 --micro-batch 4 --rounds 1        # CPU dry run
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see bench/sampling_throughput.py

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# Shapes of the public configs (config.json of each model); "tiny" is the CPU dry run's.
SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=1000, tie_word_embeddings=True),
}
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12}  # dense tensor-core FLOP/s
PAD, EOS = 0, 1


class IdTokenizer:
    """Prompts written as space-separated token ids: the sampler's code paths without a vocabulary (random
    weights have none). EOS is token 1; with a real-size vocabulary a random model almost never draws it."""

    pad_token_id, eos_token_id, eos_token, pad_token = PAD, EOS, "1", "0"

    def __call__(self, text: str) -> dict[str, list[int]]:
        return {"input_ids": [int(x) for x in text.split()]}

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return " ".join(str(int(i)) for i in ids)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="qwen2.5-0.5b,qwen2.5-7b")
    ap.add_argument("--device", default="auto", help="cuda, cpu or auto")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--rows", type=int, default=16, help="completions per prompt")
    ap.add_argument("--prompt-tokens", type=int, default=600)
    ap.add_argument("--completion-tokens", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--sample-batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--lora-r", type=int, default=16)
    ap.add_argument("--skip", default="", help="comma-separated phases to skip: train, sample")
    ap.add_argument("--profile", action="store_true", help="GPU busy share of a training step (CUDA)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    unknown = [s for s in a.shapes.split(",") if s not in SHAPES]
    if unknown:
        ap.error(f"unknown shape(s) {unknown}; choose from {', '.join(SHAPES)}")
    for name in ("prompts", "rows", "prompt_tokens", "completion_tokens", "micro_batch", "sample_batch", "rounds"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    return a


# ---------------------------------------------------------------------------------------------- pure parts


@dataclass(frozen=True)
class Workload:
    """Token ids of the benchmark: `prompts` prompts sharing a header (~2/3 of their tokens, like the generator's
    few-shot examples), each with `rows` completions of lengths spread over [completion_tokens/2, completion_tokens]."""

    prompts: list[list[int]]
    completions: list[list[list[int]]]

    @staticmethod
    def make(n_prompts: int, rows: int, prompt_tokens: int, completion_tokens: int, vocab: int, seed: int) -> "Workload":
        rng = random.Random(seed)
        tok = lambda: rng.randrange(2, vocab)  # noqa: E731  (0 and 1 are pad and EOS)
        header = [tok() for _ in range(2 * prompt_tokens // 3)]
        prompts = [header + [tok() for _ in range(prompt_tokens - len(header))] for _ in range(n_prompts)]
        lo = max(1, completion_tokens // 2)
        comps = [[[tok() for _ in range(rng.randint(lo, completion_tokens))] for _ in range(rows)] for _ in prompts]
        return Workload(prompts, comps)

    def micro_batches(self, size: int) -> list[tuple[list[list[int]], list[list[int]]]]:
        """Rows of one prompt together, as the trainer batches them: (prompts, completions) per micro-batch."""
        flat = [(p, c) for p, cs in zip(self.prompts, self.completions) for c in cs]
        return [([p for p, _ in flat[i:i + size]], [c for _, c in flat[i:i + size]]) for i in range(0, len(flat), size)]


def matmul_params(shape: dict[str, Any]) -> int:
    """Parameters that take part in matmuls per token: attention q/k/v/o, the MLP, the output head."""
    h, inter, layers = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    heads, kv = shape["num_attention_heads"], shape["num_key_value_heads"]
    hd = h // heads
    attn = h * heads * hd * 2 + h * kv * hd * 2
    return layers * (attn + 3 * h * inter) + h * shape["vocab_size"]


def step_flops(shape: dict[str, Any], batches: Sequence[tuple[list[list[int]], list[list[int]]]]) -> float:
    """Model FLOPs of one training step (module docstring): 3 passes (π_old, forward, backward of inputs) of
    2·N per needed token plus attention 4·d·context per token and layer."""
    n, h, layers = matmul_params(shape), shape["hidden_size"], shape["num_hidden_layers"]
    flops = 0.0
    for prompts, comps in batches:
        for p in {tuple(x) for x in prompts}:
            flops += 2 * n * len(p) + 4 * h * layers * len(p) * (len(p) + 1) / 2
        for p, c in zip(prompts, comps):
            ctx = sum(len(p) + i + 1 for i in range(len(c)))
            flops += 2 * n * len(c) + 4 * h * layers * ctx
    return 3 * flops


def busy_share(intervals: Sequence[tuple[float, float]], wall: float) -> float:
    """Share of `wall` covered by the union of (start, end) intervals."""
    covered, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        covered += e - max(s, end)
        end = e
    return covered / wall if wall > 0 else 0.0


def alternate(n_rounds: int) -> list[tuple[str, str]]:
    """Round orders A B, B A, A B, ... so that neither path always runs on a warmer machine."""
    return [("a", "b") if i % 2 == 0 else ("b", "a") for i in range(n_rounds)]


# ---------------------------------------------------------------------------------------------- device parts


def _model(shape: dict[str, Any], device, dtype, lora_r: int, seed: int):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(seed)
    cfg = Qwen2Config(**shape, max_position_embeddings=4096, bos_token_id=EOS, eos_token_id=EOS,
                      pad_token_id=PAD)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.generation_config.pad_token_id = PAD
    model.generation_config.eos_token_id = EOS
    return get_peft_model(model, LoraConfig(r=lora_r, lora_alpha=2 * lora_r,
                                            target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def train_step(model, opt, batches, shared: bool, device) -> float:
    """One step as the trainer runs it: the π_old pass, then forward + backward per micro-batch, one AdamW step."""
    import torch

    from spogw_dagster.core.training.logprobs import build_batch, completion_logprobs

    _sync(device)
    t0 = time.perf_counter()
    built = [build_batch(p, c, PAD, shared_prompt=shared).to(device) for p, c in batches]
    with torch.no_grad():
        old = [completion_logprobs(model, b, 1.0) for b in built]
    for b, o in zip(built, old):
        lp = completion_logprobs(model, b, 1.0)
        mask = b.completion_mask
        ratio = torch.exp(lp - o)  # the clipped-ratio surrogate's shape of work; the loss value is not the point
        loss = -(ratio * mask).sum() / mask.sum()
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    _sync(device)
    return time.perf_counter() - t0


def _profiled_busy(model, opt, batches, shared: bool, device) -> float:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        wall = train_step(model, opt, batches, shared, device)
    kernels = [(e.time_range.start, e.time_range.end) for e in prof.events()
               if e.device_type.name == "CUDA" and e.time_range.end > e.time_range.start]
    return busy_share(kernels, wall * 1e6)  # profiler times are in microseconds


def bench_train(name: str, shape, args, device, dtype) -> dict[str, float]:
    import torch

    work = Workload.make(args.prompts, args.rows, args.prompt_tokens, args.completion_tokens, shape["vocab_size"],
                         args.seed)
    batches = work.micro_batches(args.micro_batch)
    model = _model(shape, device, dtype, args.lora_r, args.seed).train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    paths = {"a": True, "b": False}
    for shared in paths.values():  # warm-up: kernels, allocator, autotuning
        train_step(model, opt, batches, shared, device)
    best = {True: float("inf"), False: float("inf")}
    for order in alternate(args.rounds):
        for k in order:
            best[paths[k]] = min(best[paths[k]], train_step(model, opt, batches, paths[k], device))
    tokens = sum(len(c) for cs in work.completions for c in cs)
    flops = step_flops(shape, batches)
    peak = _peak(device)
    out = {"shared_s": best[True], "per_row_s": best[False], "ratio": best[False] / best[True],
           "shared_tps": tokens / best[True], "per_row_tps": tokens / best[False]}
    line = (f"TRAIN {name} shared {best[True]:.2f} s per-row {best[False]:.2f} s "
            f"RATIO train shared/per-row = {out['ratio']:.2f}  completion tok/s shared {out['shared_tps']:.0f} "
            f"per-row {out['per_row_tps']:.0f}")
    if peak:
        out["mfu_shared"], out["mfu_per_row"] = flops / best[True] / peak, flops / best[False] / peak
        line += f"  MFU shared {out['mfu_shared']:.1%} per-row {out['mfu_per_row']:.1%}"
    if args.profile and device.type == "cuda":
        out["busy_shared"] = _profiled_busy(model, opt, batches, True, device)
        out["busy_per_row"] = _profiled_busy(model, opt, batches, False, device)
        line += f"  GPU busy shared {out['busy_shared']:.0%} per-row {out['busy_per_row']:.0%}"
    print(line, flush=True)
    del model, opt
    _free(device)
    return out


def bench_sample(name: str, shape, args, device, dtype) -> dict[str, float]:
    from spogw_dagster.core.inference.sampling import SamplingParams, TransformersSampler

    work = Workload.make(args.prompts, 1, args.prompt_tokens, 1, shape["vocab_size"], args.seed + 1)
    prompts = [" ".join(map(str, p)) for p in work.prompts]
    model = _model(shape, device, dtype, args.lora_r, args.seed).eval()
    tok = IdTokenizer()
    samplers = {"a": TransformersSampler(model=model, tokenizer=tok, batch_size=args.sample_batch, seed=args.seed,
                                         device=str(device), prefix_sharing=True),
                "b": TransformersSampler(model=model, tokenizer=tok, batch_size=args.sample_batch, seed=args.seed,
                                         device=str(device), prefix_sharing=False)}
    params = SamplingParams(temperature=1.0, max_tokens=args.completion_tokens, seed=args.seed)

    def once(k: str) -> float:
        _sync(device)
        t0 = time.perf_counter()
        out = samplers[k].generate(prompts, params, n=args.rows)
        _sync(device)
        return sum(len(r.token_ids) for row in out for r in row) / (time.perf_counter() - t0)

    for k in samplers:
        once(k)
    best = {"a": 0.0, "b": 0.0}
    for order in alternate(args.rounds):
        for k in order:
            best[k] = max(best[k], once(k))
    out = {"prefix_tps": best["a"], "generate_tps": best["b"], "ratio": best["a"] / best["b"]}
    print(f"SAMPLE {name} prefix {best['a']:.0f} tok/s generate {best['b']:.0f} tok/s "
          f"RATIO sample prefix/generate = {out['ratio']:.2f}", flush=True)
    del model, samplers
    _free(device)
    return out


def _peak(device) -> float | None:
    import torch

    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16.items() if k in name), None)


def _free(device) -> None:
    import gc

    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def main(argv: Sequence[str] | None = None) -> int:
    import torch

    from spogw_dagster.core.device_paths import prefix_sharing_for, shared_prompt_for

    args = parse_args(argv)
    device = torch.device(args.device if args.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({torch.get_num_threads()} threads)"
    print(f"gpu_paths on {where}, torch {torch.__version__}: {args.prompts} prompts x {args.rows} rows, "
          f"{args.prompt_tokens}-token prompts, completions up to {args.completion_tokens} tokens, "
          f"micro-batch {args.micro_batch}, {args.rounds} alternating round(s)", flush=True)
    skip = set(filter(None, args.skip.split(",")))
    t0 = time.monotonic()
    for name in args.shapes.split(","):
        shape = SHAPES[name]
        tr = bench_train(name, shape, args, device, dtype) if "train" not in skip else None
        sa = bench_sample(name, shape, args, device, dtype) if "sample" not in skip else None
        parts = []
        if sa:
            parts.append(f"--generator-tps {sa['prefix_tps' if prefix_sharing_for(device.type) else 'generate_tps']:.0f}")
        if tr:
            parts.append(f"--train-tps {tr['shared_tps' if shared_prompt_for(device.type) else 'per_row_tps']:.0f}")
        print(f"PLAN {name} on {device.type}: spogw plan {' '.join(parts)}  (the paths core/device_paths.py picks)",
              flush=True)
    print(f"done in {time.monotonic() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
