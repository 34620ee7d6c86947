"""Training objectives of SPOGW and of the baselines it stands beside (the algorithm as docs/algorithm.md specifies it). Pure torch, no model.

Inputs are per-token log-probs of the *sampled workflow tokens* (the caller gathers them from the logits):

    logp        [B, T]  policy π_θ (requires grad)
    old_logp    [B, T]  π_old, the policy that produced the data (None: logp.detach(), i.e. ρ = 1)
    ref_logp    [B, T]  reference π_ref (base model, or π_{k−1}); needed by the KL term and by Score-DPO
    mask        [B, T]  nonzero for workflow tokens, 0 for prompt and padding; every row needs >= 1 such token
    advantages  [B]     Â_i (from curation) for the GRPO family
    scores      [B]     s_i in [0, 1] for score_dpo; the reward r_i for rwr

Values at masked positions are replaced by constants before any arithmetic, so padding may hold anything
(even NaN or inf) and carries no gradient. old_logp and ref_logp are always detached.

Objectives (`compute_loss(name, batch, cfg)` dispatches):

* spogw      ioGRPO + mKL, exactly as specified:
                 ρ = exp(logp − old),  D = exp(ref − logp) − (ref − logp) − 1  (k3),  M_i = 1[Â_i > 0],
                 L_i = −(1/|o_i|) Σ_t [ min(ρ Â_i, clip(ρ, 1−ε_c, 1+ε_c) Â_i) − β M_i D ],  loss = mean_i L_i.
             The mask is strict (Â = 0 gets no KL). |o_i| = number of masked tokens of row i.
             Off-policy rows (`batch.off_policy`, the anchors) by `off_policy_loss`: "clipped" as above; "shaped"
             Â_i · π_θ/(π_θ + γ), no clip, no π_old (LUFFY's policy shaping, π_θ = exp(logp)); "log_prob"
             Â_i · log π_θ where Â_i > 0 (no ratio, no clip), the clipped term where Â_i < 0. The KL term is
             unchanged. clip_frac counts only the tokens whose term is a clipped one.
* grpo       the same with M_i = 1 for every i (uniform KL).
* grpo_nokl  the same with β = 0 (no reference needed).
* score_dpo  ScoreFlow's Score-DPO on pairs (w, l) of rows with s_w > s_l:
                 Δ_i = Σ_t mask (logp − ref)   (sums, not means, as in TRL/ScoreFlow),
                 loss = mean_pairs −log σ(β_dpo [s_w Δ_w − (1 − s_l) Δ_l]).
             Pairs come from `batch.pairs` when given. That is the training path: the pipeline draws ScoreFlow's
             pairs once per iteration over every query's scored candidates (`curation.sample_preference_pairs`)
             and the trainer passes each micro-batch's (chosen, rejected) rows explicitly. Without `pairs` (the
             pure loss on a hand-made batch) they are drawn inside the batch: every pair of rows of the same
             group (`batch.group_ids`, or the whole batch) with different scores is a candidate, and
             `dpo_num_pairs` draws (default: as many as candidates) are taken with replacement with
             probability ∝ (s_w − s_l)^power, seeded by cfg.seed. A batch without a candidate pair gives a zero
             loss (still differentiable) and n_pairs = 0.
* rwr        W4S reward-weighted regression: w_i = exp(r_i / T), T = 0.4,
                 loss = mean_i w_i · ( −(1/|o_i|) Σ_t logp_{i,t} ).
             Per-token mean within a sequence and raw (unnormalised) weights, as W4S's WeightedTrainer does
             (HF per-sample mean NLL × weight, averaged over the batch). `rwr_normalize_weights=True` divides the
             weights by their batch mean instead. The pipeline feeds each candidate W4S keeps (it ran: status
             ok, no sandbox violation, not trivial; and its answer score is above 0.05:
             `curation.w4s_kept_candidates`) once, as W4S does.

Training on unique workflows (the GRPO family). With overlapping groups one workflow o is a row of every
sharpened group g it belongs to, with advantage Â_g. Since min(ρÂ, clip(ρ)Â) = Â·min(ρ, clip ρ) for Â > 0 and
Â·max(ρ, clip ρ) for Â < 0, the sum of its rows' losses is one term

    Σ_g L_g = −(1/|o|) Σ_t [ A⁺ min(ρ, clip ρ) + A⁻ max(ρ, clip ρ) − β K D ],
    A⁺ = Σ_g max(Â_g, 0),  A⁻ = Σ_g min(Â_g, 0),  K = #{g: Â_g > 0} (spogw) or #{g} (grpo),

and the per-group loss (mean over R rows) equals Σ_unique (that term) / R with R = Σ_unique count. A batch
carries these as `adv_pos`, `adv_neg`, `n_pos`, `n_neg`, `count` (see `unique_advantage_weights`); the loss
is then normalised by Σ count, i.e. by the number of per-group rows it stands for, so loss, gradients and the
logged metrics (kl, clip_frac, ratio_mean, kl_mask_frac, advantage_mean) equal those of the repeated rows
(tests/test_unique_aggregation.py).

The trainer computes log-probs for score_dpo and rwr at T = 1 and for the GRPO family at the sampling
temperature (`ObjectiveConfig.logprob_temperature`); the losses themselves take log-probs as given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..hyperparams import ObjectiveConfig
from ..pairs import draw, ordered_pairs, pair_weight
from . import registry

__all__ = [
    "LossBatch",
    "LossOutput",
    "k3_kl",
    "spogw",
    "grpo",
    "grpo_nokl",
    "score_dpo",
    "rwr",
    "sample_pairs",
    "compute_loss",
    "unique_advantage_weights",
]

Tensor = torch.Tensor


@dataclass
class LossBatch:
    """Everything a loss may need; which fields are required depends on the objective (see module doc)."""

    logp: Tensor
    mask: Tensor
    old_logp: Tensor | None = None
    ref_logp: Tensor | None = None
    advantages: Tensor | None = None
    scores: Tensor | None = None
    group_ids: Tensor | None = None  # [B] ints; score_dpo pairs only rows of the same group
    pairs: Tensor | None = None  # [P, 2] long: (chosen row, rejected row); score_dpo
    # unique-workflow rows (GRPO family): each row stands for `count` per-group rows (see module doc); when
    # adv_pos is given these five replace `advantages`, and the loss is normalised by Σ count
    adv_pos: Tensor | None = None  # [B] A⁺ = Σ of the row's positive Â (>= 0)
    adv_neg: Tensor | None = None  # [B] A⁻ = Σ of its negative Â (<= 0)
    n_pos: Tensor | None = None  # [B] number of its groups with Â > 0 (spogw's KL weight)
    n_neg: Tensor | None = None  # [B] number with Â < 0
    count: Tensor | None = None  # [B] number of per-group rows it stands for (>= 1; grpo's KL weight)
    off_policy: Tensor | None = None  # [B] bool: rows not sampled from π_old (anchors); None: none are

    @property
    def aggregated(self) -> bool:
        return self.adv_pos is not None


@dataclass
class LossOutput:
    """loss = policy_loss + kl_loss. The three tensors share the graph of logp (call .item() to log them).

    kl         mean over rows of the per-token mean k3 estimate D (all rows, regardless of the mask M or β;
               detached), or None without a reference.
    clip_frac  fraction of workflow tokens whose clipped term is the active one (ρ > 1+ε_c with Â > 0, or
               ρ < 1−ε_c with Â < 0), i.e. the tokens the clip cuts off from the gradient; 0 for objectives
               that do not clip.
    extra      objective-specific floats (e.g. kl_mask_frac; DPO reward margin and accuracy; RWR weights).
    """

    loss: Tensor
    policy_loss: Tensor
    kl_loss: Tensor
    kl: float | None = None
    clip_frac: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        out = {
            "loss": float(self.loss.detach()),
            "policy_loss": float(self.policy_loss.detach()),
            "kl_loss": float(self.kl_loss.detach()),
            "clip_frac": float(self.clip_frac),
        }
        if self.kl is not None:
            out["kl"] = float(self.kl)
        out.update(self.extra)
        return out


# --------------------------------------------------------------------------------------------------------------
# Input checks
# --------------------------------------------------------------------------------------------------------------


def _work_dtype(t: Tensor) -> torch.dtype:
    return torch.promote_types(t.dtype, torch.float32)


def _check_2d(name: str, x: Tensor | None, shape: torch.Size) -> None:
    if x is None:
        return
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.shape != shape:
        raise ValueError(f"{name} has shape {tuple(x.shape)}, expected {tuple(shape)} (same as logp)")


def _check_1d(name: str, x: Tensor | None, b: int) -> None:
    if x is None:
        return
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.shape != (b,):
        raise ValueError(f"{name} has shape {tuple(x.shape)}, expected ({b},) (one value per row of logp)")


def _prepare(logp: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Boolean mask and |o_i| (float [B]); checks shapes and that no row is empty."""
    if not isinstance(logp, Tensor) or logp.dim() != 2:
        raise ValueError(f"logp must be a [B, T] tensor, got {getattr(logp, 'shape', type(logp))}")
    _check_2d("mask", mask, logp.shape)
    m = mask != 0
    lengths = m.sum(dim=-1)
    empty = (lengths == 0).nonzero().flatten().tolist()
    if empty:
        raise ValueError(
            f"row(s) {empty} have no workflow tokens in mask; every response needs at least one token "
            f"(drop empty responses before batching)"
        )
    return m, lengths.to(_work_dtype(logp))


