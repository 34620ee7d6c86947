"""Shared-prompt forward (each distinct prompt once, its KV cache expanded to its rows) against the per-row
forward, on the real bundled model with a LoRA on q/k/v: the same loss, LoRA gradients and log-probs for every
objective, with left-padded prompts of different lengths, right-padded completions of different lengths and a
micro-batch that interleaves two prompts. (Batching by prompt, the no-grad passes and a whole run with the flag
on and off: tests/test_trainer.py.)"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads; see spogw_dagster/models.py

import copy

import pytest
import torch

from spogw_dagster.core.training.logprobs import build_completion_batch, completion_logprobs
from spogw_dagster.core.training import TrainConfig
from spogw_dagster.core.training.batching import Item
from spogw_dagster.core.training.passes import micro_batch_logprobs, micro_batch_objective

OBJECTIVES = ["spogw", "grpo", "grpo_nokl", "score_dpo", "rwr"]
PROMPTS = ["Task: add two numbers.\n", "# Write a workflow.\n# Task: sort the list of numbers, then return it.\n"]
# (prompt, completion, advantage, score): rows of the two prompts interleaved, completions of 1 to ~12 tokens
ROWS = [
    (0, "    return a + b\n", 1.2, 1.0),
    (1, "    s = sorted(xs)\n    return s\n", 0.8, 0.9),
    (0, "x", -0.7, 0.2),
    (1, "    pass\n", -1.1, 0.0),
    (0, "    r = await self.answer(q)\n    return r\n", 0.3, 0.6),
]


@pytest.fixture(scope="module")
def lora_model():
    """The bundled SmolLM2 with a LoRA on q/k/v whose B is random (small), so the adapter changes the
    prompt's keys and values and every LoRA matrix gets a gradient."""
    from peft import LoraConfig, get_peft_model

    from spogw_dagster.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer("smollm2")
    torch.manual_seed(0)
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj"]))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0.0, 0.02)
    for n, p in model.named_parameters():
        p.requires_grad_("lora_" in n)
    model.train()
    return model, tok


def _items(tok) -> list[Item]:
    prompt_ids = [tok(p)["input_ids"] for p in PROMPTS]
    assert len(prompt_ids[0]) != len(prompt_ids[1])  # the shorter prompt is left-padded
    items = []
    for i, (p, c, adv, score) in enumerate(ROWS):
        items.append(Item(i, prompt_ids[p], tok(c, add_special_tokens=False)["input_ids"], adv, score, group=p))
    assert len({len(x.completion_ids) for x in items}) >= 3 and min(len(x.completion_ids) for x in items) == 1
    return items


def _with_old_and_ref(model, items, pad_id):
    """π_old and π_ref near π_θ but not equal, so ratios differ from 1 (some clipped) and the KL is nonzero."""
    with torch.no_grad():
        b = build_completion_batch([x.prompt_ids for x in items], [x.completion_ids for x in items], pad_id)
        lp = completion_logprobs(model, b)
    g = torch.Generator().manual_seed(1)
    for j, x in enumerate(items):
        n = len(x.completion_ids)
        x.old = (lp[j, :n] + 0.3 * torch.randn(n, generator=g, dtype=lp.dtype)).tolist()
        x.ref = (lp[j, :n] + 0.2 * torch.randn(n, generator=g, dtype=lp.dtype)).tolist()
    return items


def _lora_params(model) -> dict[str, torch.Tensor]:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def _forward(model, items, pad_id, shared: bool):
    cfg = TrainConfig(shared_prompt=shared)
    logp, batch = micro_batch_logprobs(model, items, cfg, pad_id, torch.device("cpu"))
    return logp, batch.completion_mask


@pytest.fixture(scope="module")
def forwards(lora_model):
    """One float32 forward per path (the graphs kept), so each objective only adds its loss and a backward."""
    model, tok = lora_model
    items = _with_old_and_ref(model, _items(tok), tok.pad_token_id)
    return model, items, {shared: _forward(model, items, tok.pad_token_id, shared) for shared in (False, True)}


def _loss_grads(model, items, objective: str, logp, mask):
    cfg = TrainConfig(objective=objective, beta=0.1, clip_eps=0.2)
    res = micro_batch_objective(items, cfg, logp, mask, torch.device("cpu"))
    params = _lora_params(model)
    grads = torch.autograd.grad(res.loss, list(params.values()), retain_graph=True)
    return float(res.loss.detach()), dict(zip(params, grads))


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[n] - b[n]).abs().max()) for n in a)


def _max_abs(grads: dict[str, torch.Tensor]) -> float:
    assert len(grads) == 30 * 3 * 2  # A and B of q, k, v in all 30 layers
    assert all(float(g.abs().max()) > 0 for g in grads.values())  # every LoRA matrix gets a gradient
    return max(float(g.abs().max()) for g in grads.values())


# float32: loss and log-probs within 1e-5 (log-probs relative to their size, |log p| reaches ~15 here);
# gradients within 3e-4 of their scale, the level at which the per-row path disagrees with itself when the same
# rows are batched differently (test_float32_noise_floor_of_the_per_row_path). That it is rounding only is
# shown in float64 (test_shared_prompt_is_the_same_function_in_float64).
LOSS_TOL, LOGP_TOL, GRAD_TOL = 1e-5, 1e-5, 3e-4


