"""Training throughput, side by side in one run. Two cases:

``--case shared-prompt`` (default), the realistic one: the real generator prompts of `sampled_workflows`
(`generator_prompt` for the `tiny` profile's HumanEval training queries, ~450-700 tokens each), m = 8
completions per prompt (the profile's m) of `tiny` lengths (workflow bodies of 24..96 tokens, the profile's
max_new_tokens), the profile's training config (LoRA, objective spogw with β = 0.1, T) with micro-batches of
m rows (one prompt's completions; `--batch-size` to change, the profile's is 4) and π_old recomputed (so the π_old/π_ref pass is timed; without a previous adapter π_ref is π_old). The same rows and
micro-batches go through `train_lora` twice:

  - shared-prompt: `TrainConfig(shared_prompt=True)`, each micro-batch runs each distinct prompt once (with
    gradients) and only the completion tokens per row, on the prompt's KV cache;
  - per-row:       `TrainConfig(shared_prompt=False)`, every row's prompt again.

Both see the same batches (batching by prompt does not depend on the flag), so their losses agree; the
comparison is wall time. Prints optimizer-step time and the π_old/π_ref pass time of both, and the lines

    RATIO shared-prompt/per-row = X.XX              (optimizer-step throughput, new over old; target >= 3)
    RATIO shared-prompt/per-row precompute = X.XX   (the π_old/π_ref no-grad pass)

    python bench/train_throughput.py [--queries 2] [--m 8] [--batch-size N] [--threads N]

``--case memory``: peak memory (RSS high-water mark over the loaded model, in a fresh process per path) of
one training micro-batch of one real prompt x m completions of 96 tokens, forward + backward, both paths.

``--case overhead``: our ioGRPO step against a plain LoRA forward+backward (HF causal-LM loss) on the same
micro-batches of short synthetic examples. Prints ``RATIO ours/plain`` (target >= 0.7 incl. the ref pass).

    python bench/train_throughput.py --case overhead [--examples 8] [--batch-size 4] [--epochs 2] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see bench/sampling_throughput.py

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from spogw_dagster.core.training.logprobs import build_completion_batch  # noqa: E402
from spogw_dagster.core.training import TrainConfig, TrainExample, train_lora  # noqa: E402
from spogw_dagster.core.training.batching import micro_batches, tokenize  # noqa: E402
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
    items = tokenize(examples, tok, cfg)
    seconds, tokens = 0.0, 0
    for epoch in range(cfg.epochs):
        for mb in micro_batches(items, cfg, epoch):
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


def overhead_case(args) -> None:
    examples = make_examples(args.examples)
    cfg = TrainConfig(objective="spogw", beta=0.1, epochs=args.epochs, batch_size=args.batch_size or 4,
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

    print(f"\n{args.examples} examples x {args.epochs} epochs, batch {cfg.batch_size}, torch threads {torch.get_num_threads()}")
    print(f"ours (steps only) {max(ours_step):.1f} tok/s, ours incl. precompute {max(ours_total):.1f} tok/s, "
          f"plain LoRA fwd+bwd {max(plain):.1f} tok/s")
    print(f"RATIO ours/plain, step only          = {max(ours_step) / max(plain):.3f}   "
          f"(median {statistics.median(ours_step) / statistics.median(plain):.3f})")
    print(f"RATIO ours/plain, incl. ref forward  = {max(ours_total) / max(plain):.3f}   "
          f"(median {statistics.median(ours_total) / statistics.median(plain):.3f}; target >= 0.7)")



# --------------------------------------------------------------------------------------------------
# the realistic case: real generator prompts, m completions each


def realistic_rows(queries: int, m: int, tok, seed: int = 0) -> tuple[Any, list[TrainExample]]:
    """The `tiny` profile's config and m rows for each of its first `queries` training queries: the prompt
    exactly as `sampled_workflows` builds it, and workflow bodies of 24..max_new_tokens tokens."""
    import random

    from spogw_dagster.pipeline.settings import load_config
    from spogw_dagster.pipeline.defs.resources import _queries
    from spogw_dagster.workflow.template import FEW_SHOT, generator_prompt

    cfg = load_config("tiny", None, {})
    b = cfg.benchmark
    train = list(_queries(b.name, b.data_path, b.split_seed, b.train_queries, b.heldout_queries)[0])[:queries]
    rng = random.Random(seed)
    rows = []
    for q in train:
        prompt = generator_prompt(q.family, q.question)
        bodies = list(FEW_SHOT[q.family])
        for i in range(m):
            text = "".join(rng.sample(bodies, len(bodies)))  # a workflow-like body, long enough to cut
            ids = tok(text, add_special_tokens=False)["input_ids"]
            n = rng.randint(24, cfg.generator.max_new_tokens)
            rows.append(TrainExample(prompt, "", advantage=1.0 if i % 2 == 0 else -1.0, score=float(i % 2 == 0),
                                     completion_token_ids=(ids * 4)[:n], group_id=q.id))
    return cfg, rows


def shared_prompt_case(args) -> None:
    _, tok = load_model_and_tokenizer("smollm2")  # the conversion is cached before anything is timed
    pcfg, rows = realistic_rows(args.queries, args.m, tok)
    base = pcfg.train_config().to_dict()
    base.update(old_logprobs="recompute", eval_after=False, epochs=1)
    base["batch_size"] = args.batch_size or args.m  # one prompt's m completions per micro-batch
    prompt_lens = sorted({len(tok(r.prompt)["input_ids"]) for r in rows})
    comp = [len(r.completion_token_ids) for r in rows]
    print(f"{args.queries} tiny-profile training queries x m = {args.m}: {len(rows)} rows, prompt tokens "
          f"{prompt_lens}, completion tokens {min(comp)}-{max(comp)} (mean {statistics.mean(comp):.0f}), "
          f"batch {base['batch_size']}, objective {base['objective']}, torch threads {torch.get_num_threads()}")
    res = {}
    with tempfile.TemporaryDirectory() as d:
        for shared in (True, False):  # first-call costs (allocator, thread pools) before anything is timed
            warm = TrainConfig.from_dict({**base, "shared_prompt": shared, "batch_size": 2})
            train_lora(make_examples(2), warm, Path(d) / f"warm-{shared}", reuse_existing=False)
        for name, shared in (("shared-prompt", True), ("per-row", False)):
            cfg = TrainConfig.from_dict({**base, "shared_prompt": shared})
            marks: list[float] = []  # process CPU time at the end of each step (robust on a busy machine)
            s = train_lora(rows, cfg, Path(d) / name, reuse_existing=False,
                           log=lambda st: marks.append(time.process_time())).stats
            s["cpu_seconds_after_first_step"] = marks[-1] - marks[0]
            res[name] = s
            sm = s["summary"]
            per_step = sm["train_seconds"] / sm["optimizer_steps"]
            print(f"{name:>13}: {sm['optimizer_steps']} optimizer steps in {sm['train_seconds']:.1f}s "
                  f"({per_step:.2f}s per step, {sm['train_tokens_per_second']:.0f} completion tok/s); "
                  f"π_old/π_ref pass {sm['precompute_seconds']:.1f}s; first loss {sm['first_loss']:.6f}")
    new, old = res["shared-prompt"]["summary"], res["per-row"]["summary"]
    losses = [(a["loss"], b["loss"]) for a, b in zip(res["shared-prompt"]["steps"], res["per-row"]["steps"])]
    print(f"max |loss difference| over the steps: {max(abs(a - b) for a, b in losses):.2e}")
    cpu_new, cpu_old = res["shared-prompt"]["cpu_seconds_after_first_step"], res["per-row"]["cpu_seconds_after_first_step"]
    if cpu_new > 0:
        print(f"process CPU seconds of the steps after the first: shared-prompt {cpu_new:.1f}, per-row {cpu_old:.1f} "
              f"(ratio {cpu_old / cpu_new:.2f}; wall time is noisy when other processes share the cores)")
    print(f"RATIO shared-prompt/per-row = {old['train_seconds'] / new['train_seconds']:.2f}")
    print(f"RATIO shared-prompt/per-row precompute = {old['precompute_seconds'] / new['precompute_seconds']:.2f}")


# --------------------------------------------------------------------------------------------------
# peak memory of one micro-batch


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def one_batch_peak(shared: bool, m: int, completion_tokens: int) -> None:
    """In this (fresh) process: peak RSS over the loaded model of one fwd + bwd of 1 prompt x m completions."""
    from peft import LoraConfig, get_peft_model

    from spogw_dagster.core.training.passes import micro_batch_logprobs, micro_batch_objective

    model, tok = load_model_and_tokenizer("smollm2")
    pcfg, rows = realistic_rows(1, m, tok)
    tcfg = TrainConfig.from_dict({**pcfg.train_config().to_dict(), "shared_prompt": shared,
                                  "old_logprobs": "recompute", "batch_size": m})
    model = get_peft_model(model, LoraConfig(r=tcfg.lora_r, lora_alpha=tcfg.lora_alpha,
                                             target_modules=list(tcfg.target_modules), task_type="CAUSAL_LM"))
    model.train()
    items = tokenize(rows, tok, tcfg)
    for it in items:
        it.completion_ids = (it.completion_ids * 8)[:completion_tokens]
        it.old = it.ref = [-1.0] * completion_tokens
    Path("/proc/self/clear_refs").write_text("5")  # reset the high-water mark
    before = _rss_kib("VmRSS")
    logp, b = micro_batch_logprobs(model, items, tcfg, tok.pad_token_id, torch.device("cpu"))
    micro_batch_objective(items, tcfg, logp, b.completion_mask, torch.device("cpu")).loss.backward()
    peak = _rss_kib("VmHWM")
    print(f"PEAK {(peak - before) / 1024:.0f} MiB prompt={len(items[0].prompt_ids)}")


def memory_case(args) -> None:
    import subprocess

    for name, shared in (("shared-prompt", True), ("per-row", False)):
        out = subprocess.run([sys.executable, __file__, "--case", "memory-one", "--m", str(args.m),
                              "--shared", str(int(shared))], capture_output=True, text=True, check=True).stdout
        line = [x for x in out.splitlines() if x.startswith("PEAK")][-1]
        print(f"{name:>13}: one micro-batch of 1 prompt x {args.m} completions of 96 tokens, fwd + bwd: "
              f"{line.split(maxsplit=1)[1]} tokens (peak RSS over the loaded model)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", choices=("shared-prompt", "memory", "memory-one", "overhead"), default="shared-prompt")
    ap.add_argument("--queries", type=int, default=2)
    ap.add_argument("--m", type=int, default=8)
    ap.add_argument("--shared", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--examples", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=None, help="default: m (overhead: 4)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.case == "shared-prompt":
        shared_prompt_case(args)
    elif args.case == "memory":
        memory_case(args)
    elif args.case == "memory-one":
        one_batch_peak(bool(args.shared), args.m, 96)
    else:
        overhead_case(args)


if __name__ == "__main__":
    main()
