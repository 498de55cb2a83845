"""How long vacuum keeps a sink's removed files: the table's own Delta setting, read as Delta
writes it; an unreadable one keeps the default week (the longer wait loses nothing)."""

from __future__ import annotations

import pytest

from pyspark_abs.upkeep.retention import (
    DELTA_DELETED_FILE_RETENTION_SECONDS,
    deleted_file_retention_seconds,
)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("interval 7 days", 7 * 86_400),
        ("interval 1 hour", 3600),
        ("INTERVAL 90 MINUTES", 5400),
        ("interval 0 seconds", 0),
        ("interval 2 weeks 1 day", 15 * 86_400),
        ("interval 1500 milliseconds", 1.5),
        ("36 hours", 36 * 3600),
    ],
)
def test_a_set_retention_is_read_in_seconds(value: str, seconds: float) -> None:
    assert deleted_file_retention_seconds({"delta.deletedFileRetentionDuration": value}) == seconds


@pytest.mark.parametrize(
    "value",
    [
        "",
        "interval",
        "interval seven days",
        "interval 3 fortnights",
        "interval -1 days",
        "interval 1",
    ],
)
def test_an_unreadable_retention_keeps_a_week(value: str) -> None:
    properties = {"delta.deletedFileRetentionDuration": value}
    assert deleted_file_retention_seconds(properties) == DELTA_DELETED_FILE_RETENTION_SECONDS


def test_an_unset_retention_is_deltas_default_week() -> None:
    assert deleted_file_retention_seconds({}) == 7 * 86_400
