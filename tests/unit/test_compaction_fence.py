"""When a compaction planned on one table version may commit on a later one (real tables)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from pyspark_abs.storage.rewrites import superseded

ROWS = pa.table({"word": ["a"]})


def paths(table: DeltaTable) -> list[str]:
    return [str(a["path"]) for a in pa.table(table.get_add_actions(flatten=True)).to_pylist()]


def test_appends_since_the_plan_do_not_supersede_it(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    for _ in range(3):
        write_deltalake(uri, ROWS, mode="append")
    planned = paths(DeltaTable(uri, version=2))
    write_deltalake(uri, ROWS, mode="append")
    assert superseded(DeltaTable(uri), 2, planned) is None


def test_a_restore_supersedes_the_plan_even_with_every_file_back(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    for _ in range(3):
        write_deltalake(uri, ROWS, mode="append")
    planned = paths(DeltaTable(uri, version=2))
    write_deltalake(uri, ROWS, mode="append")
    DeltaTable(uri).restore(2)  # version 4: the files of version 2, each still there
    current = DeltaTable(uri)
    assert sorted(paths(current)) == sorted(planned)
    reason = superseded(current, 2, planned)
    assert reason is not None
    assert "restored at version 4" in reason


def test_a_file_removed_since_the_plan_supersedes_it(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    for _ in range(2):
        write_deltalake(uri, ROWS, mode="append")
    planned = paths(DeltaTable(uri))
    DeltaTable(uri).delete()
    reason = superseded(DeltaTable(uri), 1, planned)
    assert reason is not None
    assert "is no longer in the table (version 2; 2 such file(s))" in reason


def test_a_restore_after_a_removal_is_named_first(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    for _ in range(2):
        write_deltalake(uri, ROWS, mode="append")
    planned = paths(DeltaTable(uri))
    DeltaTable(uri).delete()
    write_deltalake(uri, ROWS, mode="overwrite")
    reason = superseded(DeltaTable(uri), 1, planned)
    assert reason is not None
    assert "overwritten at version 3" in reason
