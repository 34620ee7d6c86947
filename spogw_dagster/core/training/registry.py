"""The objectives the trainer knows, each declared once: its loss and what the trainer, the curation and the
pipeline must know to feed it. Nothing else branches on an objective's name.

A new objective is a loss function (a module of its own, or `core/training/objectives.py`) and one `register(...)`:

    register(Objective("my_obj", loss="my_package.my_module:my_loss", data="groups", uses_old=True,
                       ref="kl", description="..."))

and it is then valid as `training.objective: my_obj` (`tests/test_objective_registry.py` adds one that way).
The loss takes `(core.training.objectives.LossBatch, core.hyperparams.ObjectiveConfig)` and returns a
`core.training.objectives.LossOutput`; given as "module:function", it is imported on first use, so loading a config
never imports torch.

The fields:

    data                  what it trains on: "groups" (the sharpened groups with their advantages Â; the
                          GRPO family), "pairs" (ScoreFlow's (chosen, rejected) pairs over each query's scored
                          candidates; every row has a role and a pair's rows share a micro-batch) or
                          "candidates" (each kept candidate once, with its reward; W4S)
    uses_old              reads π_old (the clipped ratio π_θ/π_old)
    ref                   when it reads π_ref: "never", "kl" (when its effective β > 0) or "always"
    kl                    whether `beta` applies (False: the effective β is 0)
    logprob_temperature   "sampling" (π_θ, π_old and π_ref at the sampler's temperature, so that π_θ/π_old is
                          the sampler's ratio) or a number (1.0: ScoreFlow's and W4S's cross-entropy at T = 1)
    uses_scores           its loss reads each row's score s_i (which must then be finite)
    no_data               why an iteration can leave it no training example (said when the parent policy is
                          carried forward)
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Literal

__all__ = ["Objective", "register", "unregister", "get", "names", "loss_function", "DATA_KINDS"]

DATA_KINDS = ("groups", "pairs", "candidates")


@dataclass(frozen=True)
class Objective:
    name: str
    loss: Callable[..., Any] | str
    data: Literal["groups", "pairs", "candidates"]
    uses_old: bool = False
    ref: Literal["never", "kl", "always"] = "never"
    kl: bool = False
    logprob_temperature: str | float = "sampling"
    uses_scores: bool = False
    description: str = ""
    no_data: str = "no training examples"

    def __post_init__(self) -> None:
        if self.data not in DATA_KINDS:
            raise ValueError(f"objective {self.name!r}: data={self.data!r}; choose one of {DATA_KINDS}")
        if self.ref not in ("never", "kl", "always"):
            raise ValueError(f"objective {self.name!r}: ref={self.ref!r}; choose never, kl or always")
        if self.logprob_temperature != "sampling" and not isinstance(self.logprob_temperature, (int, float)):
            raise ValueError(f"objective {self.name!r}: logprob_temperature is 'sampling' or a number")

    @property
    def aggregates(self) -> bool:
        """Whether its rows may be merged into one row per distinct workflow (`training.aggregate_unique`):
        the clipped surrogate of the groups objectives is piecewise linear in Â, so the sum is exact."""
        return self.data == "groups"

    def effective_beta(self, beta: float) -> float:
        return float(beta) if self.kl else 0.0

    def needs_ref(self, beta: float) -> bool:
        return self.ref == "always" or (self.ref == "kl" and self.effective_beta(beta) > 0)

    def temperature(self, sampling_temperature: float) -> float:
        t = self.logprob_temperature
        return float(sampling_temperature) if t == "sampling" else float(t)


_REGISTRY: dict[str, Objective] = {}


def register(obj: Objective, *, replace: bool = False) -> Objective:
    """Add `obj`; a name already taken is an error unless `replace`."""
    if obj.name in _REGISTRY and not replace:
        raise ValueError(f"objective {obj.name!r} is already registered")
    _REGISTRY[obj.name] = obj
    return obj


def unregister(name: str) -> None:
    """Remove objective `name` (a plug-in's, or a test's)."""
    _REGISTRY.pop(name, None)


def names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def get(name: str) -> Objective:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown objective {name!r}; choose one of {list(_REGISTRY)}") from None


def loss_function(name: str) -> Callable[..., Any]:
    """The loss of objective `name`, imported on first use when declared as "module:function"."""
    obj = get(name)
    if callable(obj.loss):
        return obj.loss
    module, _, attr = obj.loss.partition(":")
    fn = getattr(importlib.import_module(module), attr)
    register(Objective(**{**obj.__dict__, "loss": fn}), replace=True)
    return fn


# The built-in objectives (their losses in core/training/objectives.py; docs/algorithm.md has the equations).
_LOSSES = "spogw_dagster.core.training.objectives"
register(Objective("spogw", f"{_LOSSES}:_run_spogw", data="groups", uses_old=True, ref="kl", kl=True,
                   description="ioGRPO + mKL: the clipped surrogate, the k3 KL only on rows with Â > 0",
                   no_data="no training examples: every group was screened out"))
register(Objective("grpo", f"{_LOSSES}:_run_grpo", data="groups", uses_old=True, ref="kl", kl=True,
                   description="GRPO: the KL on every row",
                   no_data="no training examples: every group was screened out"))
register(Objective("grpo_nokl", f"{_LOSSES}:_run_grpo_nokl", data="groups", uses_old=True,
                   description="GRPO without a KL term (β = 0)",
                   no_data="no training examples: every group was screened out"))
register(Objective("score_dpo", f"{_LOSSES}:_run_score_dpo", data="pairs", ref="always",
                   logprob_temperature=1.0, uses_scores=True,
                   description="ScoreFlow's Score-DPO on pairs drawn ∝ (s_w − s_l)^power",
                   no_data="no training examples: no pair of workflows that ran with different answer scores"))
register(Objective("rwr", f"{_LOSSES}:_run_rwr", data="candidates", logprob_temperature=1.0, uses_scores=True,
                   description="W4S's reward-weighted regression: every kept candidate once, weight exp(r / T)",
                   no_data="no training examples: no candidate ran with an answer score above 0.05"))