def _masked(x: Tensor, m: Tensor, dtype: torch.dtype) -> Tensor:
    """x at workflow tokens, 0 elsewhere (so padding values never reach the arithmetic or the gradient)."""
    return torch.where(m, x.to(dtype), torch.zeros((), dtype=dtype, device=x.device))


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Schulman's k3 estimator per token: exp(ref − logp) − (ref − logp) − 1 (>= 0, 0 where equal)."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


# --------------------------------------------------------------------------------------------------------------
# GRPO family
# --------------------------------------------------------------------------------------------------------------


# ρ is computed for every row, off-policy ones too, where a π_old far below π_θ (an anchor's rare token) could
# overflow exp and turn the unused branch's zero gradient into NaN; e^60 fits float32 and is never a real ratio
_MAX_LOG_RATIO = 60.0


def _ratios(lp: Tensor, old: Tensor, clip_eps: float) -> tuple[Tensor, Tensor]:
    """ρ = π_θ / π_old per token (log-ratio capped at _MAX_LOG_RATIO) and clip(ρ, 1 − ε, 1 + ε)."""
    ratio = torch.exp(torch.clamp(lp - old, max=_MAX_LOG_RATIO))
    return ratio, torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)


def _off_policy_terms(surrogate: Tensor, lp: Tensor, ratio: Tensor, clipped: Tensor, a_pos: Tensor, a_neg: Tensor,
                      off: Tensor | None, loss: str, gamma: float) -> tuple[Tensor, Tensor, Tensor]:
    """The surrogate with the off-policy rows' terms replaced as `loss` says (module doc), and two [B, 1] bool
    masks: the rows whose positive and whose negative advantage still go through a clip. `a_pos`, `a_neg` [B, 1]:
    a row's A⁺ and A⁻ (for a per-group row, max(Â, 0) and min(Â, 0))."""
    every = torch.ones((lp.shape[0], 1), dtype=torch.bool, device=lp.device)
    if off is None or loss == "clipped":
        return surrogate, every, every
    off = off.to(device=lp.device, dtype=torch.bool).unsqueeze(-1)
    if loss == "shaped":
        if not gamma > 0:
            raise ValueError(f"off_policy_gamma={gamma} must be > 0")
        p = torch.exp(lp)
        return torch.where(off, (a_pos + a_neg) * p / (p + gamma), surrogate), ~off, ~off
    if loss == "log_prob":
        return torch.where(off, a_pos * lp + a_neg * torch.maximum(ratio, clipped), surrogate), ~off, every
    raise ValueError(f"off_policy_loss={loss!r}: choose one of clipped, shaped, log_prob")


