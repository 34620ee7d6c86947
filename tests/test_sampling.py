"""Sampling backends on the real bundled SmolLM2 (CPU): shapes, seeds, stop strings, log-prob fidelity, adapters."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads; see spogw_dagster/models.py

import importlib.util

import pytest
import torch

from spogw_dagster.core.training.logprobs import score_completions
from spogw_dagster.core.inference.sampling import (
    GPU_EXTRA_HINT,
    SampleResult,
    SamplingParams,
    TransformersSampler,
    make_sampler,
)

pytestmark = pytest.mark.model

PROMPTS = [
    "def add(a, b):\n",
    "The capital of France is",
    "Count: 1, 2, 3,",
]


@pytest.fixture(scope="module")
def sampler():
    return TransformersSampler("smollm2", batch_size=8, seed=123)


@pytest.fixture(scope="module")
def random_adapter(tmp_path_factory, sampler):
    """A LoRA adapter with random (non-zero) B, so it really changes the model."""
    import copy

    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    base = copy.deepcopy(sampler.model)
    cfg = LoraConfig(r=4, lora_alpha=32, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    peft_model = get_peft_model(base, cfg)
    out = tmp_path_factory.mktemp("adapter") / "random"
    peft_model.save_pretrained(str(out))
    return out


def _max_abs_diff(results: list[SampleResult], recomputed: list[list[float]]) -> float:
    return max(max(abs(a - b) for a, b in zip(r.logprobs, lp)) for r, lp in zip(results, recomputed))


def test_shapes_and_fields(sampler):
    out = sampler.generate(PROMPTS, SamplingParams(temperature=0.8, max_tokens=8), n=2)
    assert len(out) == len(PROMPTS) and all(len(row) == 2 for row in out)
    for prompt, row in zip(PROMPTS, out):
        for r in row:
            assert r.prompt_token_ids == sampler.encode(prompt)
            assert 1 <= len(r.token_ids) <= 8
            assert len(r.logprobs) == len(r.token_ids)
            assert all(lp <= 1e-6 and lp > -100 for lp in r.logprobs)
            assert r.finish_reason in ("stop", "length")
            if r.finish_reason == "length":
                assert len(r.token_ids) == 8
            assert isinstance(r.text, str)
            assert r.to_dict()["token_ids"] == r.token_ids


def test_same_seed_same_samples_other_seed_differs(sampler):
    p = SamplingParams(temperature=1.0, max_tokens=6, seed=7)
    a = sampler.generate(PROMPTS, p, n=2)
    b = sampler.generate(PROMPTS, p, n=2)
    assert [[r.token_ids for r in row] for row in a] == [[r.token_ids for r in row] for row in b]
    assert [[r.logprobs for r in row] for row in a] == [[r.logprobs for r in row] for row in b]
    c = sampler.generate(PROMPTS, SamplingParams(temperature=1.0, max_tokens=6, seed=8), n=2)
    assert [[r.token_ids for r in row] for row in a] != [[r.token_ids for r in row] for row in c]


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_logprobs_match_teacher_forced_recomputation(sampler, temperature):
    """The returned log-probs are log softmax(logits / T) of the sampled tokens (T = 1 when greedy):
    recomputing them by teacher forcing (no padding, no KV cache) gives the same numbers."""
    out = sampler.generate(PROMPTS, SamplingParams(temperature=temperature, max_tokens=10, seed=1), n=2)
    flat = [r for row in out for r in row]
    rec = score_completions(
        sampler.model,
        [r.prompt_token_ids for r in flat],
        [r.token_ids for r in flat],
        sampler.tokenizer.pad_token_id,
        temperature=temperature if temperature > 0 else 1.0,
    )
    assert _max_abs_diff(flat, rec) < 2e-3
    if temperature == 0.0:  # greedy: each token is the argmax, so both samples agree
        assert all(row[0].token_ids == row[1].token_ids for row in out)


def test_temperature_changes_reported_logprobs(sampler):
    """Same tokens at two temperatures: the log-probs are those of the tempered distribution."""
    g = sampler.generate(PROMPTS[:1], SamplingParams(temperature=0.0, max_tokens=6))[0][0]
    at_half = score_completions(
        sampler.model, [g.prompt_token_ids], [g.token_ids], sampler.tokenizer.pad_token_id, temperature=0.5
    )[0]
    # greedy tokens are the mode, so sharpening (T < 1) raises their log-probs
    assert sum(at_half) > sum(g.logprobs)


def test_stop_strings(sampler):
    p = SamplingParams(temperature=0.0, max_tokens=12, stop=("\n",))
    out = sampler.generate(["def add(a, b):\n    return", "Count: 1, 2, 3,"], p)
    for (r,) in out:
        assert "\n" not in r.text
        if r.finish_reason == "stop" and r.stop_reason == "\n":
            # the stop string is not in the text but its token is among the sampled ones
            assert "\n" in sampler.tokenizer.decode(r.token_ids)
            assert len(r.token_ids) < 12
    first = out[0][0]
    assert first.finish_reason == "stop", first


def test_max_tokens_and_length(sampler):
    (r,), = sampler.generate(["Count: 1, 2, 3,"], SamplingParams(temperature=0.0, max_tokens=3))
    assert len(r.token_ids) == 3 and r.finish_reason == "length"


def test_batch_size_one_matches_logprob_convention(sampler):
    s1 = TransformersSampler(model=sampler.model, tokenizer=sampler.tokenizer, batch_size=1, seed=5)
    out = s1.generate(PROMPTS[:2], SamplingParams(temperature=0.9, max_tokens=6), n=1)
    flat = [row[0] for row in out]
    rec = score_completions(
        sampler.model, [r.prompt_token_ids for r in flat], [r.token_ids for r in flat],
        sampler.tokenizer.pad_token_id, temperature=0.9,
    )
    assert _max_abs_diff(flat, rec) < 2e-3


def test_adapter_changes_samples_and_logprobs(sampler, random_adapter):
    with_adapter = TransformersSampler("smollm2", adapter_path=random_adapter, batch_size=8, seed=123)
    p = SamplingParams(temperature=0.0, max_tokens=6)
    base = sampler.generate(PROMPTS, p)
    ada = with_adapter.generate(PROMPTS, p)
    assert [r[0].logprobs for r in base] != [r[0].logprobs for r in ada]
    # and the adapter sampler's log-probs are those of the adapted model
    flat = [r[0] for r in ada]
    rec = score_completions(
        with_adapter.model, [r.prompt_token_ids for r in flat], [r.token_ids for r in flat],
        with_adapter.tokenizer.pad_token_id,
    )
    assert _max_abs_diff(flat, rec) < 2e-3
    rec_base = score_completions(
        sampler.model, [r.prompt_token_ids for r in flat], [r.token_ids for r in flat],
        sampler.tokenizer.pad_token_id,
    )
    assert _max_abs_diff(flat, rec_base) > 1e-2


def test_bad_inputs(sampler):
    with pytest.raises(ValueError, match="empty prompt"):
        sampler.generate([""], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="n must be"):
        sampler.generate(PROMPTS, SamplingParams(max_tokens=2), n=0)
    with pytest.raises(TypeError, match="list of strings"):
        sampler.generate("one prompt", SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="temperature"):
        sampler.generate(PROMPTS, SamplingParams(temperature=-1.0))
    with pytest.raises(ValueError, match="top_p"):
        sampler.generate(PROMPTS, SamplingParams(top_p=0.0))
    with pytest.raises(ValueError, match="max_tokens"):
        sampler.generate(PROMPTS, SamplingParams(max_tokens=0))


def test_factory(sampler):
    s = make_sampler("transformers", model=sampler.model, tokenizer=sampler.tokenizer, batch_size=2)
    assert isinstance(s, TransformersSampler)
    with pytest.raises(ValueError, match="unknown sampler kind"):
        make_sampler("llamafile")
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(ImportError, match=r"pip install spogw-dagster\[gpu\]"):
            make_sampler("vllm")
        assert isinstance(
            make_sampler("auto", model=sampler.model, tokenizer=sampler.tokenizer), TransformersSampler
        )
    assert "[gpu]" in GPU_EXTRA_HINT


# ---------------------------------------------------------------------------------------------------
# exact expectations, recomputed without the project's code: a plain forward of the unpadded sequence,
# no KV cache, no batching


def _plain_next_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1].double()


def test_greedy_equals_the_argmax_continuation_of_a_plain_forward_loop(sampler):
    """Temperature 0, all prompts in one padded batch: each row's tokens are the argmax continuation computed
    one token at a time from full forwards (stopping after EOS), its log-probs are log softmax(logits)
    (T = 1 for greedy) of those tokens within 1e-4, and the text is their decoding without special tokens."""
    max_tokens = 8
    out = sampler.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=max_tokens, seed=3))
    eos = sampler.tokenizer.eos_token_id
    for prompt, (r,) in zip(PROMPTS, out):
        ids = list(sampler.tokenizer(prompt)["input_ids"])
        assert r.prompt_token_ids == ids
        want, want_lp = [], []
        for _ in range(max_tokens):
            lp = torch.log_softmax(_plain_next_logits(sampler.model, ids + want), -1)
            tok = int(lp.argmax())
            want.append(tok)
            want_lp.append(float(lp[tok]))
            if tok == eos:
                break
        assert r.token_ids == want, (prompt, r.token_ids, want)
        assert max(abs(a - b) for a, b in zip(r.logprobs, want_lp)) < 1e-4
        assert r.finish_reason == ("stop" if want[-1] == eos else "length")
        assert r.text == sampler.tokenizer.decode(want, skip_special_tokens=True)


def test_sampled_logprobs_equal_the_tempered_log_softmax_recomputed_by_hand(sampler):
    """T = 0.7, two samples per prompt: logprobs[t] = log softmax(logits_t / 0.7)[token_t] of a plain forward
    of prompt + the sampled tokens before t, within 1e-4 (not the T = 1 value: that differs by far more)."""
    T = 0.7
    out = sampler.generate(PROMPTS, SamplingParams(temperature=T, max_tokens=6, seed=11), n=2)
    worst, worst_t1 = 0.0, 0.0
    for row in out:
        for r in row:
            seq = torch.tensor([r.prompt_token_ids + r.token_ids])
            with torch.no_grad():
                logits = sampler.model(seq).logits[0].double()
            pos = torch.arange(len(r.prompt_token_ids) - 1, seq.shape[1] - 1)
            nxt = seq[0, pos + 1]
            at_t = torch.log_softmax(logits[pos] / T, -1)[torch.arange(len(pos)), nxt]
            at_1 = torch.log_softmax(logits[pos], -1)[torch.arange(len(pos)), nxt]
            got = torch.tensor(r.logprobs, dtype=torch.float64)
            worst = max(worst, float((got - at_t).abs().max()))
            worst_t1 = max(worst_t1, float((got - at_1).abs().max()))
    assert worst < 1e-4
    assert worst_t1 > 1e-2
