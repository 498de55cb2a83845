"""Other writers' commits to tables pyspark-abs writes: told apart from ours, followed by
channel readers (DELETE, OPTIMIZE), and never undone by a restore that would bring rows back."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from pyspark_abs.errors import ExternalChangeError
from pyspark_abs.install.sink_restores import keeping_other_writers
from pyspark_abs.sources.channel.log import Rewrites
from pyspark_abs.storage.commits import commits_between
from pyspark_abs.storage.files import add_actions, files_at
from pyspark_abs.storage.root import SnapshotRoot
from pyspark_abs.storage.store import DeltaStore
from pyspark_abs.storage.transactions import epoch_commit


def ours(uri: str, epoch: int, values: list[int]) -> None:
    """An epoch's commit as pyspark-abs makes it (its application transaction)."""
    props = epoch_commit("pyspark-abs/p/r/sink/out", epoch, SnapshotRoot("/root"))
    write_deltalake(uri, pa.table({"a": values}), mode="append", commit_properties=props)


def test_commits_are_told_apart_and_a_delete_then_optimize_is_followed(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    ours(uri, 0, [1, 2, 3])  # v0
    ours(uri, 1, [4, 5])  # v1
    first = [a["path"] for a in files_at(uri, 0)]
    DeltaTable(uri).delete("a = 2")  # v2
    DeltaTable(uri).optimize.compact()  # v3
    found = commits_between(uri, 0, 3)
    assert [(c.operation, c.ours, c.changes_rows) for c in found] == [
        ("WRITE", True, False),
        ("WRITE", True, False),
        ("DELETE", False, True),
        ("OPTIMIZE", False, False),
    ]
    rewrites = Rewrites(uri)
    rewrites.update(1, 3)
    survivors, chain = rewrites.survivors(first[0])
    current = [a["path"] for a in add_actions(DeltaTable(uri))]
    assert [p for p, _ in survivors] == current
    assert [c.operation for c in chain] == ["DELETE", "OPTIMIZE"]


def test_an_update_cannot_be_followed(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    ours(uri, 0, [1, 2, 3])
    path = files_at(uri, 0)[0]["path"]
    DeltaTable(uri).update(updates={"a": "a + 10"}, predicate="a = 1")
    rewrites = Rewrites(uri)
    rewrites.update(0, 1)
    with pytest.raises(ExternalChangeError, match=r"UPDATE at version 1 .* \(only DELETE and"):
        rewrites.survivors(path)


def test_a_restore_keeps_other_writers_changes_or_refuses_to_undo_them(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    store = DeltaStore()
    ours(uri, 0, [1, 2])  # v0
    ours(uri, 1, [3])  # v1
    DeltaTable(uri).optimize.compact()  # v2: no rows removed
    tables = {"sink/out": uri}
    assert keeping_other_writers(store, tables, {"sink/out": 0}, 0) == {"sink/out": 0}
    DeltaTable(uri).delete("a = 1")  # v3: a person's rows erased
    assert keeping_other_writers(store, tables, {"sink/out": 1}, 1) == {"sink/out": 3}
    with pytest.raises(ExternalChangeError, match=r"DELETE at version 3\), and going back"):
        keeping_other_writers(store, tables, {"sink/out": 0}, 0)
    assert keeping_other_writers(store, tables, {"sink/out": 0}, 0, refuse=False) == {"sink/out": 0}
