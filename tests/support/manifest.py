"""Manifest entries for tests: one factory whose defaults the tests override by name."""

from __future__ import annotations

import datetime as dt
from typing import Any

from pyspark_abs.manifest.entries import EpochStatus, ManifestEntry

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def entry(
    epoch: int,
    status: EpochStatus = EpochStatus.PREPARED,
    *,
    pipeline: str = "p",
    recorded_at: dt.datetime = T0,
    run_id: str = "r",
    **fields: Any,
) -> ManifestEntry:
    """A manifest entry of pipeline ``p`` recorded at :data:`T0` by run ``r``."""
    return ManifestEntry(
        pipeline=pipeline,
        epoch=epoch,
        status=status,
        recorded_at=recorded_at,
        run_id=run_id,
        **fields,
    )
