"""The forward passes: the device, which forward path it takes (shared prompt or per row), the no-grad
π_old / π_ref / after-training passes, and one micro-batch's log-probs and objective."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Sequence

import torch

from spogw_dagster.core.device_paths import shared_prompt_for
from spogw_dagster.core.training.batching import Item, explicit_pairs, group_ids, pad_lists
from spogw_dagster.core.training.config import TrainConfig
from spogw_dagster.core.training.distributed import SINGLE, Dist
from spogw_dagster.core.training.logprobs import build_batch, completion_logprobs, rows_by_prompt
from spogw_dagster.core.training.objectives import LossBatch, compute_loss


def precompute(model, items: list[Item], pad_id: int, cfg: TrainConfig, device, attr: str, disable_adapter: bool,
                dist: Dist = SINGLE) -> None:
    """No-grad per-token log-probs of every item into `item.<attr>`, batch_size rows at a time (rows of one
    prompt together when shared_prompt, else rows of similar length together). Across processes each rank
    runs its share of the batches and every rank gets all rows' numbers."""



    ctx = model.disable_adapter() if disable_adapter else contextlib.nullcontext()
    bs = max(cfg.batch_size, 1)
    shared = shared_path(cfg, device)
    if shared:
        by_length = sorted(items, key=lambda x: len(x.prompt_ids))  # similar prompt lengths pad less
        order = [by_length[i] for i in rows_by_prompt([x.prompt_ids for x in by_length])]
    else:
        order = sorted(items, key=lambda x: len(x.prompt_ids) + len(x.completion_ids))
    chunks = [order[s : s + bs] for s in range(0, len(order), bs)]
    mine: dict[int, list[float]] = {}
    with torch.no_grad(), ctx:
        for chunk in dist.shard(chunks):
            b = build_batch([x.prompt_ids for x in chunk], [x.completion_ids for x in chunk], pad_id, shared)
            lp = completion_logprobs(model, b.to(device), cfg.logprob_T).cpu()
            for j, x in enumerate(chunk):
                mine[x.idx] = lp[j, : len(x.completion_ids)].tolist()
    got = {i: v for part in dist.gather(mine) for i, v in part.items()}
    for x in items:
        setattr(x, attr, got[x.idx])


def shared_path(cfg: TrainConfig, device) -> bool:
    """`cfg.shared_prompt`, or where it is None the path measured faster on `device` (core/device_paths.py)."""
    return shared_prompt_for(str(getattr(device, "type", device)), cfg.shared_prompt)  # "cuda:1" reads as cuda


def micro_batch_logprobs(model, mb: Sequence[Item], cfg: TrainConfig, pad_id: int, device):
    """Per-token log-probs [B, C] of the micro-batch's completions under `model`, and the batch.

    `cfg.shared_prompt` picks the forward (each distinct prompt once, or every row's prompt again); both give
    the same log-probs, loss and gradients up to float rounding (tests/test_trainer_shared_prompt.py)."""

    b = build_batch([x.prompt_ids for x in mb], [x.completion_ids for x in mb], pad_id, shared_path(cfg, device))
    b = b.to(device)
    return completion_logprobs(model, b, cfg.logprob_T), b


def micro_batch_objective(mb: Sequence[Item], cfg: TrainConfig, logp, mask, device):
    """The objective on one micro-batch, given its policy log-probs and completion mask. `cfg` is the loss's
    config itself (a TrainConfig is an ObjectiveConfig), so β and the other loss fields reach it unchanged."""


    C = logp.shape[1]
    dt = torch.promote_types(logp.dtype, torch.float32)  # float32 (float64 in the exactness tests)

    def col(vals):
        return torch.tensor(vals, dtype=dt, device=device)

    lb = LossBatch(
        logp=logp,
        mask=mask,
        old_logp=pad_lists([x.old for x in mb], C, dt).to(device) if cfg.needs_old else None,
        ref_logp=pad_lists([x.ref for x in mb], C, dt).to(device) if cfg.needs_ref else None,
        advantages=col([x.advantage for x in mb]),
        scores=col([x.score if x.score is not None else 0.0 for x in mb]),
        group_ids=group_ids(mb),
        pairs=explicit_pairs(mb) if cfg.spec.data == "pairs" else None,
        off_policy=(torch.tensor([x.off_policy for x in mb], dtype=torch.bool, device=device)
                    if any(x.off_policy for x in mb) else None),
    )
    if any(x.members is not None for x in mb):  # unique-workflow rows (`aggregate`)
        lb.adv_pos, lb.adv_neg = col([x.adv_pos for x in mb]), col([x.adv_neg for x in mb])
        lb.n_pos, lb.n_neg, lb.count = col([x.n_pos for x in mb]), col([x.n_neg for x in mb]), col([x.count for x in mb])
    return compute_loss(cfg.objective, lb, cfg)


