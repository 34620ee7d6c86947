"""The prefix-shared sampler path on the real bundled SmolLM2 (CPU): one prefill per prompt, the same
log-prob convention as a teacher-forced forward, seeded reproducibility, per-sample stop/EOS/length."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads; see spogw_dagster/models.py

import pytest

from spogw_dagster.core.training.logprobs import score_completions
from spogw_dagster.core.inference.sampling import SampleResult, SamplingParams, TransformersSampler
from spogw_dagster.workflow.template import GENERATOR_STOP, generator_prompt

pytestmark = pytest.mark.model

# Two real generator prompts (the few-shot header, ~370 tokens, is their shared token prefix) and two short
# ones of different lengths, so batches mix prompts of different lengths (left-padded caches).
QUESTIONS = [
    'def add(a: int, b: int) -> int:\n    """Return the sum of a and b."""\n',
    'def is_palindrome(s: str) -> bool:\n    """Return True if s reads the same backwards."""\n',
]
GEN_PROMPTS = [generator_prompt("code", q) for q in QUESTIONS]
SHORT_PROMPTS = ["The capital of France is", "Count: 1, 2, 3,"]


@pytest.fixture(scope="module")
def shared():
    return TransformersSampler("smollm2", batch_size=4, seed=11)


@pytest.fixture(scope="module")
def per_sample(shared):
    return TransformersSampler(model=shared.model, tokenizer=shared.tokenizer, batch_size=4, seed=11,
                               prefix_sharing=False)


def _teacher_forced_gap(sampler: TransformersSampler, flat: list[SampleResult], temperature: float) -> float:
    """Largest |reported - recomputed| over all tokens; recomputed by full prompt+completion forwards (no KV
    cache), log_softmax(logits / T) of each sampled token. Samples of one prompt share a forward batch, so
    prompts are never padded (completions are right-padded, which a causal model cannot see)."""
    by_prompt: dict[tuple[int, ...], list[SampleResult]] = {}
    for r in flat:
        by_prompt.setdefault(tuple(r.prompt_token_ids), []).append(r)
    gap = 0.0
    for prompt, rows in by_prompt.items():
        rec = score_completions(sampler.model, [list(prompt)] * len(rows), [r.token_ids for r in rows],
                                sampler.tokenizer.pad_token_id, temperature=temperature, batch_size=len(rows))
        for r, lp in zip(rows, rec):
            assert len(lp) == len(r.logprobs)
            gap = max(gap, max(abs(a - b) for a, b in zip(r.logprobs, lp)))
    return gap


@pytest.mark.parametrize("temperature", [0.5, 0.0])
def test_logprobs_equal_teacher_forced_recomputation(shared, temperature):
    """Rows of 4 prompts in batches of 4 (3 samples each): batches of one prompt (expanded cache) and of
    several (left-padded caches), the generator prompts through their shared few-shot prefix."""
    p = SamplingParams(temperature=temperature, max_tokens=12, seed=3)
    out = shared.generate(GEN_PROMPTS + SHORT_PROMPTS, p, n=3)
    flat = [r for row in out for r in row]
    assert sum(len(r.token_ids) for r in flat) > 40  # enough tokens for the check to mean something
    assert _teacher_forced_gap(shared, flat, temperature if temperature > 0 else 1.0) < 1e-4


def test_logprobs_with_top_p_are_before_truncation(shared):
    """With top_p < 1 the recorded value is still log softmax(logits / T), not renormalised over the nucleus."""
    p = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=10, seed=5)
    flat = [r for row in shared.generate(GEN_PROMPTS[:1] + SHORT_PROMPTS, p, n=2) for r in row]
    assert _teacher_forced_gap(shared, flat, 0.8) < 1e-4


def test_one_prefill_per_prompt_across_batches(shared, monkeypatch):
    """n = 6 rows per prompt in batches of 4: each prompt is prefilled once (plus one prefill of the header
    both generator prompts share), however many batches its rows fall in."""
    calls: list[int] = []
    real = TransformersSampler._prefill

    def counting(self, ids, prefix):
        calls.append(len(ids) - (prefix.length if prefix is not None else 0))
        return real(self, ids, prefix)

    monkeypatch.setattr(TransformersSampler, "_prefill", counting)
    out = shared.generate(GEN_PROMPTS + GEN_PROMPTS[:1], SamplingParams(temperature=0.5, max_tokens=2, seed=1), n=6)
    assert [len(row) for row in out] == [6, 6, 6]
    # the repeated prompt is not prefilled again; 1 shared header + 2 distinct prompts
    assert len(calls) == 3
    header, *suffixes = calls
    full = [len(shared.encode(x)) for x in GEN_PROMPTS]
    assert header >= 300 and sorted(s + header for s in suffixes) == sorted(full)


def test_fixed_seed_reproducible_other_seed_differs(shared):
    p = SamplingParams(temperature=1.0, max_tokens=8, seed=7)
    prompts = GEN_PROMPTS[:1] + SHORT_PROMPTS
    a = shared.generate(prompts, p, n=3)
    b = shared.generate(prompts, p, n=3)
    assert [[(r.token_ids, r.logprobs) for r in row] for row in a] == [[(r.token_ids, r.logprobs) for r in row] for row in b]
    c = shared.generate(prompts, SamplingParams(temperature=1.0, max_tokens=8, seed=8), n=3)
    assert [[r.token_ids for r in row] for row in a] != [[r.token_ids for r in row] for row in c]
    # the m samples of one prompt are not copies of each other
    assert len({tuple(r.token_ids) for r in a[1]}) > 1


def _check_ending(sampler: TransformersSampler, r: SampleResult, p: SamplingParams) -> str:
    """Which rule ended `r`, checked against the spec (module docstring of core/inference/sampling.py)."""
    toks, tok = r.token_ids, sampler.tokenizer
    assert len(r.logprobs) == len(toks) >= 1
    assert not any(t in sampler.eos_ids for t in toks[:-1]), "generation went on past an EOS"
    for k in range(1, len(toks)):  # no stop string was complete before the last token
        assert not any(s in tok.decode(toks[:k], skip_special_tokens=True) for s in p.stop), (k, r)
    full = tok.decode(toks, skip_special_tokens=True)
    if r.stop_reason is not None:
        assert r.finish_reason == "stop" and r.stop_reason in full and r.stop_reason not in r.text
        assert full.startswith(r.text)
        return "stop string"
    assert r.text == full and not any(s in full for s in p.stop)
    if r.finish_reason == "stop":
        assert toks[-1] in sampler.eos_ids
        return "eos"
    assert r.finish_reason == "length" and len(toks) == p.max_tokens
    return "length"


def test_stop_eos_and_length_per_sample_in_one_batch(shared):
    """Greedy rows of different prompts in ONE batch end differently: a stop string, EOS, max length."""
    chat = "<|im_start|>user\nSay OK.<|im_end|>\n<|im_start|>assistant\n"
    prompts = ["The capital of France is", chat, "Count: 1, 2, 3,"]
    p = SamplingParams(temperature=0.0, max_tokens=16, stop=("\n\n",))
    one_batch = TransformersSampler(model=shared.model, tokenizer=shared.tokenizer, batch_size=8, seed=0)
    out = [row[0] for row in one_batch.generate(prompts, p)]
    endings = [_check_ending(one_batch, r, p) for r in out]
    assert endings == ["stop string", "eos", "length"], [(e, r.text) for e, r in zip(endings, out)]
    assert len(out[0].token_ids) < len(out[1].token_ids) or len(out[1].token_ids) < 16
    # the same rows decoded one prompt at a time end the same way (batching does not change the ending)
    alone = [one_batch.generate([x], p)[0][0] for x in prompts]
    assert [r.token_ids for r in alone] == [r.token_ids for r in out]


def test_samples_of_one_prompt_end_at_different_points(shared):
    """m = 8 samples of a real generator prompt with its stop strings, in one expanded batch: each ends by
    its own rule, at its own length."""
    p = SamplingParams(temperature=0.5, max_tokens=40, seed=2, stop=tuple(GENERATOR_STOP))
    eight = TransformersSampler(model=shared.model, tokenizer=shared.tokenizer, batch_size=8, seed=0)
    (row,) = eight.generate(GEN_PROMPTS[:1], p, n=8)
    endings = {_check_ending(eight, r, p) for r in row}
    assert len({len(r.token_ids) for r in row}) > 1
    assert "stop string" in endings or "eos" in endings
    assert _teacher_forced_gap(eight, row, 0.5) < 1e-4


def test_greedy_matches_the_per_sample_path(shared, per_sample):
    """Greedy decoding has no randomness: both paths give the same tokens, texts and endings."""
    p = SamplingParams(temperature=0.0, max_tokens=12, stop=tuple(GENERATOR_STOP) + ("\n\n",))
    prompts = GEN_PROMPTS + SHORT_PROMPTS
    a = [row[0] for row in shared.generate(prompts, p)]
    b = [row[0] for row in per_sample.generate(prompts, p)]
    assert [(r.token_ids, r.text, r.finish_reason, r.stop_reason) for r in a] == \
        [(r.token_ids, r.text, r.finish_reason, r.stop_reason) for r in b]
    assert max(abs(x - y) for r, s in zip(a, b) for x, y in zip(r.logprobs, s.logprobs)) < 1e-3


def test_per_sample_path_still_works(per_sample):
    assert per_sample.prefix_sharing is False
    p = SamplingParams(temperature=0.7, max_tokens=8, seed=4)
    out = per_sample.generate(GEN_PROMPTS[:1] + SHORT_PROMPTS[:1], p, n=2)
    assert [len(row) for row in out] == [2, 2]
    flat = [r for row in out for r in row]
    assert all(1 <= len(r.token_ids) <= 8 and len(r.logprobs) == len(r.token_ids) for r in flat)
    assert _teacher_forced_gap(per_sample, flat, 0.7) < 2e-3
    again = per_sample.generate(GEN_PROMPTS[:1] + SHORT_PROMPTS[:1], p, n=2)
    assert [[r.token_ids for r in row] for row in out] == [[r.token_ids for r in row] for row in again]


def test_the_default_path_is_the_one_measured_faster_on_the_device(shared):
    # the fixture passes no prefix_sharing: on the CPU the prefix-shared path (1.72x there, core/device_paths.py)
    assert shared.device.type == "cpu" and shared.prefix_sharing is True
