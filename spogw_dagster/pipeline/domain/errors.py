"""Errors the domain raises. Each message says what is wrong and the fix; `metadata` carries the numbers. At the
asset boundary `defs/failures.py` turns them into `dg.Failure` without retries (a retry meets the same input),
so the domain needs no Dagster and can be called from anywhere (the CLI, a notebook, a test)."""

from __future__ import annotations

from typing import Any, Mapping

__all__ = ["DomainError", "StaleInputError", "ExecutorOutage"]


class DomainError(Exception):
    def __init__(self, message: str, metadata: Mapping[str, Any] | None = None):
        super().__init__(message)
        self.metadata = dict(metadata or {})


class StaleInputError(DomainError):
    """An input does not belong to this config or lineage (another query set, another parent adapter):
    rematerialize it."""


class ExecutorOutage(DomainError):
    """Too many of a step's workflows failed on the executor (`domain.outage.check_outage`)."""
