"""From examples to micro-batches: tokenizing exactly as the sampler did, unique-workflow rows, ScoreFlow's
explicit pairs, and the seeded micro-batches that keep a prompt's rows together."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Sequence

import torch

from spogw_dagster.core.training.config import TrainConfig
from spogw_dagster.core.training.examples import TrainExample
from spogw_dagster.core.training.objectives import unique_advantage_weights
from spogw_dagster.seeds import offset_seed


@dataclass
class Item:
    idx: int
    prompt_ids: list[int]
    completion_ids: list[int]
    advantage: float
    score: float | None
    group: Any
    old: list[float] | None = None
    ref: list[float] | None = None
    final: list[float] | None = None
    role: str | None = None
    off_policy: bool = False
    # a unique-workflow row (`aggregate`): the indices of the items it stands for and its weights
    members: list[int] | None = None
    adv_pos: float = 0.0
    adv_neg: float = 0.0
    n_pos: int = 0
    n_neg: int = 0
    count: int = 1


def aggregate(items: list[Item]) -> list[Item]:
    """One row per distinct (prompt tokens, completion tokens, recorded π_old) in first-seen order, carrying
    (A⁺, A⁻, n⁺, n⁻, count) of the rows it stands for (`objectives.unique_advantage_weights`); its `advantage`
    is A⁺ + A⁻ (the sum, for display). π_old from data is part of the key, so rows are merged only when their
    loss terms are the same function of the policy (and an off-policy row never merges with a sample)."""


    by_key: dict[tuple, list[Item]] = {}
    for it in items:
        key = (tuple(it.prompt_ids), tuple(it.completion_ids), None if it.old is None else tuple(it.old),
               it.off_policy)
        by_key.setdefault(key, []).append(it)
    out = []
    for rows in by_key.values():
        a_pos, a_neg, n_pos, n_neg, count = unique_advantage_weights([r.advantage for r in rows])
        out.append(replace(rows[0], advantage=a_pos + a_neg, members=[r.idx for r in rows], adv_pos=a_pos,
                           adv_neg=a_neg, n_pos=n_pos, n_neg=n_neg, count=count))
    return out


def tokenize(examples: Sequence[TrainExample], tok, cfg: TrainConfig) -> list[Item]:
    items = []
    for i, e in enumerate(examples):
        if e.prompt_token_ids is not None:
            p = [int(t) for t in e.prompt_token_ids]
        else:
            p = list(tok(e.prompt)["input_ids"])
        if e.completion_token_ids is not None:
            c = [int(t) for t in e.completion_token_ids]
        else:
            c = list(tok(e.completion, add_special_tokens=False)["input_ids"])
        if not p:
            raise ValueError(f"example {i}: the prompt has no tokens; every response needs a non-empty prompt")
        if not c:
            raise ValueError(f"example {i}: the completion has no tokens; drop empty responses before training")
        if not math.isfinite(float(e.advantage)):
            raise ValueError(f"example {i}: advantage {e.advantage!r} is not finite")
        old = None
        if cfg.needs_old and cfg.old_logprobs == "data":
            if e.old_logprobs is None:
                raise ValueError(
                    f"example {i} has no old_logprobs but TrainConfig.old_logprobs='data'; fix: record the "
                    "sampler's logprobs, or set old_logprobs='recompute'"
                )
            if e.completion_token_ids is None:
                raise ValueError(
                    f"example {i}: old_logprobs from data need completion_token_ids (re-tokenizing the text "
                    "may not give the sampled tokens); fix: pass the sampler's token_ids, or recompute"
                )
            if len(e.old_logprobs) != len(c):
                raise ValueError(
                    f"example {i}: {len(e.old_logprobs)} old_logprobs for {len(c)} completion tokens"
                )
            old = [float(v) for v in e.old_logprobs]
        if cfg.spec.uses_scores:
            if e.score is None or not math.isfinite(float(e.score)):
                raise ValueError(f"example {i}: objective {cfg.objective!r} needs a finite score")
        if cfg.max_completion_tokens is not None and len(c) > cfg.max_completion_tokens:
            c = c[: cfg.max_completion_tokens]
            old = old[: cfg.max_completion_tokens] if old is not None else None
        items.append(
            Item(i, p, c, float(e.advantage), None if e.score is None else float(e.score), e.group_id, old,
                  role=e.role, off_policy=bool(e.off_policy))
        )
    if cfg.spec.data == "pairs":
        check_pairs(items)
    return items


def check_pairs(items: Sequence[Item]) -> None:
    """score_dpo trains on explicit pairs: every row is "chosen" or "rejected", and each group_id holds one
    of each (the pair), chosen with the higher score."""
    pairs: dict[Any, dict[str, Item]] = {}
    for it in items:
        if it.role not in ("chosen", "rejected") or it.group is None:
            raise ValueError(
                f"example {it.idx}: score_dpo trains on explicit (chosen, rejected) pairs; every example needs "
                f"role 'chosen' or 'rejected' and a group_id shared with its pair (got role={it.role!r}, "
                f"group_id={it.group!r}); fix: build them with pipeline.data.training_inputs.score_dpo_training_data "
                "(ScoreFlow's pairs from core.curation.sample_preference_pairs)"
            )
        if it.role in pairs.setdefault(it.group, {}):
            raise ValueError(f"pair {it.group!r} has two {it.role!r} rows; a pair is one chosen and one rejected row")
        pairs[it.group][it.role] = it
    for gid, p in pairs.items():
        if len(p) != 2:
            raise ValueError(f"pair {gid!r} has only a {next(iter(p))!r} row; a pair is one chosen and one rejected row")
        if not p["chosen"].score > p["rejected"].score:  # type: ignore[operator]
            raise ValueError(f"pair {gid!r}: the chosen score {p['chosen'].score} must exceed the rejected "
                             f"{p['rejected'].score} (ScoreFlow drops ties)")


def micro_batches(items: list[Item], cfg: TrainConfig, epoch: int) -> list[list[Item]]:
    """Micro-batches for one epoch, in a seeded order, with the rows of one prompt next to each other.

    The prompts are shuffled (seeded by cfg.seed and the epoch), then the rows of each prompt; the sequence is
    cut into micro-batches of batch_size rows. A micro-batch thus holds one prompt's rows, or the tail of one
    prompt and the head of the next, never more than batch_size rows (bounded memory), and the shared-prompt
    forward runs each prompt once per micro-batch. The same batches feed both forward paths, so
    ``shared_prompt`` changes only how a batch is computed. An objective trained on pairs (score_dpo) shuffles
    whole groups (a pair is the two rows of one group_id) and keeps each group in one micro-batch; a group larger than batch_size is a
    micro-batch of its own."""

    g = torch.Generator().manual_seed(offset_seed(cfg.seed, epoch))
    if cfg.spec.data != "pairs":
        units = [[it] for it in items]
    else:
        groups: dict[Any, list[Item]] = {}
        for it in items:
            groups.setdefault(it.group if it.group is not None else "__all__", []).append(it)
        units = list(groups.values())
    by_prompt: dict[tuple[int, ...], list[list[Item]]] = {}
    for u in units:
        by_prompt.setdefault(tuple(u[0].prompt_ids), []).append(u)
    prompts = list(by_prompt.values())
    ordered: list[list[Item]] = []
    for i in torch.randperm(len(prompts), generator=g).tolist():
        ordered += [prompts[i][j] for j in torch.randperm(len(prompts[i]), generator=g).tolist()]
    if cfg.spec.data != "pairs":
        rows = [u[0] for u in ordered]
        return [rows[s : s + cfg.batch_size] for s in range(0, len(rows), cfg.batch_size)]
    out: list[list[Item]] = []
    cur: list[Item] = []
    for grp in ordered:
        if cur and len(cur) + len(grp) > cfg.batch_size:
            out.append(cur)
            cur = []
        cur = cur + grp
    if cur:
        out.append(cur)
    return out


def explicit_pairs(mb: Sequence[Item]):
    """[P, 2] (chosen row, rejected row) of the micro-batch's pairs (rows with a role, paired by group_id), in
    order of first appearance; None when the rows carry no roles (the loss then draws pairs in the batch)."""

    if all(x.role is None for x in mb):
        return None
    by_pair: dict[str, dict[str, int]] = {}
    for j, x in enumerate(mb):
        if x.role not in ("chosen", "rejected"):
            raise ValueError(f"row {x.idx}: role {x.role!r}; score_dpo rows are 'chosen' or 'rejected'")
        by_pair.setdefault(repr(x.group), {})[x.role] = j
    bad = [g for g, p in by_pair.items() if len(p) != 2]
    if bad:  # pragma: no cover - micro_batches keeps a group in one micro-batch, check_pairs checks the groups
        raise RuntimeError(f"pair(s) {bad} split across micro-batches")
    return torch.tensor([[p["chosen"], p["rejected"]] for p in by_pair.values()], dtype=torch.long)


def group_ids(mb: Sequence[Item]):
    """Stable small ints for the batch's group ids (Python's str hash is salted per process)."""

    seen: dict[str, int] = {}
    return torch.tensor([seen.setdefault(repr(x.group), len(seen)) for x in mb], dtype=torch.long)


def pad_lists(rows: Sequence[Sequence[float]], width: int, dtype=None):

    dtype = dtype or torch.float32
    t = torch.zeros((len(rows), width), dtype=dtype)
    for i, r in enumerate(rows):
        t[i, : len(r)] = torch.as_tensor(list(r), dtype=dtype)
    return t

