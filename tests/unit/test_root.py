"""The snapshot root's layout: table ids and locations are persisted, so they never change."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

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


@pytest.mark.parametrize(
    ("location", "normalized", "tag"),
    [
        ("/data/abs/wc", "/data/abs/wc", "a044dea9"),
        ("/data/abs/../abs/wc/", "/data/abs/wc", "a044dea9"),
        ("s3://bucket/abs/wc/", "s3://bucket/abs/wc", "eec80c1d"),
    ],
)
def test_a_root_is_normalized_once_and_keeps_the_tag_its_files_are_named_with(
    location: str, normalized: str, tag: str
) -> None:
    root = SnapshotRoot(location)
    assert root == normalized
    assert root.tag == tag  # persisted in file names: vacuum tells a root's files by it
    assert SnapshotRoot(root) is root


def test_a_relative_root_is_made_absolute_and_survives_pickling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    root = SnapshotRoot("roots/wc")
    assert root == str(tmp_path / "roots" / "wc")
    assert SnapshotRoot(Path("roots/wc")) == root
    copied = pickle.loads(pickle.dumps(root))
    assert type(copied) is SnapshotRoot
    assert copied == root
    assert json.loads(json.dumps({"root": root})) == {"root": str(root)}
