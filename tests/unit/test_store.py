"""DeltaStore against real delta-rs tables, without Spark."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from pyspark_abs.barrier import FileEntry
from pyspark_abs.envelope import Kind
from pyspark_abs.errors import CommitError
from pyspark_abs.precommit import TableTarget, file_prefix, write_files
from pyspark_abs.store import DeltaStore, TableSpec
from tests.conftest import arrow_schema

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
