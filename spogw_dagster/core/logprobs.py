"""Teacher-forced per-token log-probs of completions, shared by the sampler (tests) and the trainer.

Convention (the one place it is defined): the log-prob of a completion token is

    log softmax(logits / T)[token]

with T the *sampling temperature* (T = 1 for greedy decoding), taken **before** any top-p/top-k
truncation. It is exactly the log-prob of the distribution we sampled from when top_p = 1 (our
default), and it is what the trainer computes for π_θ, π_old and π_ref, so the ratio π_θ/π_old is 1
at the start of training.

Batch layout: every row is ``[left pads][prompt][completion][right pads]`` with all completions
starting at the same column P (the longest prompt). Only the completion span goes through the LM head
(``logits_to_keep``), which keeps the [B, T, V] logits tensor small. Position ids are computed from the
attention mask, so the left pads do not shift positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


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


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """log_softmax(logits)[..., index] without materialising the full log-softmax tensor."""
    logits = logits.float()
    picked = logits.gather(-1, index.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def completion_logprobs(model, batch: CompletionBatch, temperature: float = 1.0) -> torch.Tensor:
    """Per-token log-probs [B, C] of the completion tokens under `model` (0 where the mask is 0).

    Differentiable; wrap in ``torch.no_grad()`` for reference / old log-probs.
    """
    T = float(temperature) if temperature and temperature > 0 else 1.0
    C = batch.completion_len
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
        logits_to_keep=C + 1,
    )
    logits = out.logits[:, :-1, :]  # predictions for columns P .. P+C-1
    if T != 1.0:
        logits = logits.float() / T
    lp = selective_log_softmax(logits, batch.completion_ids)
    return lp * batch.completion_mask


@torch.no_grad()
def score_completions(
    model,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    pad_id: int,
    temperature: float = 1.0,
    batch_size: int = 8,
) -> list[list[float]]:
    """Teacher-forced log-probs of each completion's tokens, as Python lists (no grad, batched)."""
    device = next(model.parameters()).device
    out: list[list[float]] = []
    for s in range(0, len(prompts), batch_size):
        b = build_completion_batch(prompts[s : s + batch_size], completions[s : s + batch_size], pad_id).to(device)
        lp = completion_logprobs(model, b, temperature).cpu()
        for i, c in enumerate(completions[s : s + batch_size]):
            out.append(lp[i, : len(c)].tolist())
    return out
