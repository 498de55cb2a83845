"""Which snapshots a Kafka publisher owes its topic, checked against a model on random
schedules of commits, rollbacks and publications."""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

import pytest

from pyspark_abs.manifest.entries import EpochStatus, ManifestEntry
from pyspark_abs.manifest.publication import Publication, unpublished

SINK = "sink/output"
WHEN = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def entry(epoch: int, status: EpochStatus, **fields: Any) -> ManifestEntry:
    return ManifestEntry(
        pipeline="p", epoch=epoch, status=status, recorded_at=WHEN, run_id="run", **fields
    )


def test_each_snapshot_after_the_marker_is_owed_once_in_order() -> None:
    entries = [
        entry(0, EpochStatus.PREPARED),
        entry(0, EpochStatus.COMMITTED, table_versions={SINK: 1}),
        entry(1, EpochStatus.COMMITTED, table_versions={SINK: 1}),  # appended nothing
        entry(2, EpochStatus.COMMITTED, table_versions={SINK: 2, "state/x": 9}),
        entry(3, EpochStatus.MERGED),
        entry(4, EpochStatus.COMMITTED, table_versions={"state/x": 10}),  # another table only
    ]
    assert unpublished(entries, SINK, None) == [Publication(0, 1), Publication(2, 2)]
    assert unpublished(entries, SINK, Publication(0, 1)) == [Publication(2, 2)]
    assert unpublished(entries, SINK, Publication(2, 2)) == []


def test_a_snapshot_rolled_back_before_it_was_published_is_never_owed() -> None:
    entries = [
        entry(0, EpochStatus.COMMITTED, table_versions={SINK: 1}),
        entry(1, EpochStatus.COMMITTED, table_versions={SINK: 2}),
        entry(2, EpochStatus.COMMITTED, table_versions={SINK: 3}),
        entry(3, EpochStatus.RESTORED, restored_from=0, table_versions={SINK: 4}),
        entry(4, EpochStatus.COMMITTED, table_versions={SINK: 5}),
    ]
    assert unpublished(entries, SINK, Publication(0, 1)) == [Publication(4, 5)]
    assert unpublished(entries, SINK, Publication(1, 2)) == [Publication(4, 5)]


@pytest.mark.parametrize("seed", range(40))
def test_random_schedules_publish_what_the_model_says(seed: int) -> None:
    """Model: an epoch whose commit made a new sink version is owed from its commit until it
    is published or a rollback below it removes it; a publication sends exactly the owed
    epochs, in order. (Version 0, the table's creation, may be owed with no rows: the
    publisher sends only versions whose commit is pyspark-abs's.)"""
    rng = random.Random(seed)
    entries: list[ManifestEntry] = []
    epoch, version = 0, 0  # the sink table's version 0 may hold no epoch's rows
    seen = -1  # the newest version an epoch recorded
    owed: list[int] = []
    lineage: list[int] = []  # snapshots a rollback can go back to
    marker: Publication | None = None
    sent: list[int] = []
    for _ in range(60):
        action = rng.choice(["commit", "commit", "empty", "rollback", "publish", "publish"])
        if action in ("commit", "empty"):
            version += action == "commit"
            entries.append(entry(epoch, EpochStatus.COMMITTED, table_versions={SINK: version}))
            if version > seen:
                owed.append(epoch)
            seen = version
            lineage.append(epoch)
            epoch += 1
        elif action == "rollback" and lineage:
            target = rng.choice(lineage)
            version += 1
            seen = version
            entries.append(
                entry(
                    epoch,
                    EpochStatus.RESTORED,
                    restored_from=target,
                    table_versions={SINK: version},
                )
            )
            owed = [e for e in owed if e <= target]
            lineage = [e for e in lineage if e <= target] + [epoch]
            epoch += 1
        elif action == "publish":
            publications = unpublished(entries, SINK, marker)
            assert [p.epoch for p in publications] == owed
            sent += owed
            owed = []
            marker = publications[-1] if publications else marker
    assert sent == sorted(set(sent))
