"""Teacher-forced per-token log-probs of completions, shared by the sampler (tests) and the trainer.

Convention (the one place it is defined): the log-prob of a completion token is

    log softmax(logits / T)[token]

with T the *sampling temperature* (T = 1 for greedy decoding), taken **before** any top-p/top-k
truncation. It is exactly the log-prob of the distribution we sampled from when top_p = 1 (our
default), and it is what the trainer computes for π_θ, π_old and π_ref of the GRPO family, so the ratio
π_θ/π_old is 1 at the start of training. The trainer passes T = `TrainConfig.logprob_T`
(`ObjectiveConfig.logprob_temperature`): the sampling temperature for spogw / grpo / grpo_nokl, 1 for
score_dpo and rwr, which score at T = 1 as ScoreFlow (TRL DPO) and W4S do.

Two layouts give the same numbers (the same model function; fp32 rounding differs by ~1e-5):

* per row (`CompletionBatch`): every row is ``[left pads][prompt][completion][right pads]`` with all
  completions starting at the same column P (the longest prompt). Only the completion span goes through the
  LM head, LOGIT_CHUNK positions at a time, so no [B, C, V] logits tensor is ever whole. Position ids are computed
  from the attention mask, so the left pads do not shift positions.
* shared prompt (`SharedPromptBatch`): the m rows sampled for one query share its prompt, so each distinct
  prompt runs once (left-padded, ``[U, Lp]``); its KV cache is indexed out to the rows that continue it and
  only the completion tokens run per row (``[B, C - 1]``: the last token predicts nothing). The prompt's
  last logits predict each row's first completion token. Gradients flow through the prompt forward and the
  index, so LoRA weights that change the prompt's keys and values get their full gradient. For ~600-token
  prompts and ~60-token workflows this does ~m times less work on the prompt.

`completion_logprobs` accepts either batch; `build_batch(..., shared_prompt=)` picks the layout.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.utils.checkpoint


@dataclass
class CompletionBatch:
    input_ids: torch.Tensor  # [B, P + C]
    attention_mask: torch.Tensor  # [B, P + C]
    position_ids: torch.Tensor  # [B, P + C]
    completion_ids: torch.Tensor  # [B, C] (pad where mask is 0)
    completion_mask: torch.Tensor  # [B, C] float, 1 on completion tokens
    prompt_len: int  # P
    completion_len: int  # C

    def to(self, device) -> "CompletionBatch":
        return CompletionBatch(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.position_ids.to(device),
            self.completion_ids.to(device),
            self.completion_mask.to(device),
            self.prompt_len,
            self.completion_len,
        )

    @property
    def num_tokens(self) -> int:
        return int(self.attention_mask.sum())


def build_completion_batch(
    prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], pad_id: int
) -> CompletionBatch:
    if len(prompts) != len(completions) or not prompts:
        raise ValueError("need the same, non-zero number of prompts and completions")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token (the first completion token is predicted from it)")
    if any(len(c) == 0 for c in completions):
        raise ValueError("every completion needs at least one token")
    B = len(prompts)
    P = max(len(p) for p in prompts)
    C = max(len(c) for c in completions)
    ids = torch.full((B, P + C), pad_id, dtype=torch.long)
    att = torch.zeros((B, P + C), dtype=torch.long)
    cmask = torch.zeros((B, C), dtype=torch.float32)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        ids[i, P - len(p) : P] = torch.as_tensor(list(p), dtype=torch.long)
        ids[i, P : P + len(c)] = torch.as_tensor(list(c), dtype=torch.long)
        att[i, P - len(p) : P + len(c)] = 1
        cmask[i, : len(c)] = 1.0
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    return CompletionBatch(ids, att, pos, ids[:, P:].clone(), cmask, P, C)


def _at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    """bf16/fp16 logits are upcast for the log-softmax; fp64 stays fp64 (exact comparisons in tests)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """log_softmax(logits)[..., index] without materialising the full log-softmax tensor (at least fp32)."""
    logits = _at_least_fp32(logits)
    picked = logits.gather(-1, index.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


# Positions whose logits exist at once: the output layer and the log-softmax run per chunk (and again per chunk in
# the backward pass), so a micro-batch never holds its [B, C, V] logits: over Qwen's 151,936-token vocabulary
# those (with their float32 copies and gradient) were most of a training step's memory (docs/measurements.md).
LOGIT_CHUNK = 256


# config fields of architectures whose logits are not just the output layer of the last hidden state (Gemma's
# softcapping, Cohere's scale, Granite's scaling): computing them from the body's output would be wrong
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "scale_width")


