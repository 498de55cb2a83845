"""The snapshot root's layout: table ids and locations are persisted, so they never change."""

from __future__ import annotations

import pytest

from pyspark_abs.errors import SnapshotNotFoundError
from pyspark_abs.storage.root import SnapshotRoot, backedge_table, sink_table, state_table


def test_table_ids_keep_their_spelling() -> None:
    assert state_table("wc") == "state/wc"
    assert sink_table("out") == "sink/out"
    assert backedge_table("offers") == "backedge/offers"


def test_locations_under_the_root() -> None:
    root = SnapshotRoot("file:///r")
    assert root.manifest_uri == "file:///r/_manifest"
    assert root.table_uri(state_table("wc")) == "file:///r/state/wc"


def test_a_location_without_a_manifest_is_not_a_root() -> None:
    with pytest.raises(
        SnapshotNotFoundError,
        match=r"^/x is not a pyspark-abs snapshot root \(it has no _manifest table\)$",
    ):
        raise SnapshotRoot("/x").not_found()
