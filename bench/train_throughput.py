"""Throughput of an ioGRPO training step over a plain LoRA forward+backward, side by side in one run.

Same model (the bundled SmolLM2 on the CPU, LoRA r=8 on q/v), same examples, same micro-batches:

  - ours:  `train_lora(objective="spogw", beta=0.1)`; its per-step wall time covers building the batch,
           the policy forward (only the completion span goes through the LM head), the log-probs, the
           loss from `core.objectives`, backward, gradient clipping and the AdamW step. π_old and π_ref are
           precomputed once before the first step (one no-grad forward per row: without a previous
           adapter both are the base model); that pass is reported separately and amortised over the epochs.
  - plain: a PEFT LoRA model, `model(input_ids, attention_mask, labels)` (HF's causal-LM loss on the
           completion tokens, prompt tokens labelled -100) + backward + AdamW step on the same batches.

Tokens/s counts completion (trained) tokens, identical on both sides. Variants alternate; best and
median rounds are reported.

    python bench/train_throughput.py [--examples 8] [--batch-size 4] [--epochs 2] [--rounds 2] [--threads N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see bench/sampling_throughput.py

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from spogw_dagster.core.logprobs import build_completion_batch  # noqa: E402
from spogw_dagster.core.trainer import TrainConfig, TrainExample, _batches, _tokenize, train_lora  # noqa: E402
from spogw_dagster.models import load_model_and_tokenizer  # noqa: E402


def make_examples(n: int) -> list[TrainExample]:
    fewshot = (
        "# Workflows are Python classes that call LLM operators.\n"
        "class Workflow:\n    def __call__(self, problem):\n"
        "        cands = [generate(problem) for _ in range(3)]\n"
        "        best = ensemble(problem, cands)\n        return best\n\n"
    )
    out = []
    for i in range(n):
        prompt = fewshot + f"# Task {i}: solve the problem carefully.\nclass Workflow:\n    def __call__(self, problem):\n"
        body = "".join(
            f"        step{j} = generate(problem + ' hint {i}.{j}')\n        review{j} = review(problem, step{j})\n"
            for j in range(4)
        ) + "        return ensemble(problem, [step0, step1, step2, step3])\n"
        out.append(TrainExample(prompt, body, advantage=1.0 if i % 2 == 0 else -1.0, group_id=i // 4))
    return out


def plain_lora_steps(examples, cfg: TrainConfig) -> tuple[float, int]:
    """Seconds and completion tokens for plain LoRA fwd+bwd+AdamW over the same micro-batches."""
    from peft import LoraConfig, get_peft_model

    model, tok = load_model_and_tokenizer("smollm2")
    torch.manual_seed(cfg.seed)
    model = get_peft_model(model, LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                                             target_modules=list(cfg.target_modules), task_type="CAUSAL_LM"))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.learning_rate)
    items = _tokenize(examples, tok, cfg)
    seconds, tokens = 0.0, 0
    for epoch in range(cfg.epochs):
        for mb in _batches(items, cfg, epoch):
            t = time.perf_counter()
            b = build_completion_batch([x.prompt_ids for x in mb], [x.completion_ids for x in mb], tok.pad_token_id)
            labels = b.input_ids.clone()
            labels[:, : b.prompt_len] = -100
            labels[:, b.prompt_len :][b.completion_mask == 0] = -100
            opt.zero_grad(set_to_none=True)
            out = model(input_ids=b.input_ids, attention_mask=b.attention_mask, position_ids=b.position_ids, labels=labels)
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            opt.step()
            seconds += time.perf_counter() - t
            tokens += int(b.completion_mask.sum())
    return seconds, tokens


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--examples", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    examples = make_examples(args.examples)
    cfg = TrainConfig(objective="spogw", beta=0.1, epochs=args.epochs, batch_size=args.batch_size,
                      learning_rate=1e-4, eval_after=False, seed=0)
    load_model_and_tokenizer("smollm2")  # make sure the conversion is cached before timing anything

    ours_step, ours_total, plain = [], [], []
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.rounds):
            res = train_lora(examples, cfg, Path(d) / f"a{r}", reuse_existing=False)
            s = res.stats["summary"]
            tok = s["completion_tokens_trained"]
            ours_step.append(tok / s["train_seconds"])
            ours_total.append(tok / (s["train_seconds"] + s["precompute_seconds"]))
            ps, ptok = plain_lora_steps(examples, cfg)
            assert ptok == tok, (ptok, tok)
            plain.append(ptok / ps)
            print(f"round {r}: {tok} completion tokens, {s['optimizer_steps']} steps | ours steps {s['train_seconds']:.2f}s "
                  f"(+ precompute π_old/π_ref {s['precompute_seconds']:.2f}s) | plain LoRA {ps:.2f}s")

    print(f"\n{args.examples} examples x {args.epochs} epochs, batch {args.batch_size}, torch threads {torch.get_num_threads()}")
    print(f"ours (steps only) {max(ours_step):.1f} tok/s, ours incl. precompute {max(ours_total):.1f} tok/s, "
          f"plain LoRA fwd+bwd {max(plain):.1f} tok/s")
    print(f"RATIO ours/plain, step only          = {max(ours_step) / max(plain):.3f}   "
          f"(median {statistics.median(ours_step) / statistics.median(plain):.3f})")
    print(f"RATIO ours/plain, incl. ref forward  = {max(ours_total) / max(plain):.3f}   "
          f"(median {statistics.median(ours_total) / statistics.median(plain):.3f}; target >= 0.7)")


if __name__ == "__main__":
    main()