def _check_kl_args(beta: float, clip_eps: float, ref_logp) -> None:
    if beta < 0:
        raise ValueError(f"beta={beta} must be >= 0")
    if not (0 < clip_eps < 1):
        raise ValueError(f"clip_eps={clip_eps} must be in (0, 1)")
    if beta > 0 and ref_logp is None:
        raise ValueError(
            f"a KL term with beta={beta} needs batch.ref_logp (reference log-probs); "
            f"set beta=0 or use 'grpo_nokl' to train without a reference"
        )


def _clipped_policy_loss(
    logp: Tensor,
    old_logp: Tensor | None,
    ref_logp: Tensor | None,
    mask: Tensor,
    advantages: Tensor,
    *,
    beta: float,
    clip_eps: float,
    kl_mask: str,  # "positive" (mKL) | "all"
    off_policy: Tensor | None = None,
    off_loss: str = "clipped",
    gamma: float = 0.1,
) -> LossOutput:
    if advantages is None:
        raise ValueError("this objective needs batch.advantages ([B] tensor of Â_i from curation)")
    m, length = _prepare(logp, mask)
    B = logp.shape[0]
    _check_2d("old_logp", old_logp, logp.shape)
    _check_2d("ref_logp", ref_logp, logp.shape)
    _check_1d("advantages", advantages, B)
    _check_1d("off_policy", off_policy, B)
    _check_kl_args(beta, clip_eps, ref_logp)
    dt = _work_dtype(logp)
    lp = _masked(logp, m, dt)
    old = _masked(old_logp.detach(), m, dt) if old_logp is not None else lp.detach()
    adv = advantages.detach().to(dt)
    A = adv.unsqueeze(-1)

    ratio, clipped = _ratios(lp, old, clip_eps)
    surrogate = torch.minimum(ratio * A, clipped * A)
    surrogate, pos_ok, neg_ok = _off_policy_terms(surrogate, lp, ratio, clipped, A.clamp(min=0), A.clamp(max=0),
                                                  off_policy, off_loss, gamma)
    policy_rows = -(surrogate * m).sum(-1) / length  # * m: a shaped row is not 0 at masked positions (π = 1 there)
    policy_loss = policy_rows.mean()

    kl_value: float | None = None
    if ref_logp is not None:
        ref = _masked(ref_logp.detach(), m, dt)
        D = k3_kl(lp, ref)  # 0 at masked positions (lp = ref = 0 there)
        kl_rows = (D * m).sum(-1) / length
        kl_value = float(kl_rows.detach().mean())
        if kl_mask == "positive":
            M = (adv > 0).to(dt)
        elif kl_mask == "all":
            M = torch.ones_like(adv)
        else:  # pragma: no cover - internal
            raise ValueError(f"unknown kl_mask {kl_mask!r}")
        kl_loss = (beta * M * kl_rows).mean() if beta > 0 else lp.new_zeros(())
        kl_mask_frac = float(M.mean())
    else:
        kl_loss = lp.new_zeros(())
        kl_mask_frac = 0.0

    with torch.no_grad():
        r = ratio.detach()
        cut = ((r > 1.0 + clip_eps) & (A > 0) & pos_ok) | ((r < 1.0 - clip_eps) & (A < 0) & neg_ok)
        clip_frac = float((cut & m).sum() / m.sum())
        ratio_mean = float((r * m).sum() / m.sum())

    return LossOutput(
        loss=policy_loss + kl_loss,
        policy_loss=policy_loss,
        kl_loss=kl_loss,
        kl=kl_value,
        clip_frac=clip_frac,
        extra={
            "kl_mask_frac": kl_mask_frac if beta > 0 else 0.0,
            "ratio_mean": ratio_mean,
            "advantage_mean": float(adv.mean()),
        },
    )


