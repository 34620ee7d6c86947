"""Which generator, and what to show it: base valid rate, copy rate, sampling speed and training step time of
each bundled generator, side by side in one run, on the validation split (never test).

For each model (`--model`, default smollm2 and qwen2.5-coder-0.5b) and prompt style (`--style`, default all
of workflow/template.PROMPT_STYLES), it samples `--k` workflows for each of the first `--queries` validation
queries of `--benchmark` at `--temperature` with the `tiny` generator budget, and reports

  valid        share of completions that parse and pass the validator (what the reward's lower rungs pay);
  near copy    share of valid ones equal (names and layout normalised) to a prompt example or the template;
  distinct     distinct valid workflows per query (of k);
  gen tok/s    generated tokens over sampling wall time;

then, per model, one LoRA optimizer step on one prompt's k completions (the profile's training config, batch
k, the objective's own passes included): seconds per step. No executor is called. Prints

    RATIO gen_tok_s <model>/smollm2 = X
    RATIO step_s <model>/smollm2 = Y

    python bench/generator_choice.py [--queries 16] [--k 4] [--temperature 0.5] [--model M ...] [--style S ...]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from spogw_dagster.contracts import SamplingParams  # noqa: E402
from spogw_dagster.core.inference.sampling import make_sampler  # noqa: E402
from spogw_dagster.core.training import TrainConfig, TrainExample, train_lora  # noqa: E402
from spogw_dagster.benchmarks.queries import split_problems  # noqa: E402
from spogw_dagster.pipeline.settings import load_config  # noqa: E402
from spogw_dagster.pipeline.data.tables import parse_completion  # noqa: E402
from spogw_dagster.workflow.copies import copied_from, distinct_count  # noqa: E402
from spogw_dagster.workflow.template import GENERATOR_STOP, PROMPT_STYLES, generator_prompt  # noqa: E402


def sample(model: str, prompts: list[str], k: int, temperature: float, max_new: int, seed: int):
    s = make_sampler("transformers", model_spec=model, batch_size=8, seed=seed)
    try:
        t0 = time.perf_counter()
        outs = s.generate(prompts, SamplingParams(temperature=temperature, top_p=1.0, max_tokens=max_new, seed=seed,
                                                  stop=tuple(GENERATOR_STOP)), n=k)
        dt = time.perf_counter() - t0
    finally:
        s.close()
    return outs, sum(len(o.token_ids) for row in outs for o in row) / dt


def step_seconds(model: str, prompt: str, row, cfg) -> float:
    ex = [TrainExample(prompt, o.text, advantage=1.0 if i % 2 == 0 else -1.0, score=float(i % 2 == 0),
                       completion_token_ids=list(o.token_ids) or [0], old_logprobs=list(o.logprobs) or [0.0],
                       group_id="q") for i, o in enumerate(row)]
    tc = TrainConfig.from_dict({**cfg.train_config().to_dict(), "epochs": 1, "batch_size": len(ex),
                                "eval_after": False})
    with tempfile.TemporaryDirectory() as d:
        res = train_lora(ex, tc, Path(d) / "a", base_model=model, reuse_existing=False)
    sm = res.stats["summary"]
    return (sm["train_seconds"] + sm["precompute_seconds"]) / max(1, sm["optimizer_steps"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--benchmark", default="humaneval")
    ap.add_argument("--queries", type=int, default=16)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.5)
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default: the tiny profile's")
    ap.add_argument("--model", action="append")
    ap.add_argument("--style", action="append", choices=PROMPT_STYLES)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    models = a.model or ["smollm2", "qwen2.5-coder-0.5b"]
    styles = a.style or list(PROMPT_STYLES)
    cfg = load_config("tiny", None, {})
    max_new = a.max_new_tokens or cfg.generator.max_new_tokens
    problems, _ = split_problems(a.benchmark, "validation", limit=a.queries, seed=cfg.benchmark.split_seed)
    print(f"{a.benchmark} validation split, {len(problems)} queries x k = {a.k}, T = {a.temperature}, "
          f"{max_new} new tokens; no executor calls")
    print(f"  {'model':<20}{'prompt':<13}{'valid':>7}{'near copy':>11}{'distinct':>10}{'gen tok/s':>11}")
    speed: dict[str, float] = {}
    step: dict[str, float] = {}
    for m in models:
        for style in styles:
            prompts = [generator_prompt(p.family, p.question, style) for p in problems]
            outs, tps = sample(m, prompts, a.k, a.temperature, max_new, a.seed)
            valid, copies, distinct = 0, 0, 0
            for p, row in zip(problems, outs):
                codes = []
                for o in row:
                    code, status, _ = parse_completion(o.text, p.family)
                    if status == "ok":
                        valid += 1
                        codes.append(code)
                        copies += copied_from(code, p.family) is not None
                distinct += distinct_count(codes)
            n = len(problems) * a.k
            print(f"  {m:<20}{style:<13}{valid / n:>7.3f}{(copies / valid if valid else 0):>11.3f}"
                  f"{distinct / len(problems):>10.2f}{tps:>11.1f}", flush=True)
            if style == styles[0]:
                speed[m] = tps
                step[m] = step_seconds(m, prompts[0], outs[0], cfg)
    print(f"  training: one LoRA step on one prompt's {a.k} completions: " +
          ", ".join(f"{m} {s:.2f} s" for m, s in step.items()))
    if "smollm2" in speed:
        for m in models:
            if m != "smollm2":
                print(f"RATIO gen_tok_s {m}/smollm2 = {speed[m] / speed['smollm2']:.3f}")
                print(f"RATIO step_s {m}/smollm2 = {step[m] / step['smollm2']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