@pytest.mark.model
@pytest.mark.parametrize("objective", OBJECTIVES)
def test_shared_prompt_equals_per_row(forwards, objective):
    model, items, out = forwards
    (lp_rows, mask_rows), (lp_shared, mask_shared) = out[False], out[True]
    loss_rows, g_rows = _loss_grads(model, items, objective, lp_rows, mask_rows)
    loss_shared, g_shared = _loss_grads(model, items, objective, lp_shared, mask_shared)

    assert torch.equal(mask_rows, mask_shared)
    assert loss_rows != 0.0
    assert abs(loss_shared - loss_rows) <= LOSS_TOL * max(1.0, abs(loss_rows))
    assert torch.allclose(lp_shared, lp_rows, rtol=LOGP_TOL, atol=LOGP_TOL), (lp_shared - lp_rows).abs().max()
    scale, worst = _max_abs(g_rows), _max_diff(g_shared, g_rows)
    print(f"{objective}: |Δloss| {abs(loss_shared - loss_rows):.2e}, max|Δlogp| "
          f"{float((lp_shared - lp_rows).abs().max()):.2e}, max|Δgrad| {worst:.2e} (max|grad| {scale:.2e})")
    assert worst <= GRAD_TOL * scale


@pytest.mark.model
def test_shared_prompt_is_the_same_function_in_float64(lora_model):
    """In float64 the log-probs agree to ~1e-14, and so does their vector-Jacobian product with a random
    cotangent (which every objective's gradient is, with its own cotangent) up to ~3e-7 of its scale: that
    much comes from LlamaRMSNorm, which upcasts to float32 inside and rounds differently for differently
    shaped inputs."""
    model, tok = lora_model
    model = copy.deepcopy(model).to(torch.float64)
    items = _items(tok)
    weights = torch.randn(len(items), max(len(x.completion_ids) for x in items), generator=torch.Generator().manual_seed(2),
                          dtype=torch.float64)
    params = _lora_params(model)
    res = {}
    for shared in (False, True):
        logp, _ = _forward(model, items, tok.pad_token_id, shared)
        assert logp.dtype == torch.float64
        grads = torch.autograd.grad((logp * weights).sum(), list(params.values()))
        res[shared] = (logp.detach(), dict(zip(params, grads)))
    (lp_rows, g_rows), (lp_shared, g_shared) = res[False], res[True]
    assert float((lp_shared - lp_rows).abs().max()) <= 1e-10
    assert _max_diff(g_shared, g_rows) <= 1e-6 * _max_abs(g_rows)


@pytest.mark.model
def test_float32_noise_floor_of_the_per_row_path(lora_model):
    """The reference itself moves by ~1e-4 of the gradient scale in float32 when the same rows are batched
    one by one instead of together: a tighter gradient tolerance would test BLAS blocking, not our code."""
    model, tok = lora_model
    items = _items(tok)[:3]
    cfg = TrainConfig(objective="rwr", shared_prompt=False)

    def grads(batches):
        loss = 0.0
        for mb in batches:
            logp, b = micro_batch_logprobs(model, mb, cfg, tok.pad_token_id, torch.device("cpu"))
            res = micro_batch_objective(mb, cfg, logp, b.completion_mask, torch.device("cpu"))
            loss = loss + res.loss * len(mb) / len(items)
        params = _lora_params(model)
        return dict(zip(params, torch.autograd.grad(loss, list(params.values()))))

    together, alone = grads([items]), grads([[x] for x in items])
    scale = max(float(g.abs().max()) for g in together.values())
    worst = max(float((together[n] - alone[n]).abs().max()) for n in together)
    assert 1e-7 * scale < worst < GRAD_TOL * scale


def _full_logits_logprobs(model, batch, T: float) -> torch.Tensor:
    """The convention computed the plain way, every logit at once: log softmax(logits / T)[token], per row."""
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids,
                use_cache=False)
    logits = out.logits[:, -(batch.completion_len + 1):-1, :].float() / T
    lp = torch.log_softmax(logits, dim=-1).gather(-1, batch.completion_ids.unsqueeze(-1)).squeeze(-1)
    return lp * batch.completion_mask


@pytest.mark.model
@pytest.mark.parametrize("shared", [False, True])
def test_logits_taken_in_chunks_give_the_full_logits_numbers_and_gradients(lora_model, monkeypatch, shared):
    # chunks of 3 positions cut through rows (completions of 1 to ~12 tokens): each chunk's logits are recomputed
    # in the backward pass, yet log-probs and LoRA gradients are those of the whole [B, C, V] logits
    from spogw_dagster.core.training import logprobs as lpm

    model, tok = lora_model
    items = _items(tok)
    prompts, completions = [x.prompt_ids for x in items], [x.completion_ids for x in items]
    T = 0.7
    ref = _full_logits_logprobs(model, build_completion_batch(prompts, completions, tok.pad_token_id), T)
    g_ref = dict(zip(_lora_params(model), torch.autograd.grad(ref.sum(), list(_lora_params(model).values()))))
    monkeypatch.setattr(lpm, "LOGIT_CHUNK", 3)
    got = completion_logprobs(model, lpm.build_batch(prompts, completions, tok.pad_token_id, shared), T)
    g_got = dict(zip(_lora_params(model), torch.autograd.grad(got.sum(), list(_lora_params(model).values()))))
    assert torch.allclose(got, ref, rtol=LOGP_TOL, atol=LOGP_TOL), (got - ref).abs().max()
    assert _max_diff(g_got, g_ref) <= GRAD_TOL * _max_abs(g_ref)
