"""The methods `objective_comparison` trains side by side: each is the loop's own configuration with a few
fields changed, so every method sees the same iteration's data, seeds and parent adapter.

    spogw               ioGRPO + mKL as configured (the reference every other method is compared with)
    grpo, grpo_nokl     plain GRPO with its KL on every row; without any KL
    score_dpo           ScoreFlow: pairs of workflows that ran, on the answer, ∝ (s_w − s_l)^3, log-probs at T = 1,
                        at ScoreFlow's training settings (lr 1e-6, 1 epoch, one pair per step: DPOConfig's
                        defaults, which its optimize.py keeps)
    rwr                 W4S: each candidate that ran with answer > 0.05, once, weight exp(r / 0.4) (history-relative r),
                        log-probs at T = 1, at W4S's settings (lr 2e-5 from its train.py; 3 epochs and batch 8:
                        Hugging Face Trainer's defaults, which its train.py does not change)
    w4s                 W4S as a whole: its own data of the iteration from W4S_TURNS turns of 5 candidates
                        (T = 0.5, self-check repairs, each run on W4S_FEEDBACK_QUERIES feedback queries, the best
                        advancing the state), then rwr at W4S's settings
    score_dpo_ours,     the same data paths and losses at the loop's own training settings (learning rate,
    rwr_ours            epochs, batch), to tell the data path's effect from the settings'

    spogw_beta{b}       SPOGW's ablation of β ∈ {0, 0.05, 0.1, 0.2}
    spogw_ref_previous  π_ref = π_{k-1} instead of the base model (the other π_ref of the ablation)
    spogw_ref_base      π_ref = the base model (the default: equals `spogw` unless the loop sets previous)
    spogw_no_screening  τ_std = 0: every group kept, also equal-score ones
    spogw_no_sharpening t = n/2 (n even; (n−1)/2 for odd n): a sharpened group is (nearly) the whole group

Pure: a method is a mapping of overrides on the `curation:` and `training:` sections and, for a method that
samples and scores its own data (ScoreFlow), on `generator:`, `executor:` and `execution:` (`DATA_SECTIONS`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["METHODS", "DATA_SECTIONS", "method_overrides", "method_names", "own_data"]

_BETAS = {"0": 0.0, "0.05": 0.05, "0.1": 0.1, "0.2": 0.2}

# W4S's multi-turn optimisation at its paper's size: about 10 turns in the main table (its code's default is 30
# iterations), each run on its validation set (33 HumanEval queries in its repository). Ours are settings
# (comparison.w4s_turns, comparison.w4s_feedback_queries) with these defaults; `spogw plan` states their cost.
W4S_TURNS = 10
W4S_FEEDBACK_QUERIES = 33

# Each baseline at its own paper's training settings. ScoreFlow's optimize.py sets 1 epoch and a per-device
# batch of 1 pair = 2 rows (chosen, rejected) and keeps DPOConfig's default lr 1e-6. W4S's train.py sets lr
# 2e-5 and leaves epochs and batch at Hugging Face TrainingArguments' defaults (3, 8). Both trainers keep the
# Trainer's default schedule: linear decay to 0, no warm-up. (LoRA rank and token limits stay the loop's.)
PAPER_SETTINGS: dict[str, dict[str, Any]] = {
    "score_dpo": {"learning_rate": 1e-6, "epochs": 1, "batch_size": 2, "lr_scheduler": "linear"},
    "rwr": {"learning_rate": 2e-5, "epochs": 3, "batch_size": 8, "lr_scheduler": "linear"},
}

METHODS: dict[str, dict[str, dict[str, Any]]] = {
    "spogw": {},
    "grpo": {"training": {"objective": "grpo"}},
    "grpo_nokl": {"training": {"objective": "grpo_nokl"}},
    # ScoreFlow also samples and scores its own way: generator T = 0.2, top-p 0.95; each workflow the mean of 3
    # executor runs at T = 0 (one run's calls: the call cache keys a greedy call without its seed). The comparison
    # samples and scores a data set of its own for it (same parent, seeds)
    "score_dpo": {"training": {"objective": "score_dpo", **PAPER_SETTINGS["score_dpo"]},
                  "generator": {"temperature": 0.2, "top_p": 0.95},
                  "executor": {"temperature": 0.0}, "execution": {"runs": 3}},
    "rwr": {"training": {"objective": "rwr", **PAPER_SETTINGS["rwr"]}},
    # W4S as a whole: its turns (5 candidates each at T = 0.5, up to 3 self-check repairs) sampled for the
    # comparison from the same parent, then RWR on all turns' candidates; the number of turns and of feedback
    # queries is added by `method_overrides` (the settings; W4S_TURNS and W4S_FEEDBACK_QUERIES by default)
    "w4s": {"training": {"objective": "rwr", **PAPER_SETTINGS["rwr"]}, "generator": {"temperature": 0.5},
            "curation": {"m": 5}, "refinement": {"repairs": 3}},
    "score_dpo_ours": {"training": {"objective": "score_dpo"}},
    "rwr_ours": {"training": {"objective": "rwr"}},
    **{f"spogw_beta{k}": {"training": {"objective": "spogw", "beta": v}} for k, v in _BETAS.items()},
    "spogw_ref_previous": {"training": {"objective": "spogw", "ref_mode": "previous"}},
    "spogw_ref_base": {"training": {"objective": "spogw", "ref_mode": "base"}},
    "spogw_no_screening": {"training": {"objective": "spogw"}, "curation": {"tau_std": 0.0}},
    "spogw_no_sharpening": {"training": {"objective": "spogw"}, "curation": {"t": None}},  # t = n // 2, below
}


# sections whose override means the method needs its own sampled and scored data for the iteration
DATA_SECTIONS = ("generator", "executor", "execution", "refinement")


def own_data(name: str) -> bool:
    """Whether method `name` samples and scores its own training data (instead of the loop's)."""
    return any(s in METHODS[name] for s in DATA_SECTIONS)


def method_names() -> list[str]:
    return list(METHODS)


def method_overrides(name: str, n: int, t: int | None = None, *, w4s_turns: int = W4S_TURNS,
                     w4s_feedback_queries: int = W4S_FEEDBACK_QUERIES) -> dict[str, dict[str, Any]]:
    """The section overrides of method `name` for a loop whose groups are of `n` with top/bottom `t`. A method
    that samples fewer than n candidates a query (w4s: 5) gets groups of all of them (its RWR uses no groups;
    the curation must still be a valid one, e.g. under the paper's n = 14). W4S's turns and feedback queries
    are the given ones (the paper's by default)."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; choose from {', '.join(METHODS)}")
    out = {section: dict(fields) for section, fields in METHODS[name].items()}
    if own_data(name):  # it samples as its paper does: not the loop's anchor rows (generator.anchors)
        out.setdefault("generator", {})["anchors"] = False
    if "refinement" in out:
        out["refinement"].update(turns=w4s_turns, feedback_queries=w4s_feedback_queries)
    cur = out.get("curation", {})
    if cur.get("t", 0) is None:
        cur["t"] = n // 2
    m = cur.get("m")
    if m is not None and m < n:
        cur["n"] = m
        cur["t"] = min(t if t is not None else n // 2, m // 2)
    return out
