"""Workflows from the generator: the prompts of a set of problems, sampled n times each from the base model
(+ an adapter). The training samples (`sampled_workflows`, its refinement turns) and the held-out report
(`heldout`) both sample through here, so both see the same prompts and sampling parameters."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Sequence

from spogw_dagster.contracts import Problem, SamplingParams
from spogw_dagster.pipeline.data import tables
from spogw_dagster.workflow.template import GENERATOR_STOP, generator_prompt

__all__ = ["generate_samples", "sample_prompts"]


def generate_samples(pipeline, adapter: Path | None, problems: Sequence[Problem], *, n: int, temperature: float,
                     seed: int, timing: dict[str, float] | None = None):
    """Sample `n` workflows per problem from base (+ adapter); returns (prompts, samples, tokens/s); `timing`
    (when given) gets the sampler's load, prefill and decode seconds."""

    style = pipeline.config().generator.prompt
    prompts = [generator_prompt(p.family, p.question, style) for p in problems]
    samples, tps = sample_prompts(pipeline, adapter, prompts, n=n, temperature=temperature, seed=seed,
                                  timing=timing)
    return prompts, samples, tps


def sample_prompts(pipeline, adapter: Path | None, prompts: Sequence[str], *, n: int, temperature: float,
                   seed: int, timing: dict[str, float] | None = None) -> tuple[list[list[tables.Sample]], float]:
    """`n` completions of each generator prompt from base (+ adapter); returns (samples, tokens/s)."""

    g = pipeline.config().generator
    t_load = time.monotonic()
    sampler = pipeline.sampler(adapter, seed)
    load_s = time.monotonic() - t_load
    try:
        params = SamplingParams(temperature=temperature, top_p=g.top_p if temperature > 0 else 1.0,
                                max_tokens=g.max_new_tokens, seed=seed, stop=tuple(GENERATOR_STOP))
        t0 = time.monotonic()
        outs = sampler.generate(list(prompts), params, n=n)
        dt = time.monotonic() - t0
        if timing is not None:
            own = getattr(sampler, "timing", None) or {"decode_s": dt}  # vLLM's engine: all of it decoding
            for k, v in {"load_s": load_s, **own}.items():
                timing[k] = round(timing.get(k, 0.0) + v, 2)
    finally:
        sampler.close()
    samples = [[tables.Sample(o.text, list(o.token_ids), list(o.logprobs), o.finish_reason) for o in row]
               for row in outs]
    ntok = sum(len(s.token_ids) for row in samples for s in row)
    return samples, (ntok / dt if dt > 0 else 0.0)