def _body_and_head(model):
    """The model without its output layer (LoRA layers and a disabled adapter included), and the output layer."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    cfg = getattr(base, "config", None)
    odd = [k for k in _LOGIT_TRANSFORMS if getattr(cfg, k, None) not in (None, 1, 1.0)]
    if odd:
        raise ValueError(f"{type(base).__name__} transforms its logits ({', '.join(odd)}): the trainer's log-probs "
                         "take the output layer of the last hidden state in chunks and would differ from the "
                         "sampler's; fix: use a generator without a logit transform (Llama, Qwen2, Mistral, ...)")
    return getattr(base, base.base_model_prefix), base.get_output_embeddings()


def _token_logprobs(head, hidden: torch.Tensor, targets: torch.Tensor, T: float) -> torch.Tensor:
    """log softmax(head(hidden) / T)[targets] ([B, C, H] hidden states, [B, C] targets), LOGIT_CHUNK positions at
    a time; with gradients, each chunk's logits are recomputed in the backward pass instead of kept."""
    B, C, H = hidden.shape
    if B * C == 0:
        return hidden.new_zeros((B, C), dtype=torch.promote_types(hidden.dtype, torch.float32))
    h, t = hidden.reshape(B * C, H), targets.reshape(B * C)

    def chunk(hh: torch.Tensor, tt: torch.Tensor) -> torch.Tensor:
        logits = head(hh)
        if T != 1.0:
            logits = _at_least_fp32(logits) / T
        return selective_log_softmax(logits, tt)

    keep = torch.is_grad_enabled() and h.requires_grad
    parts = [torch.utils.checkpoint.checkpoint(chunk, h[s:s + LOGIT_CHUNK], t[s:s + LOGIT_CHUNK], use_reentrant=False)
             if keep else chunk(h[s:s + LOGIT_CHUNK], t[s:s + LOGIT_CHUNK]) for s in range(0, B * C, LOGIT_CHUNK)]
    return torch.cat(parts).reshape(B, C)


def completion_logprobs(
    model, batch: "CompletionBatch | SharedPromptBatch", temperature: float = 1.0
) -> torch.Tensor:
    """Per-token log-probs [B, C] of the completion tokens under `model` (0 where the mask is 0).

    Differentiable; wrap in ``torch.no_grad()`` for reference / old log-probs.
    """
    if isinstance(batch, SharedPromptBatch):
        return shared_prompt_logprobs(model, batch, temperature)
    T = _temperature(temperature)
    C = batch.completion_len
    body, head = _body_and_head(model)
    out = body(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
    )
    hidden = out.last_hidden_state[:, -(C + 1):-1, :]  # predictions for columns P .. P+C-1
    return _token_logprobs(head, hidden, batch.completion_ids, T) * batch.completion_mask


def _temperature(temperature: float | None) -> float:
    return float(temperature) if temperature and temperature > 0 else 1.0


# --------------------------------------------------------------------------------------------------
# shared prompt


@dataclass
class SharedPromptBatch:
    prompt_ids: torch.Tensor  # [U, Lp] distinct prompts, left-padded
    prompt_mask: torch.Tensor  # [U, Lp]
    prompt_positions: torch.Tensor  # [U, Lp]
    row_prompt: torch.Tensor  # [B] long: the distinct prompt each row continues
    completion_ids: torch.Tensor  # [B, C] right-padded (pad where mask is 0)
    completion_mask: torch.Tensor  # [B, C] float, 1 on completion tokens
    completion_len: int  # C

    def to(self, device) -> "SharedPromptBatch":
        return SharedPromptBatch(
            self.prompt_ids.to(device),
            self.prompt_mask.to(device),
            self.prompt_positions.to(device),
            self.row_prompt.to(device),
            self.completion_ids.to(device),
            self.completion_mask.to(device),
            self.completion_len,
        )

    @property
    def num_prompts(self) -> int:
        return int(self.prompt_ids.shape[0])

    @property
    def num_tokens(self) -> int:
        """Tokens that go through the model: each distinct prompt once, plus every row's completion."""
        return int(self.prompt_mask.sum() + self.completion_mask.sum())


def distinct_prompts(prompts: Sequence[Sequence[int]]) -> tuple[list[tuple[int, ...]], list[int]]:
    """The distinct prompts in first-seen order, and for each row the index of its prompt."""
    index: dict[tuple[int, ...], int] = {}
    rows = [index.setdefault(tuple(int(t) for t in p), len(index)) for p in prompts]
    return list(index), rows


def build_shared_prompt_batch(
    prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], pad_id: int
) -> SharedPromptBatch:
    """Rows may come in any order and mix prompts; rows with equal prompt token ids share one prompt run."""
    ref = build_completion_batch(prompts, completions, pad_id)  # checks the inputs; gives the completion span
    uniq, rows = distinct_prompts(prompts)
    Lp = max(len(p) for p in uniq)
    ids = torch.full((len(uniq), Lp), pad_id, dtype=torch.long)
    att = torch.zeros((len(uniq), Lp), dtype=torch.long)
    for j, p in enumerate(uniq):
        ids[j, Lp - len(p) :] = torch.as_tensor(p, dtype=torch.long)
        att[j, Lp - len(p) :] = 1
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    row_prompt = torch.as_tensor(rows, dtype=torch.long)
    return SharedPromptBatch(ids, att, pos, row_prompt, ref.completion_ids, ref.completion_mask, ref.completion_len)


