"""Finding the checkpoint that recorded an epoch, also after rollbacks moved it aside."""

import json
from pathlib import Path

from pyspark_abs.protocol.spark_checkpoint import SUPERSEDED, ArrowFiles, CheckpointReader


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
