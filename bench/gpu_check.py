"""A GPU check of the vLLM path, in one run of under 8 minutes, ending with one summary line.

On a machine with an NVIDIA GPU (after `pip install -e ".[gpu]"`, or pass `--install`):

    python bench/gpu_check.py [--model DIR] [--adapter assets/adapters/0001] [--assets-dir assets]

1. **LoRA sampling throughput**: the pipeline's `VLLMSampler` (one engine, `enable_lora`) samples the same
   prompts with the adapter (`vllm.lora.request.LoRARequest`) and without; ratio = tokens/s with / without
   (target >= 0.9). The adapter is the newest `lora_checkpoint` under --assets-dir (or --adapter); with none,
   a random rank-16 PEFT adapter (non-zero B, so it changes the outputs) is written to a temp folder.
2. **Log-probs**: vLLM's log-probs of the sampled tokens (with LoRA) against the trainer's teacher-forced
   recomputation (`core/training/trainer.py::score_examples`, the model in bf16 on the GPU) of the same token ids:
   pass when mean |Δ| <= --tol-mean (0.05 nats) and the 99th percentile |Δ| <= --tol-p99 (0.5 nats): bf16
   kernels differ between the two engines, so token-level noise of a few hundredths is expected; a
   temperature or adapter mismatch shows up as a mean shift of tenths.
3. **One bf16 training step** (LoRA, forward + backward + AdamW step on a batch of the sampled rows) when the
   model is a local 0.5B-7B one; skipped (and said so) otherwise.

Each phase checks the time left against --budget-s (default 420 s) and is skipped, and said so, when it would
not fit. The last line printed is the summary:

    GPU_CHECK ok lora_ratio=0.97 (>=0.90) logprob_mean_abs=0.012 p99=0.091 (<=0.05/0.5) gen_tps=... train_step_s=0.41
    train_tps=... ...

gen_tps and train_tps are what `spogw plan --generator-tps/--train-tps` takes for that GPU (the plan prints no
time for a target nobody measured).

The CPU-side logic (argument parsing, model discovery, the comparison, the summary) is tested in
tests/test_gpu_check.py without a GPU. Where vLLM cannot be installed (or no weights can be carried),
`bench/gpu_paths.py` measures the training and transformers-sampling paths on random weights of named shapes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MIN_PARAMS, MAX_PARAMS = 0.4e9, 8.0e9  # "a 0.5B-7B model", with slack for vocab/tie differences


# ---------------------------------------------------------------------------------------------- pure parts


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None,
                    help="HF model folder (default: $SPOGW_GENERATOR_MODEL, else a 0.5B-7B model found in the HF "
                         "cache, else the bundled smollm2)")
    ap.add_argument("--adapter", default=None, help="LoRA adapter folder (default: newest under --assets-dir)")
    ap.add_argument("--assets-dir", default="assets")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--ratio-target", type=float, default=0.9)
    ap.add_argument("--tol-mean", type=float, default=0.05)
    ap.add_argument("--tol-p99", type=float, default=0.5)
    ap.add_argument("--train-rows", type=int, default=8)
    ap.add_argument("--budget-s", type=float, default=420.0)
    ap.add_argument("--install", action="store_true", help="pip install -e '.[gpu]' first when vllm is missing")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    for name in ("prompts", "max_tokens", "train_rows"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if not 0 < a.temperature <= 5:
        ap.error("--temperature must be in (0, 5]")
    if a.tol_mean <= 0 or a.tol_p99 <= 0 or a.ratio_target <= 0:
        ap.error("tolerances and --ratio-target must be > 0")
    if not 30 <= a.budget_s <= 480:
        ap.error("--budget-s must be within 30..480 (the check must finish in under 8 minutes)")
    return a


def estimate_params(config: dict[str, Any]) -> float:
    """Parameters of a decoder-only transformer from its HF config.json (embeddings + attention + MLP)."""
    h = int(config.get("hidden_size") or config.get("n_embd") or 0)
    layers = int(config.get("num_hidden_layers") or config.get("n_layer") or 0)
    vocab = int(config.get("vocab_size") or 0)
    inter = int(config.get("intermediate_size") or 4 * h)
    heads = int(config.get("num_attention_heads") or 1)
    kv = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or (h // heads if heads else 0))
    attn = h * heads * head_dim * 2 + h * kv * head_dim * 2  # q, o; k, v
    mlp = 3 * h * inter  # gate, up, down
    emb = vocab * h * (1 if config.get("tie_word_embeddings", False) else 2)
    return float(emb + layers * (attn + mlp))


def find_local_model(explicit: str | None, env: dict[str, str], hf_home: Path | None = None) -> tuple[str, str]:
    """(model spec, why): --model, else $SPOGW_GENERATOR_MODEL, else the smallest 0.5B-7B model in the HF cache,
    else the bundled smollm2 (no training step then)."""
    if explicit:
        return explicit, "--model"
    if env.get("SPOGW_GENERATOR_MODEL"):
        return env["SPOGW_GENERATOR_MODEL"], "$SPOGW_GENERATOR_MODEL"
    hub = hf_home or Path(env.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub"
    found = []
    for cfg in sorted(hub.glob("models--*/snapshots/*/config.json")):
        try:
            n = estimate_params(json.loads(cfg.read_text()))
        except (OSError, ValueError, TypeError):
            continue
        if MIN_PARAMS <= n <= MAX_PARAMS and any(cfg.parent.glob("*.safetensors")):
            found.append((n, str(cfg.parent)))
    if found:
        return min(found)[1], "HF cache"
    return "smollm2", "bundled (no 0.5B-7B model found)"


def newest_adapter(assets_dir: Path) -> Path | None:
    """The newest iteration's adapter folder (assets/adapters/<k>/ or assets/lora_checkpoint/<k>/)."""
    from spogw_dagster.adapter_files import ADAPTER_WEIGHTS

    cands = [p.parent for base in ("adapters", "lora_checkpoint") for p in (assets_dir / base).glob(f"*/{ADAPTER_WEIGHTS}")]
    return max(cands, key=lambda p: p.name) if cands else None