def build_batch(
    prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], pad_id: int, shared_prompt: bool = True
) -> "CompletionBatch | SharedPromptBatch":
    if shared_prompt:
        return build_shared_prompt_batch(prompts, completions, pad_id)
    return build_completion_batch(prompts, completions, pad_id)


@functools.lru_cache(maxsize=None)
def _cache_argument_of(model_class: type) -> str:
    """transformers 5.x renamed `past_key_values` to `cache` (the old name works until 5.40)."""
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


def _rows_cache(prompt_cache, row_prompt: torch.Tensor):
    """A cache whose row i holds the keys and values of prompt row_prompt[i] (differentiable index)."""
    from transformers.cache_utils import DynamicCache, DynamicLayer  # heavy: keeps transformers out of the import

    layers = getattr(prompt_cache, "layers", None)
    if layers is None or any(type(layer) is not DynamicLayer for layer in layers):
        kinds = sorted({type(x).__name__ for x in layers or []}) or [type(prompt_cache).__name__]
        raise ValueError(
            f"shared-prompt log-probs need a plain DynamicCache (full attention); this model's cache has {kinds}; "
            "fix: set TrainConfig.shared_prompt=False (per-row forward) for this model"
        )
    return DynamicCache(ddp_cache_data=[(x.keys[row_prompt], x.values[row_prompt]) for x in layers])


def shared_prompt_logprobs(model, batch: SharedPromptBatch, temperature: float = 1.0) -> torch.Tensor:
    """Per-token log-probs [B, C] like `completion_logprobs`, running each distinct prompt once."""
    T = _temperature(temperature)
    body, head = _body_and_head(model)
    cache_arg = _cache_argument_of(type(body))
    idx = batch.row_prompt
    # the prompts, once: their keys/values (with the graph of the LoRA weights) and the last position's state
    out = body(
        input_ids=batch.prompt_ids,
        attention_mask=batch.prompt_mask,
        position_ids=batch.prompt_positions,
        use_cache=True,
    )
    prompt_cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
    hidden = out.last_hidden_state[idx, -1:, :]  # [B, 1, H]: predicts each row's first completion token
    C = batch.completion_len
    if C > 1:  # the completions, per row, on top of their prompt's cache (the last token predicts nothing)
        tail = batch.completion_ids[:, : C - 1]
        attention = torch.cat([batch.prompt_mask[idx], batch.completion_mask[:, : C - 1].to(torch.long)], dim=1)
        start = batch.prompt_mask.sum(-1)[idx].unsqueeze(-1)  # each prompt's length = first completion position
        positions = start + torch.arange(C - 1, device=tail.device).unsqueeze(0)
        out = body(
            input_ids=tail,
            attention_mask=attention,
            position_ids=positions,
            use_cache=True,
            **{cache_arg: _rows_cache(prompt_cache, idx)},
        )
        hidden = torch.cat([hidden, out.last_hidden_state], dim=1)  # [B, C, H]
    return _token_logprobs(head, hidden, batch.completion_ids, T) * batch.completion_mask


# --------------------------------------------------------------------------------------------------
# scoring


@torch.no_grad()
def score_completions(
    model,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    pad_id: int,
    temperature: float = 1.0,
    batch_size: int = 8,
    shared_prompt: bool = True,
) -> list[list[float]]:
    """Teacher-forced log-probs of each completion's tokens, as Python lists (no grad, batched), in input order.

    With `shared_prompt`, rows are batched by prompt (each distinct prompt runs once per batch)."""
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions; give one prompt per completion")
    device = next(model.parameters()).device
    order = rows_by_prompt(prompts) if shared_prompt else list(range(len(prompts)))
    out: list[list[float] | None] = [None] * len(prompts)
    for s in range(0, len(order), batch_size):
        rows = order[s : s + batch_size]
        b = build_batch([prompts[i] for i in rows], [completions[i] for i in rows], pad_id, shared_prompt)
        lp = completion_logprobs(model, b.to(device), temperature).cpu()
        for j, i in enumerate(rows):
            out[i] = lp[j, : len(completions[i])].tolist()
    return out  # type: ignore[return-value]


def rows_by_prompt(prompts: Sequence[Sequence[int]]) -> list[int]:
    """Row indices with rows of one prompt next to each other (prompts in first-seen order, rows in input order)."""
    _, rows = distinct_prompts(prompts)
    return sorted(range(len(prompts)), key=lambda i: rows[i])
