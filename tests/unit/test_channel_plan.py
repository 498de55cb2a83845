"""Barrier alignment over channels (pure planning), against a model of upstream histories."""

from __future__ import annotations

import json
import random

import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from pyspark_abs.errors import ConfigError, OperatorDefinitionError
from pyspark_abs.sources.channel.log import Channel
from pyspark_abs.sources.channel.plan import (
    NO_BARRIER,
    ChannelOffset,
    Upstream,
    UpstreamEpoch,
    channel_offsets,
    frontier_of,
    next_epoch,
)
from pyspark_abs.sources.channel.source import ChannelSource
from pyspark_abs.storage.root import SnapshotRoot


@pytest.mark.parametrize("seed", range(40))
def test_a_stage_reads_each_epoch_once_in_order_only_after_every_upstream_committed_it(
    seed: int,
) -> None:
    rng = random.Random(seed)
    stages = rng.randint(1, 3)
    epochs = rng.randint(1, 12)
    # The model: each upstream commits its epochs in groups; a poll by the downstream
    # happens between any two commits. An epoch is readable once every upstream has
    # committed a group that reaches it (idle epochs included: a later commit closes them).
    groups: list[list[tuple[int, int]]] = []  # per upstream: (group end, version)
    for _ in range(stages):
        interval = rng.randint(1, 3)
        ends, epoch, version = [], -1, 0
        while epoch < epochs - 1:
            epoch = min(epochs - 1, epoch + rng.randint(1, interval))
            version += 1
            ends.append((epoch, version))
        groups.append(ends)
    idle = [{e for e in range(epochs) if rng.random() < 0.2} for _ in groups]
    schedule = [s for s, ends in enumerate(groups) for _ in ends]
    rng.shuffle(schedule)
    committed = [0] * stages  # groups committed so far, per upstream
    read: list[int] = []
    start = 0

    def views() -> list[Upstream]:
        found = []
        for s, ends in enumerate(groups):
            entries = []
            previous = -1
            for end, version in ends[: committed[s]]:
                for e in range(previous + 1, end + 1):
                    # an idle epoch at a group's end still closes it (its snapshot is recorded)
                    if e not in idle[s] or e == end:
                        entries.append(UpstreamEpoch(e, version))
                previous = end
            found.append(Upstream.of(f"up{s}", entries))
        return found

    def model_visible() -> int:
        return min((groups[s][committed[s] - 1][0] if committed[s] else -1) for s in range(stages))

    for upstream in [*schedule, None]:
        if upstream is not None:
            committed[upstream] += 1
        while True:
            end = next_epoch(start, views())
            if end == start:
                break
            assert end == start + 1, "one upstream epoch per micro-batch"
            assert start <= model_visible(), (
                f"read epoch {start} before every upstream committed it"
            )
            read.append(start)
            start = end
    assert read == list(range(epochs))


def test_barriers_of_idle_epochs_are_those_of_the_epoch_before() -> None:
    upstream = Upstream.of("bronze", [UpstreamEpoch(0, 3), UpstreamEpoch(2, 5)])
    assert [upstream.barrier(e) for e in range(3)] == [3, 3, 5]
    assert Upstream.of("bronze", []).barrier(4) == NO_BARRIER
    assert upstream.visible_through == 2


def test_availablenow_stops_at_the_frontier_pinned_at_the_start() -> None:
    ups = [
        Upstream.of("a", [UpstreamEpoch(e, e) for e in range(5)]),
        Upstream.of("b", [UpstreamEpoch(e, e) for e in range(3)]),
    ]
    assert frontier_of(ups) == 2
    assert next_epoch(2, ups, frontier=1) == 2
    assert next_epoch(1, ups, frontier=1) == 2
    assert next_epoch(3, ups) == 3, "b has not committed epoch 3"


@pytest.mark.parametrize(
    ("epoch", "message"),
    [(3, "restore epoch that installs its epoch 1"), (2, "taken back by restore epoch 3")],
)
def test_a_rollback_of_one_upstream_alone_is_refused(epoch: int, message: str) -> None:
    entries = [UpstreamEpoch(e, e) for e in range(3)]
    entries.append(UpstreamEpoch(3, 3, restored_from=1))
    upstream = Upstream.of("silver", entries)
    with pytest.raises(ValueError, match=message):
        next_epoch(epoch, [upstream])
    assert next_epoch(1, [upstream]) == 2, "epoch 1 is on the kept timeline"


