"""DeltaStore against real delta-rs tables, without Spark."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import TableNotFoundError

from pyspark_abs.errors import CommitError
from pyspark_abs.operators.envelope import Kind
from pyspark_abs.protocol.precommit import TableTarget, write_files
from pyspark_abs.storage.files import FileEntry
from pyspark_abs.storage.log_files import log_entries, remove_log_below
from pyspark_abs.storage.root import file_prefix
from pyspark_abs.storage.store import KEEP_LOG, DeltaStore, TableSpec
from tests.support.inputs import arrow_schema

SCHEMA = arrow_schema(("word", pa.string()), ("count", pa.int64()))


def prepared(tmp_path: Path) -> tuple[DeltaStore, str, list[FileEntry]]:
    """A table and two files pre-written for its epoch 0, not committed."""
    store, uri = DeltaStore(), str(tmp_path / "sink")
    store.ensure_table(TableSpec("sink/output", uri, SCHEMA))
    target = TableTarget("sink/output", uri, Kind.OUTPUT, 0, SCHEMA, SCHEMA)
    rows = pa.table({"word": ["a", "b"], "count": [1, 2]}, schema=SCHEMA)
    files = write_files(target, rows, file_prefix(0, "p00000-a0"), 1)
    files += write_files(target, rows, file_prefix(0, "p00001-a0"), 1)
    return store, uri, files


def test_phase_two_refuses_a_file_that_is_gone(tmp_path: Path) -> None:
    store, uri, files = prepared(tmp_path)
    (tmp_path / "sink" / files[1].path).unlink()
    with pytest.raises(CommitError, match=rf"epoch 0: .*{files[1].path} .* is missing"):
        store.commit_files(uri, {0: files}, "app", 0)
    assert DeltaTable(uri).version() == 0
    assert DeltaTable(uri).file_uris() == []


def test_phase_two_refuses_a_file_cut_short(tmp_path: Path) -> None:
    store, uri, files = prepared(tmp_path)
    path = tmp_path / "sink" / files[0].path
    path.write_bytes(path.read_bytes()[:10])
    with pytest.raises(CommitError, match=rf"{files[0].path} of the table at .* has 10 bytes"):
        store.commit_files(uri, {0: files}, "app", 0)
    assert DeltaTable(uri).version() == 0


def test_phase_two_commits_files_that_are_there(tmp_path: Path) -> None:
    store, uri, files = prepared(tmp_path)
    assert store.commit_files(uri, {0: files}, "app", 0).committed
    assert len(DeltaTable(uri).file_uris()) == len(files)


def test_log_below_the_oldest_kept_version_is_removed_from_its_checkpoint(
    tmp_path: Path,
) -> None:
    uri = str(tmp_path / "state")
    DeltaStore().ensure_table(TableSpec("state/s", uri, SCHEMA))
    rows = pa.table({"word": ["a"], "count": [1]}, schema=SCHEMA)
    for _ in range(3):
        write_deltalake(uri, rows, mode="append")
    DeltaTable(uri).create_checkpoint()  # at version 3
    for _ in range(3):
        write_deltalake(uri, rows, mode="append")

    assert remove_log_below(uri, 2) == []  # no checkpoint at or below version 2
    removed = remove_log_below(uri, 5)
    assert removed == [f"{v:020d}.json" for v in range(3)]
    assert [DeltaTable(uri, version=v).version() for v in range(3, 7)] == [3, 4, 5, 6]
    with pytest.raises(TableNotFoundError):
        DeltaTable(uri, version=2)
    entries = log_entries(uri)
    assert entries.expired(2)
    assert not entries.expired(4)


def test_a_commit_missing_in_the_middle_is_no_expired_log(tmp_path: Path) -> None:
    uri = str(tmp_path / "state")
    DeltaStore().ensure_table(TableSpec("state/s", uri, SCHEMA))
    for _ in range(3):
        write_deltalake(uri, pa.table({"word": ["a"], "count": [1]}, schema=SCHEMA), mode="append")
    (tmp_path / "state" / "_delta_log" / f"{2:020d}.json").unlink()
    assert not log_entries(uri).expired(2)


def test_created_tables_keep_their_log_for_pyspark_abs_to_remove(tmp_path: Path) -> None:
    store, uri = DeltaStore(), str(tmp_path / "state")
    store.ensure_table(TableSpec("state/s", uri, SCHEMA))
    assert DeltaTable(uri).metadata().configuration == KEEP_LOG
    older = str(tmp_path / "older")
    DeltaTable.create(older, SCHEMA)  # as pyspark-abs created tables before
    assert store.keep_log(older)
    assert DeltaTable(older).metadata().configuration == KEEP_LOG
    assert not store.keep_log(older)
    assert DeltaTable(older).protocol().min_writer_version == 2  # no table feature needed