def throughput_ratio(lora_tokens: int, lora_s: float, base_tokens: int, base_s: float) -> float:
    """tokens/s with the adapter over tokens/s without."""
    if min(lora_s, base_s) <= 0 or base_tokens <= 0:
        raise ValueError("throughput needs positive times and tokens")
    return (lora_tokens / lora_s) / (base_tokens / base_s)


def compare_logprobs(engine: Sequence[Sequence[float]], trainer: Sequence[Sequence[float]],
                     tol_mean: float, tol_p99: float) -> dict[str, Any]:
    """Token-level |engine − trainer| over all sampled tokens: mean, 99th percentile (nearest rank), max, and
    the mean signed difference; ok when mean <= tol_mean and p99 <= tol_p99."""
    if len(engine) != len(trainer):
        raise ValueError(f"{len(engine)} sequences from the engine vs {len(trainer)} recomputed")
    diffs: list[float] = []
    signed = 0.0
    for i, (a, b) in enumerate(zip(engine, trainer)):
        if len(a) != len(b):
            raise ValueError(f"sequence {i}: {len(a)} engine log-probs vs {len(b)} recomputed")
        for x, y in zip(a, b):
            if not (math.isfinite(x) and math.isfinite(y)):
                raise ValueError(f"sequence {i}: a non-finite log-prob ({x}, {y})")
            diffs.append(abs(x - y))
            signed += x - y
    if not diffs:
        raise ValueError("no tokens to compare")
    s = sorted(diffs)
    p99 = s[max(0, math.ceil(0.99 * len(s)) - 1)]
    mean = sum(diffs) / len(diffs)
    return {"tokens": len(diffs), "mean_abs": mean, "p99_abs": p99, "max_abs": s[-1],
            "mean_signed": signed / len(diffs), "ok": mean <= tol_mean and p99 <= tol_p99}