def unique_advantage_weights(advantages) -> tuple[float, float, int, int, int]:
    """(A⁺, A⁻, n⁺, n⁻, count) of one workflow from the advantages Â_g of the per-group rows it stands for:
    A⁺ = Σ max(Â_g, 0), A⁻ = Σ min(Â_g, 0), n⁺ = #{Â_g > 0}, n⁻ = #{Â_g < 0}, count = #rows (sums in float64)."""
    a = [float(x) for x in advantages]
    if not a:
        raise ValueError("a unique row stands for at least one per-group row")
    return (math.fsum(x for x in a if x > 0), math.fsum(x for x in a if x < 0),
            sum(x > 0 for x in a), sum(x < 0 for x in a), len(a))


def _aggregated_policy_loss(
    logp: Tensor,
    old_logp: Tensor | None,
    ref_logp: Tensor | None,
    mask: Tensor,
    b: LossBatch,
    *,
    beta: float,
    clip_eps: float,
    kl_mask: str,  # "positive" (mKL: weight n⁺) | "all" (weight count)
    off_loss: str = "clipped",
    gamma: float = 0.1,
) -> LossOutput:
    """The GRPO family on unique-workflow rows (module doc): equal to `_clipped_policy_loss` on the per-group
    rows each unique row stands for — loss, gradients and metrics."""
    m, length = _prepare(logp, mask)
    B = logp.shape[0]
    _check_2d("old_logp", old_logp, logp.shape)
    _check_2d("ref_logp", ref_logp, logp.shape)
    for name in ("adv_pos", "adv_neg", "n_pos", "n_neg", "count"):
        if getattr(b, name) is None:
            raise ValueError(f"unique-workflow rows need all of adv_pos, adv_neg, n_pos, n_neg, count; {name} is missing")
        _check_1d(name, getattr(b, name), B)
    _check_1d("off_policy", b.off_policy, B)
    _check_kl_args(beta, clip_eps, ref_logp)
    dt = _work_dtype(logp)
    a_pos, a_neg = b.adv_pos.detach().to(dt), b.adv_neg.detach().to(dt)
    n_pos, n_neg, count = b.n_pos.detach().to(dt), b.n_neg.detach().to(dt), b.count.detach().to(dt)
    if bool((a_pos < 0).any()) or bool((a_neg > 0).any()):
        raise ValueError("adv_pos must be >= 0 and adv_neg <= 0 (sums of the positive / negative advantages)")
    if bool((count < 1).any()) or bool((n_pos + n_neg > count).any()) or bool((n_pos < 0).any() or (n_neg < 0).any()):
        raise ValueError("need count >= 1 and 0 <= n_pos, n_neg with n_pos + n_neg <= count")
    total = count.sum()  # the number of per-group rows: the per-group loss's denominator

    lp = _masked(logp, m, dt)
    old = _masked(old_logp.detach(), m, dt) if old_logp is not None else lp.detach()
    ratio, clipped = _ratios(lp, old, clip_eps)
    # Â > 0: min(ρÂ, clip(ρ)Â) = Â min(ρ, clip ρ);  Â < 0: = Â max(ρ, clip ρ); summed over the row's groups
    surrogate = a_pos.unsqueeze(-1) * torch.minimum(ratio, clipped) + a_neg.unsqueeze(-1) * torch.maximum(ratio, clipped)
    surrogate, pos_ok, neg_ok = _off_policy_terms(surrogate, lp, ratio, clipped, a_pos.unsqueeze(-1),
                                                  a_neg.unsqueeze(-1), b.off_policy, off_loss, gamma)
    policy_rows = -(surrogate * m).sum(-1) / length
    policy_loss = policy_rows.sum() / total

    kl_value: float | None = None
    if kl_mask == "positive":
        W = n_pos
    elif kl_mask == "all":
        W = count
    else:  # pragma: no cover - internal
        raise ValueError(f"unknown kl_mask {kl_mask!r}")
    if ref_logp is not None:
        ref = _masked(ref_logp.detach(), m, dt)
        D = k3_kl(lp, ref)
        kl_rows = (D * m).sum(-1) / length
        kl_value = float((count * kl_rows.detach()).sum() / total)
        kl_loss = beta * (W * kl_rows).sum() / total if beta > 0 else lp.new_zeros(())
        kl_mask_frac = float(W.sum() / total)
    else:
        kl_loss = lp.new_zeros(())
        kl_mask_frac = 0.0

    with torch.no_grad():
        r = ratio.detach()
        mf = m.to(dt)
        above = ((r > 1.0 + clip_eps) & m & pos_ok).to(dt).sum(-1)
        below = ((r < 1.0 - clip_eps) & m & neg_ok).to(dt).sum(-1)
        tokens = (count * length).sum()
        clip_frac = float((n_pos * above + n_neg * below).sum() / tokens)
        ratio_mean = float((count * (r * mf).sum(-1)).sum() / tokens)

    return LossOutput(
        loss=policy_loss + kl_loss,
        policy_loss=policy_loss,
        kl_loss=kl_loss,
        kl=kl_value,
        clip_frac=clip_frac,
        extra={
            "kl_mask_frac": kl_mask_frac if beta > 0 else 0.0,
            "ratio_mean": ratio_mean,
            "advantage_mean": float((a_pos + a_neg).sum() / total),
        },
    )