def device_for(cfg: TrainConfig, dist: Dist = SINGLE):
    """The configured device; with several processes on CUDA, the GPU the launcher gave this process."""

    dev = torch.device(cfg.device if cfg.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cuda" and dist.world > 1:
        return torch.device(dist.device)  # the GPU accelerate set for this process (NCCL uses the same)
    return dev


def reference_passes(model, items: list[Item], prev: Path | None, cfg: TrainConfig, pad_id: int, device,
                      dist: Dist = SINGLE):
    """π_old and π_ref under no_grad, with the policy that produced the data (the previous adapter loaded as a
    frozen adapter named "previous"). Fills each item's `old` / `ref`; returns the (possibly wrapped) model."""
    from peft import PeftModel  # heavy: keeps peft out of this module's import

    if prev is not None:
        model = PeftModel.from_pretrained(model, str(prev), adapter_name="previous", is_trainable=False)
        model.to(device)
    model.eval()
    need_old = cfg.needs_old and cfg.old_logprobs == "recompute"
    if need_old:  # π_old = π_k−1: the previous adapter active (or the plain base model)
        precompute(model, items, pad_id, cfg, device, "old", disable_adapter=False, dist=dist)
    if cfg.needs_ref:
        if cfg.ref_mode == "previous" or prev is None:  # π_ref = π_k−1 (without a previous adapter: the base)
            if need_old:
                for it in items:
                    it.ref = it.old
            else:
                precompute(model, items, pad_id, cfg, device, "ref", disable_adapter=False, dist=dist)
        else:  # π_ref = base: the previous adapter disabled
            precompute(model, items, pad_id, cfg, device, "ref", disable_adapter=True, dist=dist)
    if cfg.needs_ref and any(it.ref is None for it in items):  # pragma: no cover - internal consistency
        raise RuntimeError("reference log-probs missing after precompute")
    return model


def log_prob_shift(model, items: list[Item], cfg: TrainConfig, pad_id: int, device,
                    all_items: list[Item] | None = None, dist: Dist = SINGLE):
    """One more no-grad pass: each example's mean log-prob before and after training, and the mean change for
    positive- and negative-advantage rows. Returns (per-example rows, summary entries). `items` are the rows
    trained on; with unique-workflow rows, `all_items` are the examples they stand for (one entry each)."""
    model.eval()
    precompute(model, items, pad_id, cfg, device, "final", disable_adapter=False, dist=dist)
    if all_items is not None and all_items is not items:
        by_idx = {it.idx: it for it in all_items}
        for u in items:
            for i in u.members or [u.idx]:
                by_idx[i].old, by_idx[i].ref, by_idx[i].final = u.old, u.ref, u.final
        items = all_items
    per_example: list[dict[str, Any]] = []
    for it in items:
        start = it.old if it.old is not None else it.ref
        per_example.append({
            "index": it.idx,
            "advantage": it.advantage,
            "tokens": len(it.completion_ids),
            "mean_logp_before": (sum(start) / len(start)) if start is not None else None,
            "mean_logp_after": sum(it.final) / len(it.final),
        })
    moved: dict[str, Any] = {}
    for name, sel in (("positive", lambda a: a > 0), ("negative", lambda a: a < 0)):
        rows = [r for r in per_example if sel(r["advantage"]) and r["mean_logp_before"] is not None]
        if rows:
            moved[f"delta_mean_logp_{name}"] = round(
                sum(r["mean_logp_after"] - r["mean_logp_before"] for r in rows) / len(rows), 6
            )
    return per_example, moved