def test_offsets_round_trip_and_bad_ones_are_named() -> None:
    offset = ChannelOffset(4, {"wc": 7})
    assert ChannelOffset.parse(offset.to_dict()) == offset
    assert channel_offsets(
        '{"source":"pyspark_abs_delta","version":1,"index":0}\n'
        + '{"source":"pyspark_abs_channel","epoch":4,"barriers":{}}'
    ) == [ChannelOffset(4)]
    for bad, match in [
        ('{"source":"pyspark_abs_channel","epoch":-1}', "epoch must be"),
        ('{"source":"pyspark_abs_channel","epoch":1,"barriers":{"a":"x"}}', "barriers"),
        ("not json", "not JSON"),
        ('{"source":"other"}', "not an offset"),
    ]:
        with pytest.raises(ValueError, match=match):
            ChannelOffset.parse(bad)


_TYPES = {"string": StringType(), "long": LongType()}


def _channel(name: str, ddl: str) -> Channel:
    """A channel of stage ``name`` whose rows have the columns ``ddl`` ("k string, x long")."""
    fields = [StructField(n, _TYPES[t]) for n, t in (c.split() for c in ddl.split(", "))]
    schema = StructType(fields).json()
    return Channel(
        name, name, SnapshotRoot(f"/roots/{name}"), "sink/output", f"/tables/{name}", schema
    )


def test_a_fan_in_unites_the_columns_and_names_each_rows_channel() -> None:
    source = ChannelSource.of(_channel("a", "k string, x long"), _channel("b", "k string, y long"))
    assert source.fan_in
    assert source.schema().simpleString() == "struct<k:string,x:bigint,y:bigint,channel:string>"
    single = ChannelSource.of(_channel("a", "k string, x long"))
    assert single.schema().simpleString() == "struct<k:string,x:bigint>"


@pytest.mark.parametrize(
    ("channels", "match"),
    [
        ((("a", "k string"), ("b", "k long")), "column 'k' is string in one channel"),
        ((("a", "k string, channel string"), ("b", "k string")), "already has"),
        ((("a", "k string"), ("a", "k string")), "repeat a name"),
    ],
)
def test_channels_that_do_not_fit_together_are_refused(
    channels: tuple[tuple[str, str], ...], match: str
) -> None:
    with pytest.raises(OperatorDefinitionError, match=match):
        ChannelSource.of(*(_channel(n, d) for n, d in channels)).schema()


def test_a_bad_starting_epoch_is_refused() -> None:
    with pytest.raises(ConfigError, match="starting_epoch"):
        ChannelSource((_channel("a", "k string"),), starting_epoch=-1)


def test_a_reader_started_after_a_job_rollback_reads_the_timeline_the_job_continues() -> None:
    """bronze: epochs 0..2, a job rollback to 1 as restore epoch 3, then epochs 4 and 5. A
    stage added since reads 0 and 1, skips 2 (taken back), reads nothing at 3, then 4, 5."""
    entries = [UpstreamEpoch(e, e + 1) for e in range(3)]
    entries += [UpstreamEpoch(3, 4, restored_from=1, job=True), UpstreamEpoch(4, 5)]
    bronze = Upstream.of("bronze", [*entries, UpstreamEpoch(5, 6)])
    start, read = 0, []
    while (end := next_epoch(start, [bronze])) != start:
        read.append((start, bronze.taken_back(start)))
        start = end
    assert read == [(0, False), (1, False), (2, True), (3, False), (4, False), (5, False)]
    alone = Upstream.of("bronze", [*entries[:3], UpstreamEpoch(3, 4, restored_from=1)])
    with pytest.raises(ValueError, match="rolled back on its own"):
        next_epoch(2, [alone])
    assert not alone.taken_back(2)


def test_an_offset_names_the_channels_whose_epoch_it_skipped() -> None:
    offset = ChannelOffset(3, {"bronze": 3}, ("bronze",))
    parsed = ChannelOffset.parse(json.dumps(offset.to_dict()))
    assert (parsed, parsed.taken_back) == (offset, ("bronze",))
    assert "taken_back" not in ChannelOffset(3).to_dict()
    with pytest.raises(ValueError, match="taken_back must list"):
        ChannelOffset.parse('{"source":"pyspark_abs_channel","epoch":1,"taken_back":"x"}')
