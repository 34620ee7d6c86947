"""The asset boundary: a domain error (`domain/errors.py`) becomes a `dg.Failure` with its message and metadata,
without retries (a retry meets the same input or the same dead endpoint; the fix is in the message)."""

from __future__ import annotations

import contextlib
from typing import Iterator

import dagster as dg
import polars as pl

from spogw_dagster.pipeline.domain.errors import DomainError
from spogw_dagster.pipeline.domain.outage import check_outage

__all__ = ["as_failure", "fail_on_outage"]


@contextlib.contextmanager
def as_failure() -> Iterator[None]:
    """Run domain code in an asset: its `DomainError` leaves as `dg.Failure`."""
    try:
        yield
    except DomainError as e:
        raise dg.Failure(description=str(e), metadata=e.metadata, allow_retries=False) from e


def fail_on_outage(cfg, executed: pl.DataFrame, counters: dict[str, int], *, asset: str, partition_key: str,
                   cache_path) -> None:
    """`domain.outage.check_outage` as a `dg.Failure`: too many of `executed` (rows that reached the executor)
    failed on the executor."""
    with as_failure():
        check_outage(cfg, executed, counters, asset=asset, partition_key=partition_key, cache_path=cache_path)
