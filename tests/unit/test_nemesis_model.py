"""The nemesis's reference model catches a doubled, lost or resurrected row.

A small snapshot root is written here with deltalake directly (manifest, state table, sink),
once as the protocol would leave it and then with one fault planted, and the model's check
must report exactly that fault. No Spark.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

sys.path.insert(0, str(Path(__file__).parents[2] / "scripts" / "harnesses"))

import nemesis

UTC = dt.UTC
_STATE: list[pa.Field[Any]] = [
    pa.field("word", pa.string()),
    pa.field("count", pa.int64()),
    pa.field("_key_group", pa.int32()),
    pa.field("_epoch", pa.int64()),
    pa.field("_deleted", pa.bool_()),
    pa.field("_timeout", pa.int64()),
]
STATE = pa.schema(_STATE)
_SINK: list[pa.Field[Any]] = [
    pa.field("word", pa.string()),
    pa.field("count", pa.int64()),
    pa.field("batch", pa.int64()),
]
SINK = pa.schema(_SINK)
_MANIFEST: list[pa.Field[Any]] = [
    pa.field("epoch", pa.int64()),
    pa.field("status", pa.string()),
    pa.field("recorded_at", pa.timestamp("us", tz="UTC")),
    pa.field("source_offsets", pa.string()),
    pa.field("table_versions", pa.map_(pa.string(), pa.int64())),
    pa.field("origin", pa.string()),
    pa.field("restored_from", pa.int64()),
]
MANIFEST = pa.schema(_MANIFEST)


def offset(version: int, index: int) -> str:
    return json.dumps({"source": "pyspark_abs_delta", "version": version, "index": index})


def state_rows(*rows: tuple[str, int | None, int, bool]) -> pa.Table:
    words, counts, epochs, deleted = zip(*rows, strict=True)
    n = len(rows)
    columns = [words, counts, [0] * n, epochs, deleted, [None] * n]
    return pa.Table.from_arrays(
        [pa.array(c, f.type) for c, f in zip(columns, STATE, strict=True)], schema=STATE
    )


def sink_rows(*rows: tuple[str, int, int]) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(SINK.names, r, strict=True)) for r in rows], SINK)


def make_root(
    tmp_path: Path, *, epoch_1_state: pa.Table, epoch_1_sink: pa.Table
) -> tuple[nemesis.Model, Path]:
    """Input: version 0 appends a b a, version 1 resets b and adds c, half of it to epoch 1.

    Epoch 0 reads version 0 (a=2, b=1); epoch 1 reads version 1 up to row 2 (b removed, c=1).
    """
    bronze = tmp_path / "bronze"
    rows = [[("a", False), ("b", False), ("a", False)], [("b", True), ("c", False), ("d", False)]]
    for batch in rows:
        words, resets = zip(*batch, strict=True)
        write_deltalake(
            str(bronze), pa.table({"word": list(words), "reset": list(resets)}), mode="append"
        )
    root = tmp_path / "root"
    write_deltalake(
        str(root / nemesis.STATE_TABLE), state_rows(("a", 2, 0, False), ("b", 1, 0, False))
    )
    write_deltalake(str(root / nemesis.STATE_TABLE), epoch_1_state, mode="append")
    sink = root / "sinks" / "counts"
    write_deltalake(str(sink), sink_rows(("a", 2, 0), ("b", 1, 0)))
    write_deltalake(str(sink), epoch_1_sink, mode="append")
    versions = {nemesis.STATE_TABLE: 0, nemesis.SINK_TABLE: 0}
    base = dt.datetime(2026, 1, 1, tzinfo=UTC)
    entries = [
        (0, "PREPARED", offset(1, 0), {}),
        (0, "COMMITTED", None, versions),
        (1, "PREPARED", offset(1, 2), {}),
        (1, "COMMITTED", None, {t: 1 for t in versions}),
    ]
    manifest = [
        {
            "epoch": epoch,
            "status": status,
            "recorded_at": base + dt.timedelta(seconds=i),
            "source_offsets": offsets,
            "table_versions": list(tables.items()),
            "origin": None,
            "restored_from": None,
        }
        for i, (epoch, status, offsets, tables) in enumerate(entries)
    ]
    write_deltalake(str(root / "_manifest"), pa.Table.from_pylist(manifest, MANIFEST))
    plan = nemesis.RootPlan(root, sink)
    return nemesis.Model(bronze, {root: plan}), root


GOOD_STATE = state_rows(("b", None, 1, True), ("c", 1, 1, False))
GOOD_SINK = sink_rows(("b", 0, 1), ("c", 1, 1))


def test_the_model_accepts_what_the_protocol_would_write(tmp_path: Path) -> None:
    model, root = make_root(tmp_path, epoch_1_state=GOOD_STATE, epoch_1_sink=GOOD_SINK)
    counts, notes = nemesis.check_root(model, root)
    assert (sum(counts.values()), notes, model.problems) == (0, [], [])
    _, expected = model.root(root)
    assert expected[1].state == {"a": 2, "c": 1}
    assert expected[1].gone == frozenset({"b"})


@pytest.mark.parametrize(
    ("state", "sink", "finding"),
    [
        (GOOD_STATE, sink_rows(("b", 0, 1), ("c", 1, 1), ("c", 1, 1)), "duplicated"),
        (GOOD_STATE, sink_rows(("c", 1, 1)), "lost"),
        (GOOD_STATE, sink_rows(("b", 0, 1), ("c", 1, 1), ("d", 1, 1)), "mismatches"),
        (state_rows(("c", 1, 1, False)), GOOD_SINK, "resurrected"),
        (state_rows(("b", None, 1, True), ("c", 2, 1, False)), GOOD_SINK, "mismatches"),
    ],
    ids=["doubled-sink-row", "lost-sink-row", "unexpected-sink-row", "resurrected", "wrong-count"],
)
def test_the_model_reports_a_planted_fault(
    tmp_path: Path, state: pa.Table, sink: pa.Table, finding: str
) -> None:
    model, root = make_root(tmp_path, epoch_1_state=state, epoch_1_sink=sink)
    counts, notes = nemesis.check_root(model, root)
    assert dict(+counts) == {finding: 1}, notes
    assert notes


def test_an_unreadable_root_is_counted(tmp_path: Path) -> None:
    model, root = make_root(tmp_path, epoch_1_state=GOOD_STATE, epoch_1_sink=GOOD_SINK)
    for entry in (root / "_manifest" / "_delta_log").glob("*.json"):
        entry.write_text("not json\n")
    counts, _ = nemesis.check_root(nemesis.Model(tmp_path / "bronze", model.plans), root)
    assert counts["unreadable_roots"] == 1


def test_rows_between_offsets_follow_the_delta_source_meaning() -> None:
    versions = {0: [("a", False), ("b", False)], 1: [], 2: [("c", False), ("d", True)]}
    assert nemesis.rows_between(versions, (0, 1), (2, 1)) == [("b", False), ("c", False)]
    assert nemesis.rows_between(versions, (0, 0), (3, 0)) == [*versions[0], *versions[2]]
    assert nemesis.rows_between(versions, (2, 1), (2, 1)) == []
