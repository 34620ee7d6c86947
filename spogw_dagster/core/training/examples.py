"""What the trainer takes and returns: one training response (`TrainExample`), one finished run (`TrainResult`)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping


@dataclass
class TrainExample:
    """One training response. Token ids, when given, are used as is (exactly what was sampled); otherwise
    the prompt is tokenized like the sampler does and the completion without special tokens."""

    prompt: str
    completion: str
    advantage: float = 0.0
    score: float | None = None
    old_logprobs: list[float] | None = None
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    group_id: str | int | None = None
    role: str | None = None  # score_dpo: "chosen" | "rejected" (the pair is the rows sharing group_id)
    # not sampled from π_old (an anchor): trained with `off_policy_loss` where the config sets it
    off_policy: bool = False

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TrainExample":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def canonical(self) -> dict[str, Any]:
        def lst(x):
            return None if x is None else [float(v) if isinstance(v, float) else v for v in list(x)]

        role = {} if self.role is None else {"role": self.role}  # absent when unset: older data hashes hold
        off = {"off_policy": True} if self.off_policy else {}  # likewise
        return {
            **role,
            **off,
            "prompt": self.prompt,
            "completion": self.completion,
            "advantage": float(self.advantage),
            "score": None if self.score is None else float(self.score),
            "old_logprobs": lst(self.old_logprobs),
            "prompt_token_ids": lst(self.prompt_token_ids),
            "completion_token_ids": lst(self.completion_token_ids),
            "group_id": self.group_id,
        }


@dataclass
class TrainResult:
    adapter_dir: Path
    stats: dict[str, Any]
    reused: bool = False

    @property
    def steps(self) -> list[dict[str, Any]]:
        return self.stats.get("steps", [])

