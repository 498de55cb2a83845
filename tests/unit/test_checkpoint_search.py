"""Finding the checkpoint that recorded an epoch, also after rollbacks moved it aside."""

import json
from pathlib import Path

from pyspark_abs.protocol.spark_checkpoint import (
    SUPERSEDED,
    ArrowFiles,
    CheckpointReader,
    unfinished_writes,
)


def checkpoint(path: Path, query_id: str, log: dict[str, str] | None = None) -> None:
    """A checkpoint directory with its metadata and source 0's log files."""
    (path / "sources" / "0").mkdir(parents=True)
    (path / "metadata").write_text(json.dumps({"id": query_id}))
    for name, text in (log or {}).items():
        (path / "sources" / "0" / name).write_text(text)


def test_the_checkpoint_of_a_query_is_found_where_it_is_or_where_rollbacks_moved_it(
    tmp_path: Path,
) -> None:
    checkpoint(tmp_path / "ckpt", "third")
    checkpoint(tmp_path / f"ckpt-{SUPERSEDED}4", "first", {"0": "v1\n", "1.compact": "v1\n"})
    checkpoint(tmp_path / f"ckpt-{SUPERSEDED}4-1a2b3c4d", "second")
    checkpoint(tmp_path / "ckpt-other", "first")
    current = CheckpointReader(str(tmp_path / "ckpt"), ArrowFiles())
    assert [current.find(q).location for q in ("third", "second")] == [  # type: ignore[union-attr]
        str(tmp_path / "ckpt"),
        str(tmp_path / f"ckpt-{SUPERSEDED}4-1a2b3c4d"),
    ]
    first = current.find("first")
    assert first is not None
    assert first.location == str(tmp_path / f"ckpt-{SUPERSEDED}4")
    (tmp_path / f"ckpt-{SUPERSEDED}4" / "sources" / "0" / ".1.compact.crc").write_bytes(b"\x81")
    assert first.source_log(0) == {"0": "v1\n", "1.compact": "v1\n"}
    assert current.find("gone") is None


def test_what_a_stop_left_of_micro_batch_0_is_deleted_and_nothing_else(tmp_path: Path) -> None:
    tmp = ".0.0a760bad-6f86-4c57-815a-3312a9dbc9d3.tmp"
    unfinished = [tmp, f".{tmp}.crc"]
    kept = ["0.tmp", ".0.crc", ".0.0a760bad.tmp", "notes.txt", f"{tmp}.old"]
    assert unfinished_writes([*kept, *unfinished]) == unfinished

    offsets, commits = tmp_path / "ckpt" / "offsets", tmp_path / "ckpt" / "commits"
    for folder in (offsets, commits):
        folder.mkdir(parents=True)
        for name in [*kept, *unfinished]:
            (folder / name).write_bytes(b"")
    reader = CheckpointReader(str(tmp_path / "ckpt"), ArrowFiles())
    assert reader.clear_unfinished_first_batch() == [
        *(f"offsets/{n}" for n in unfinished),
        *(f"commits/{n}" for n in unfinished),
    ]
    assert sorted(p.name for p in offsets.iterdir()) == sorted(kept)
    assert sorted(p.name for p in commits.iterdir()) == sorted(kept)

    for name in unfinished:  # once Spark planned a micro-batch, its files are left alone
        (offsets / name).write_bytes(b"")
    (offsets / "0").write_text("v1\n")
    assert reader.clear_unfinished_first_batch() == []
    assert sorted(p.name for p in offsets.iterdir()) == sorted([*kept, *unfinished, "0"])
