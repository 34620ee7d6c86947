"""Lineage rules of an iteration's data: what must hold between iteration k's inputs before it trains."""

from __future__ import annotations

import polars as pl

from spogw_dagster.pipeline.domain.errors import StaleInputError

__all__ = ["check_sampled_from_parent"]


def check_sampled_from_parent(key: str, parent, sampled: pl.DataFrame) -> None:
    """Refuse to train when sampled_workflows(k) was sampled from another adapter than the one now at k-1: the
    trainer recomputes π_old from that adapter, which would then not be the policy that produced the data
    (the importance ratios and the KL anchor would be wrong, silently). Raises `StaleInputError` before
    anything is written."""
    if "parent_adapter_sha256" not in sampled.columns or sampled.height == 0:
        return
    recorded = sorted({str(v) if v is not None else "none (the base model)"
                       for v in sampled["parent_adapter_sha256"].to_list()})
    now = parent.sha256 if parent else None
    if recorded == [now if now is not None else "none (the base model)"]:
        return
    where = f"lora_checkpoint[{parent.partition}] ({parent.path})" if parent else "the base model"
    raise StaleInputError(
        f"sampled_workflows[{key}] was sampled from the adapter with sha256 {', '.join(r[:16] for r in recorded)}, "
        f"but π_{{k-1}} is now {where} with sha256 {(now or 'none')[:16]}: it was rematerialized or replaced "
        f"after iteration {key} sampled, so the π_old the trainer would recompute is not the policy that produced "
        f"these samples. Not training. Rematerialize sampled_workflows[{key}] and the assets after it for "
        f"partition {key} (e.g. `spogw run --force`, or select sampled_workflows and its downstream for partition "
        f"{key} in the UI); or restore the adapter that iteration {key} sampled from.",
        {"recorded_parent_adapter_sha256": ", ".join(recorded), "current_parent_adapter_sha256": now or "none"})