@dataclass
class Results:
    ratio: float | None = None
    ratio_target: float = 0.9
    logprobs: dict[str, Any] | None = None
    tol_mean: float = 0.05
    tol_p99: float = 0.5
    train_step_s: float | None = None
    gen_tps: float | None = None  # sampled tokens/s with the adapter: `spogw plan --generator-tps`
    train_tps: float | None = None  # trained completion tokens/s: `spogw plan --train-tps`
    train_note: str = ""
    model: str = ""
    elapsed_s: float = 0.0
    skipped: list[str] = field(default_factory=list)
    error: str = ""


def summary_line(r: Results) -> str:
    """One line: GPU_CHECK ok|FAIL|INCOMPLETE and every number, with its target."""
    parts = []
    fail = bool(r.error)
    if r.ratio is not None:
        parts.append(f"lora_ratio={r.ratio:.2f} (>={r.ratio_target:.2f})")
        fail |= r.ratio < r.ratio_target
    if r.logprobs is not None:
        lp = r.logprobs
        parts.append(f"logprob_mean_abs={lp['mean_abs']:.3f} p99={lp['p99_abs']:.3f} max={lp['max_abs']:.3f} "
                     f"signed={lp['mean_signed']:+.3f} over {lp['tokens']} tokens (<={r.tol_mean:g}/{r.tol_p99:g})")
        fail |= not lp["ok"]
    if r.gen_tps is not None:
        parts.append(f"gen_tps={r.gen_tps:.0f}")
    if r.train_step_s is not None:
        parts.append(f"train_step_s={r.train_step_s:.2f}")
    if r.train_tps is not None:
        parts.append(f"train_tps={r.train_tps:.0f}")
    if r.train_note:
        parts.append(f"train: {r.train_note}")
    if r.skipped:
        parts.append("skipped=" + ",".join(r.skipped))
    if r.error:
        parts.append(f"error={r.error}")
    status = "FAIL" if fail else ("INCOMPLETE" if r.ratio is None or r.logprobs is None else "ok")
    return f"GPU_CHECK {status} " + " ".join(parts) + f" model={r.model} elapsed={r.elapsed_s:.0f}s"


# ---------------------------------------------------------------------------------------------- GPU parts


def _ensure_vllm(install: bool) -> None:
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        return
    if not install:
        raise RuntimeError("vllm is not installed: pip install -e '.[gpu]' (or pass --install)")
    subprocess.run([sys.executable, "-m", "pip", "install", "-e", f"{ROOT}[gpu]"], check=True)


