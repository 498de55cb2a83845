"""Which recorded source offsets a restore can rewind to."""

import json

import pytest

from pyspark_abs import SourceError
from pyspark_abs.manifest.entries import EpochStatus
from pyspark_abs.protocol.epoch_writer import now
from pyspark_abs.sources.rewind import require_rewindable, unrewindable
from tests.support.manifest import entry

DELTA = json.dumps({"source": "pyspark_abs_delta", "version": 3, "index": 0})
LOOP = json.dumps({"source": "pyspark_abs_delta", "version": 1, "index": 2, "tag": "edge"})
KAFKA = json.dumps({"clicks": {"0": 12, "1": 7}})
FILES = json.dumps({"logOffset": 4})


def test_delta_loop_heads_and_kafka_rewind_files_and_others_do_not() -> None:
    assert unrewindable(None) == []
    assert unrewindable("\n".join([DELTA, LOOP, KAFKA])) == []
    assert unrewindable("\n".join([DELTA, FILES, "17", KAFKA])) == [FILES, "17"]


def test_the_refusal_names_the_epoch_the_offset_and_what_to_do() -> None:
    snapshot = entry(
        5,
        EpochStatus.COMMITTED,
        pipeline="words",
        recorded_at=now(),
        run_id="run",
        source_offsets=f"{FILES}\n{LOOP}",
    )
    with pytest.raises(
        SourceError,
        match=r"cannot roll back to epoch 5: epoch 5 of /r was read from a source that cannot "
        r'be rewound \(its recorded offset is \{"logOffset": 4\}.*Nothing was changed.*land '
        r"the input in a bronze Delta table",
    ):
        require_rewindable(snapshot, "/r", "roll back to epoch 5")
    plain = entry(5, EpochStatus.COMMITTED, pipeline="words", recorded_at=now(), run_id="run")
    require_rewindable(plain, "/r", "x")
