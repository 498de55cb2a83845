"""A group's Delta commit adds each epoch's files once, whatever a crash left committed."""

from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

from pyspark_abs.storage.files import FileEntry, files_after
from pyspark_abs.storage.store import DeltaStore

TXN = "pyspark-abs/p/sink/out"


def file(epoch: int) -> FileEntry:
    return FileEntry("sink/out", f"abs-e{epoch:012d}.parquet", 10, 1, 0)


def paths(uri: str) -> list[str]:
    actions = pa.table(DeltaTable(uri).get_add_actions(flatten=True)).to_pylist()
    return sorted(a["path"] for a in actions)


def test_files_after_skips_the_epochs_a_table_holds() -> None:
    files = {5: [file(5)], 3: [file(3)], 4: []}
    assert files_after(files, None) == [file(3), file(5)]
    assert files_after(files, 2) == [file(3), file(5)]
    assert files_after(files, 3) == [file(5)]
    assert files_after(files, 5) == []


def test_a_group_commit_is_idempotent_and_completes_a_cut_short_one(tmp_path: Path) -> None:
    uri = str(tmp_path / "sink")
    DeltaTable.create(uri, pa.schema([pa.field("word", pa.string())]))
    for epoch in (3, 4, 5):  # phase 2 commits only files that are there, at their size
        (tmp_path / "sink" / file(epoch).path).write_bytes(b"0123456789")
    store = DeltaStore()
    first = store.commit_files(uri, {3: [file(3)], 4: [file(4)]}, TXN, 4)
    assert (first.version, first.committed) == (1, True)
    again = store.commit_files(uri, {3: [file(3)], 4: [file(4)]}, TXN, 4)
    assert (again.version, again.committed) == (1, False)
    # Recovery commits a longer group ending later: only epoch 5's file is new.
    longer = store.commit_files(uri, {3: [file(3)], 4: [file(4)], 5: [file(5)]}, TXN, 5)
    assert (longer.version, longer.committed) == (2, True)
    assert paths(uri) == [file(e).path for e in (3, 4, 5)]
    assert DeltaTable(uri).transaction_version(TXN) == 5
    nothing_new = store.commit_files(uri, {5: [file(5)], 6: []}, TXN, 6)
    assert (nothing_new.version, nothing_new.committed) == (2, False)