def spogw(
    logp: Tensor,
    old_logp: Tensor | None,
    ref_logp: Tensor | None,
    mask: Tensor,
    advantages: Tensor,
    *,
    beta: float = 0.1,
    clip_eps: float = 0.2,
) -> LossOutput:
    """ioGRPO + advantage-masked KL: the KL penalty applies only to rows with Â_i > 0."""
    return _clipped_policy_loss(
        logp, old_logp, ref_logp, mask, advantages, beta=beta, clip_eps=clip_eps, kl_mask="positive"
    )


def grpo(
    logp: Tensor,
    old_logp: Tensor | None,
    ref_logp: Tensor | None,
    mask: Tensor,
    advantages: Tensor,
    *,
    beta: float = 0.1,
    clip_eps: float = 0.2,
) -> LossOutput:
    """ioGRPO with the KL penalty on every row (M_i = 1)."""
    return _clipped_policy_loss(
        logp, old_logp, ref_logp, mask, advantages, beta=beta, clip_eps=clip_eps, kl_mask="all"
    )


def grpo_nokl(
    logp: Tensor,
    old_logp: Tensor | None,
    mask: Tensor,
    advantages: Tensor,
    *,
    clip_eps: float = 0.2,
    ref_logp: Tensor | None = None,
) -> LossOutput:
    """ioGRPO without a KL term (β = 0). A given ref_logp only feeds the `kl` metric."""
    return _clipped_policy_loss(
        logp, old_logp, ref_logp, mask, advantages, beta=0.0, clip_eps=clip_eps, kl_mask="all"
    )


