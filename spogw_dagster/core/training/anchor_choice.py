"""Whether the policy has taken the anchors' verdict: the stop of `TrainConfig.anchor_stop`.

The anchors are the prompt's own workflows, scored on every training query (`generator.anchors`); where their
scores differ, the best one should become what greedy decoding writes. Greedy decides token by token, and two
workflows part at one token (for the anchored code prompt, " solution" against " solutions" on the first line):
a whole-sequence log-prob can favour the best anchor while greedy still opens the other (measured on validation,
docs/experiments.md). So the test here is that token: at the first position where the best anchor's completion
departs from a lower-scored anchor's, given the prompt and their shared prefix, the policy's logit of the best
one's token is the higher, by more than a margin (`TrainConfig.anchor_stop_margin`, nats; the training prompts are
the anchors' own, so a margin there is what carries the choice to prompts it never trained on). A query is decided
when that holds against every lower anchor.

Why a stop: how far a fixed number of steps moves that token depends on the seed's own samples (their groups
pull the same token the other way with a mass that differs from seed to seed), so one anchor weight crossed on
one seed, stopped short on another and overshot on a third. Training until the verdict is taken, and no further,
is the same target for every seed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import torch


@dataclass(frozen=True)
class Decision:
    """One deciding token: in `group`, after `context` (prompt + shared completion prefix), `win` should beat
    `lose`."""

    group: Any
    context: tuple[int, ...]
    win: int
    lose: int


def deciding_tokens(items: Sequence[Any], tol: float = 1e-9) -> list[Decision]:
    """The decisions of the anchors (off-policy rows) of each group whose advantages differ: the best row against
    each lower one, at their first differing completion token. A pair where one completion is a prefix of the
    other has no such token and is skipped (no group of the anchored prompts has one). `items` are the trainer's
    tokenized rows (`batching.Item`: prompt_ids, completion_ids, advantage, group, off_policy), one per group
    member (not the unique-workflow rows, which merge members of several groups)."""
    groups: dict[Any, list[Any]] = {}
    for it in items:
        if it.off_policy:
            groups.setdefault(it.group, []).append(it)
    out = []
    for g, rows in groups.items():
        best = max(rows, key=lambda r: r.advantage)  # the first of equals: rows keep their data order
        for r in rows:
            if r.advantage >= best.advantage - tol:
                continue
            i = next((k for k, (a, b) in enumerate(zip(best.completion_ids, r.completion_ids)) if a != b), None)
            if i is None:
                continue
            out.append(Decision(g, tuple(best.prompt_ids) + tuple(best.completion_ids[:i]),
                                int(best.completion_ids[i]), int(r.completion_ids[i])))
    return out


def group_gaps(decisions: Sequence[Decision], next_logits: dict[tuple[int, ...], torch.Tensor]) -> dict[Any, float]:
    """Per group: the smallest logit gap (best anchor's token minus a lower anchor's) over its decisions, given
    `next_logits` (context -> the logits of the token after it)."""
    out: dict[Any, float] = {}
    for d in decisions:
        logits = next_logits[d.context]
        gap = float(logits[d.win] - logits[d.lose])
        out[d.group] = min(out.get(d.group, gap), gap)
    return out


def decided_groups(decisions: Sequence[Decision], next_logits: dict[tuple[int, ...], torch.Tensor],
                   margin: float = 0.0) -> dict[Any, bool]:
    """Per group: whether every one of its decisions holds by more than `margin` nats. Ties count as not decided:
    greedy would not reliably pick the best anchor's token."""
    return {g: gap > margin for g, gap in group_gaps(decisions, next_logits).items()}


@torch.no_grad()
def next_token_logits(model, contexts: Sequence[tuple[int, ...]], device) -> dict[tuple[int, ...], torch.Tensor]:
    """The model's logits for the token after each distinct context (one forward each: a handful per check)."""
    was_training = model.training
    model.eval()  # no dropout mask: the check draws no random numbers, so training after it is unchanged
    out = {}
    try:
        for c in dict.fromkeys(contexts):
            x = torch.tensor([list(c)], device=device)
            out[c] = model(input_ids=x).logits[0, -1].float().cpu()
    finally:
        model.train(was_training)
    return out


def decided_share(model, decisions: Sequence[Decision], device, margin: float = 0.0) -> tuple[float, int, float]:
    """(share of the groups with decisions that are decided by more than `margin`, number of such groups, their
    mean smallest gap) under `model`."""
    if not decisions:
        return 0.0, 0, 0.0
    logits = next_token_logits(model, [d.context for d in decisions], device)
    gaps, decided = group_gaps(decisions, logits), decided_groups(decisions, logits, margin)
    return sum(decided.values()) / len(decided), len(decided), sum(gaps.values()) / len(gaps)


def anchor_decisions(items: list[Any], cfg, progress: Callable[[str], None] | None = None) -> tuple[list[Any], list[Decision]]:
    """(the rows to batch, their decisions) under `cfg` (a `TrainConfig`): no decisions while `anchor_stop` is off.
    Under the `clipped` loss the anchors' off-policy mark only found them: it is dropped, so they merge and batch
    exactly as in a run without the stop."""
    if cfg.anchor_stop is None:
        return items, []
    decisions = deciding_tokens(items)
    if cfg.off_policy_loss == "clipped":
        items = [replace(it, off_policy=False) for it in items]
    if not decisions and progress is not None:
        progress("anchor_stop: no group has anchors that score differently; training every epoch")
    return items, decisions


def stop_when_decided(model, decisions: Sequence[Decision], cfg, device, dist) -> Callable[[dict[str, Any]], bool] | None:
    """The `optimize` stop of `cfg.anchor_stop` (None when there is nothing to decide): it records the check in the
    step's record and says whether the share decided reaches `anchor_stop`."""
    if not decisions:
        return None

    def decided(step: dict[str, Any]) -> bool:
        share, groups, gap = decided_share(model, decisions, device, cfg.anchor_stop_margin)
        step.update(anchor_decided=round(share, 6), anchor_groups=groups, anchor_gap=round(gap, 6))
        # the ranks hold the same weights, but a near tie could fall apart on different kernels: any rank's stop
        # stops all (a rank that left the loop alone would hang the others' next all-reduce)
        return dist.sum_numbers({"stop": float(share >= cfg.anchor_stop)})["stop"] > 0

    return decided
