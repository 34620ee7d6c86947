"""The methods `objective_comparison` trains side by side: each is the loop's own configuration with a few
fields changed, so every method sees the same iteration's data, seeds and parent adapter.

    spogw               ioGRPO + mKL as configured (the reference every other method is compared with)
    grpo, grpo_nokl     plain GRPO with its KL on every row; without any KL
    score_dpo           ScoreFlow: pairs over the full scored candidate set ∝ (s_w − s_l)^3, log-probs at T = 1
    rwr                 W4S: every scored candidate once, weight exp(r / 0.4), log-probs at T = 1
    spogw_beta{b}       SPOGW's ablation of β ∈ {0, 0.05, 0.1, 0.2}
    spogw_ref_previous  π_ref = π_{k-1} instead of the base model (the other π_ref of the ablation)
    spogw_ref_base      π_ref = the base model (the default: equals `spogw` unless the loop sets previous)
    spogw_no_screening  τ_std = 0: every group kept, also equal-score ones
    spogw_no_sharpening t = n/2 (n even; (n−1)/2 for odd n): a sharpened group is (nearly) the whole group

Pure: a method is a mapping of overrides on the `curation:` and `training:` sections, nothing else.
"""

from __future__ import annotations

from typing import Any

__all__ = ["METHODS", "method_overrides", "method_names"]

_BETAS = {"0": 0.0, "0.05": 0.05, "0.1": 0.1, "0.2": 0.2}

METHODS: dict[str, dict[str, dict[str, Any]]] = {
    "spogw": {},
    "grpo": {"training": {"objective": "grpo"}},
    "grpo_nokl": {"training": {"objective": "grpo_nokl"}},
    "score_dpo": {"training": {"objective": "score_dpo"}},
    "rwr": {"training": {"objective": "rwr"}},
    **{f"spogw_beta{k}": {"training": {"objective": "spogw", "beta": v}} for k, v in _BETAS.items()},
    "spogw_ref_previous": {"training": {"objective": "spogw", "ref_mode": "previous"}},
    "spogw_ref_base": {"training": {"objective": "spogw", "ref_mode": "base"}},
    "spogw_no_screening": {"training": {"objective": "spogw"}, "curation": {"tau_std": 0.0}},
    "spogw_no_sharpening": {"training": {"objective": "spogw"}, "curation": {"t": None}},  # t = n // 2, below
}


def method_names() -> list[str]:
    return list(METHODS)


def method_overrides(name: str, n: int) -> dict[str, dict[str, Any]]:
    """The section overrides of method `name` for a loop whose group size is `n`."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; choose from {', '.join(METHODS)}")
    out = {section: dict(fields) for section, fields in METHODS[name].items()}
    if out.get("curation", {}).get("t", 0) is None:
        out["curation"]["t"] = n // 2
    return out