# --------------------------------------------------------------------------------------------------------------
# Score-DPO (ScoreFlow)
# --------------------------------------------------------------------------------------------------------------


def sample_pairs(
    scores: Tensor,
    group_ids: Tensor | None = None,
    *,
    num_pairs: int | None = None,
    power: float = 3.0,
    seed: int = 0,
) -> Tensor:
    """(chosen, rejected) row pairs drawn with replacement ∝ (s_w − s_l)^power among rows of the same group
    with different scores (`pairs.ordered_pairs`, `pairs.pair_weight`). Candidates are enumerated as (i, j),
    i < j in row order; the draw is the pipeline's (`pairs.draw`, numpy, seeded with `seed`). Returns a [P, 2]
    long tensor (P = 0 when there is no candidate)."""
    s = scores.detach().to(torch.float64).cpu().tolist()
    g = group_ids.detach().cpu().tolist() if group_ids is not None else [0] * len(s)
    cand: list[tuple[int, int]] = []
    weights: list[float] = []
    for w, l in ordered_pairs(s):
        if g[w] == g[l]:
            cand.append((w, l))
            weights.append(pair_weight(s[w], s[l], power))
    if not cand:
        return torch.zeros((0, 2), dtype=torch.long)
    picks = draw(weights, len(cand) if num_pairs is None else num_pairs, seed)
    return torch.tensor(cand, dtype=torch.long)[picks]