def _random_adapter(model_dir: str, out: Path, r: int = 16, seed: int = 0) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model

    from spogw_dagster.models import load_model_and_tokenizer

    torch.manual_seed(seed)
    model, _ = load_model_and_tokenizer(model_dir, dtype="bfloat16")
    peft_model = get_peft_model(model, LoraConfig(r=r, lora_alpha=2 * r, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.02)
    peft_model.save_pretrained(out)
    return out


def _prompts(n: int) -> list[str]:
    from spogw_dagster.benchmarks.queries import split_problems

    problems, _ = split_problems("humaneval", "validation", limit=None, seed=0)  # never the test split
    qs = [p.question for p in problems]
    return [qs[i % len(qs)] for i in range(n)]


def _sample(sampler: Any, prompts: list[str], args: argparse.Namespace, lora: Any) -> tuple[list, float]:
    from spogw_dagster.core.inference.sampling import SamplingParams

    sampler._lora = lora
    params = SamplingParams(temperature=args.temperature, top_p=1.0, max_tokens=args.max_tokens, seed=args.seed)
    sampler.generate(prompts[:2], params)  # warm-up (LoRA load, graphs)
    t0 = time.perf_counter()
    out = sampler.generate(prompts, params)
    return [row[0] for row in out], time.perf_counter() - t0


def _train_step(model_dir: str, adapter: Path, samples: list, rows: int) -> float:
    import torch

    from spogw_dagster.models import load_model_and_tokenizer

    model, _ = load_model_and_tokenizer(model_dir, dtype="bfloat16", adapter_path=adapter, trainable=True)
    model.to("cuda").train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    batch = samples[:rows]
    seqs = [s.prompt_token_ids + s.token_ids for s in batch]
    width = max(map(len, seqs))
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, (s, seq) in enumerate(zip(batch, seqs)):
        ids[i, :len(seq)] = torch.tensor(seq)
        mask[i, :len(seq)] = 1
        labels[i, len(s.prompt_token_ids):len(seq)] = torch.tensor(s.token_ids)

    def step() -> None:
        loss = model(input_ids=ids.cuda(), attention_mask=mask.cuda(), labels=labels.cuda()).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # warm-up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    step()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def run(args: argparse.Namespace) -> Results:
    t_start = time.monotonic()
    left = lambda: args.budget_s - (time.monotonic() - t_start)  # noqa: E731
    res = Results(ratio_target=args.ratio_target, tol_mean=args.tol_mean, tol_p99=args.tol_p99)
    model_spec, why = find_local_model(args.model, dict(os.environ))
    res.model = f"{Path(model_spec).name} ({why})"
    try:
        _ensure_vllm(args.install)
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device visible to torch")
        from spogw_dagster.core.inference.sampling import VLLMSampler
        from spogw_dagster.core.training import TrainExample, score_examples
        from spogw_dagster.models import load_model_and_tokenizer, resolve_model

        folder = str(resolve_model(model_spec))
        tmp = Path(tempfile.mkdtemp(prefix="gpu_check_"))
        adapter = Path(args.adapter) if args.adapter else newest_adapter(Path(args.assets_dir))
        if adapter is None:
            adapter = _random_adapter(folder, tmp / "adapter", seed=args.seed)
            res.model += ", random r=16 adapter"
        prompts = _prompts(args.prompts)
        sampler = VLLMSampler(folder, adapter_path=adapter, seed=args.seed, dtype="bfloat16",
                              gpu_memory_utilization=0.6)
        lora = sampler._lora
        base_out, base_s = _sample(sampler, prompts, args, None)
        lora_out, lora_s = _sample(sampler, prompts, args, lora)
        lora_tokens = sum(len(s.token_ids) for s in lora_out)
        res.ratio = throughput_ratio(lora_tokens, lora_s, sum(len(s.token_ids) for s in base_out), base_s)
        res.gen_tps = lora_tokens / lora_s
        sampler.close()
        del sampler
        torch.cuda.empty_cache()
        if left() < 60:
            res.skipped.append("logprobs(budget)")
        else:
            model, tok = load_model_and_tokenizer(folder, dtype="bfloat16", adapter_path=adapter)
            model.to("cuda")
            exs = [TrainExample(prompt=p, completion=s.text, prompt_token_ids=s.prompt_token_ids,
                                completion_token_ids=s.token_ids) for p, s in zip(prompts, lora_out)]
            recomputed = score_examples(exs, model=model, tokenizer=tok, temperature=args.temperature)
            res.logprobs = compare_logprobs([s.logprobs for s in lora_out], recomputed, args.tol_mean, args.tol_p99)
            del model
            torch.cuda.empty_cache()
        n_params = estimate_params(json.loads((Path(folder) / "config.json").read_text()))
        if not MIN_PARAMS <= n_params <= MAX_PARAMS:
            res.train_note = f"skipped: {n_params / 1e9:.2f}B parameters is not a 0.5B-7B model"
        elif left() < 90:
            res.skipped.append("train(budget)")
        else:
            res.train_step_s = _train_step(folder, adapter, lora_out, args.train_rows)
            res.train_tps = sum(len(s.token_ids) for s in lora_out[:args.train_rows]) / res.train_step_s
            res.train_note = f"{n_params / 1e9:.1f}B bf16 LoRA, {args.train_rows} rows"
    except Exception as e:  # the summary line must still come out
        res.error = f"{type(e).__name__}: {str(e)[:300]}"
    res.elapsed_s = time.monotonic() - t_start
    return res


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    res = run(args)
    line = summary_line(res)
    print(line, flush=True)
    return 0 if line.startswith("GPU_CHECK ok") else 1


if __name__ == "__main__":
    sys.exit(main())