def score_dpo(
    logp: Tensor,
    ref_logp: Tensor,
    mask: Tensor,
    scores: Tensor,
    *,
    beta: float = 0.1,
    pairs: Tensor | None = None,
    group_ids: Tensor | None = None,
    num_pairs: int | None = None,
    power: float = 3.0,
    seed: int = 0,
) -> LossOutput:
    """ScoreFlow Score-DPO: mean over pairs of −log σ(β [s_w Δ_w − (1 − s_l) Δ_l]), Δ = Σ_t mask (logp − ref)."""
    if ref_logp is None:
        raise ValueError("score_dpo needs batch.ref_logp (reference log-probs)")
    if scores is None:
        raise ValueError("score_dpo needs batch.scores ([B] scores in [0, 1])")
    m, _ = _prepare(logp, mask)
    B = logp.shape[0]
    _check_2d("ref_logp", ref_logp, logp.shape)
    _check_1d("scores", scores, B)
    _check_1d("group_ids", group_ids, B)
    if beta <= 0:
        raise ValueError(f"beta={beta} must be > 0")
    if bool(((scores < 0) | (scores > 1)).any()):
        raise ValueError("score_dpo needs scores in [0, 1] (the loss weighs Δ_w by s_w and Δ_l by 1 − s_l)")
    dt = _work_dtype(logp)
    lp = _masked(logp, m, dt)
    ref = _masked(ref_logp.detach(), m, dt)
    delta = (lp - ref).sum(-1)  # [B]
    kl_value = float(((k3_kl(lp, ref) * m).sum(-1) / m.sum(-1)).detach().mean())

    if pairs is None:
        pairs = sample_pairs(scores, group_ids, num_pairs=num_pairs, power=power, seed=seed)
    else:
        if pairs.dim() != 2 or pairs.shape[1] != 2:
            raise ValueError(f"pairs must be a [P, 2] tensor of (chosen, rejected) rows, got {tuple(pairs.shape)}")
        if pairs.numel() and (int(pairs.min()) < 0 or int(pairs.max()) >= B):
            raise ValueError(f"pairs index rows outside 0..{B - 1}")
    pairs = pairs.to(device=logp.device, dtype=torch.long)
    if pairs.shape[0] == 0:
        zero = delta.sum() * 0.0
        return LossOutput(
            loss=zero,
            policy_loss=zero,
            kl_loss=lp.new_zeros(()),
            kl=kl_value,
            extra={"n_pairs": 0.0, "reward_margin": 0.0, "reward_accuracy": 0.0, "chosen_reward": 0.0,
                   "rejected_reward": 0.0},
        )
    s = scores.detach().to(dt)
    w, l = pairs[:, 0], pairs[:, 1]
    chosen = beta * s[w] * delta[w]
    rejected = beta * (1.0 - s[l]) * delta[l]
    loss = -F.logsigmoid(chosen - rejected).mean()
    with torch.no_grad():
        margin = chosen - rejected
        extra = {
            "n_pairs": float(pairs.shape[0]),
            "chosen_reward": float(chosen.mean()),
            "rejected_reward": float(rejected.mean()),
            "reward_margin": float(margin.mean()),
            "reward_accuracy": float((margin > 0).to(dt).mean()),
        }
    return LossOutput(loss=loss, policy_loss=loss, kl_loss=lp.new_zeros(()), kl=kl_value, extra=extra)


# --------------------------------------------------------------------------------------------------------------
# RWR (W4S)
# --------------------------------------------------------------------------------------------------------------


def rwr(
    logp: Tensor,
    mask: Tensor,
    rewards: Tensor,
    *,
    temperature: float = 0.4,
    normalize_weights: bool = False,
    ref_logp: Tensor | None = None,
) -> LossOutput:
    """W4S reward-weighted regression: mean_i exp(r_i/T) · (per-token mean NLL of row i)."""
    if rewards is None:
        raise ValueError("rwr needs batch.scores (the reward r_i of each row)")
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be > 0")
    m, length = _prepare(logp, mask)
    B = logp.shape[0]
    _check_1d("scores", rewards, B)
    _check_2d("ref_logp", ref_logp, logp.shape)
    dt = _work_dtype(logp)
    lp = _masked(logp, m, dt)
    weights = torch.exp(rewards.detach().to(dt) / temperature)
    if normalize_weights:
        weights = weights / weights.mean()
    nll = -lp.sum(-1) / length
    loss = (weights * nll).mean()
    kl_value = None
    if ref_logp is not None:
        ref = _masked(ref_logp.detach(), m, dt)
        kl_value = float(((k3_kl(lp, ref) * m).sum(-1) / length).detach().mean())
    return LossOutput(
        loss=loss,
        policy_loss=loss,
        kl_loss=lp.new_zeros(()),
        kl=kl_value,
        extra={
            "weight_mean": float(weights.mean()),
            "weight_max": float(weights.max()),
            "nll_mean": float(nll.detach().mean()),
        },
    )


# --------------------------------------------------------------------------------------------------------------
# Dispatcher
# --------------------------------------------------------------------------------------------------------------


def _run_group_family(b: LossBatch, c: ObjectiveConfig, *, kl: bool, kl_mask: str) -> LossOutput:
    """spogw, grpo and grpo_nokl differ only in whether β applies and the KL mask (module doc). β is read here,
    from the config the trainer holds, not copied down the call chain."""
    beta = c.beta if kl else 0.0
    if b.aggregated:
        return _aggregated_policy_loss(b.logp, b.old_logp, b.ref_logp, b.mask, b, beta=beta, clip_eps=c.clip_eps,
                                       kl_mask=kl_mask, off_loss=c.off_policy_loss, gamma=c.off_policy_gamma)
    return _clipped_policy_loss(b.logp, b.old_logp, b.ref_logp, b.mask, b.advantages, beta=beta,
                                clip_eps=c.clip_eps, kl_mask=kl_mask, off_policy=b.off_policy,
                                off_loss=c.off_policy_loss, gamma=c.off_policy_gamma)


def _run_spogw(b: LossBatch, c: ObjectiveConfig) -> LossOutput:
    return _run_group_family(b, c, kl=True, kl_mask="positive")


def _run_grpo(b: LossBatch, c: ObjectiveConfig) -> LossOutput:
    return _run_group_family(b, c, kl=True, kl_mask="all")


def _run_grpo_nokl(b: LossBatch, c: ObjectiveConfig) -> LossOutput:
    return _run_group_family(b, c, kl=False, kl_mask="all")


def _run_score_dpo(b: LossBatch, c: ObjectiveConfig) -> LossOutput:
    return score_dpo(
        b.logp,
        b.ref_logp,  # type: ignore[arg-type]
        b.mask,
        b.scores,  # type: ignore[arg-type]
        beta=c.dpo_beta,
        pairs=b.pairs,
        group_ids=b.group_ids,
        num_pairs=c.dpo_num_pairs,
        power=c.dpo_pair_power,
        seed=c.seed,
    )


def _run_rwr(b: LossBatch, c: ObjectiveConfig) -> LossOutput:
    return rwr(
        b.logp,
        b.mask,
        b.scores,  # type: ignore[arg-type]
        temperature=c.rwr_temperature,
        normalize_weights=c.rwr_normalize_weights,
        ref_logp=b.ref_logp,
    )


def compute_loss(name: str, batch: LossBatch, cfg: ObjectiveConfig | None = None) -> LossOutput:
    """Run objective `name` on `batch` with the hyperparameters of `cfg` (default: ObjectiveConfig(objective=name)).

    `name` wins over cfg.objective, so one config can serve several objectives in an ablation.
    """
    loss = registry.loss_function(name)  # the registered objectives (core.training.registry)
    if cfg is None:
        cfg = ObjectiveConfig(objective=name)
    return loss(batch, cfg)
