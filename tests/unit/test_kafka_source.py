"""KafkaSource: a recorded Kafka offset becomes the startingOffsets that resume after it.

The Kafka connector cannot be installed here (Maven Central is unreachable), so the stream
itself is not run against a broker; the translation and the option checks are.
"""

from __future__ import annotations

import json

import pytest

from pyspark_abs import KafkaSource
from pyspark_abs.errors import ConfigError, SourceError
from pyspark_abs.sources.kafka.source import subscribed, with_new_partitions

SERVERS = {"kafka.bootstrap.servers": "broker:9092"}


def test_recorded_offsets_become_starting_offsets() -> None:
    # as Spark's KafkaSourceOffset writes them to offsets/<batch>: next offset to read
    recorded = '{"clicks":{"2":7,"0":1200,"10":3,"1":1187},"views":{"0":0}}'
    starting = KafkaSource.starting_offsets(recorded)
    assert json.loads(starting) == json.loads(recorded)
    assert starting == '{"clicks":{"0":1200,"1":1187,"2":7,"10":3},"views":{"0":0}}'


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ('{"logOffset":4}', "topic 'logOffset' has no partitions"),
        ('{"source": "pyspark_abs_delta", "version": 3, "index": 0}', "has no partitions"),
        ('{"clicks":{"0":"12"}}', "'clicks' partition '0': '12'"),
        ('{"clicks":{"x":12}}', "'clicks' partition 'x': 12"),
        ("[]", "not a JSON object of topics"),
        ("not json", "not a JSON object of topics"),
    ],
)
def test_other_sources_offsets_are_refused(line: str, why: str) -> None:
    with pytest.raises(SourceError, match=rf"offset .* is not a Kafka offset \(.*{why}"):
        KafkaSource.starting_offsets(line)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": "clicks"}, "'kafka.bootstrap.servers'"),
        (SERVERS, r"exactly one of \['subscribe', 'subscribePattern', 'assign'\].*none"),
        ({**SERVERS, "subscribe": "a", "assign": "{}"}, r"got \['subscribe', 'assign'\]"),
    ],
)
def test_bad_options_are_refused(options: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        KafkaSource(options)


def test_partitions_created_since_the_snapshot_start_at_their_earliest_offset() -> None:
    recorded = {"clicks": {"0": 12, "1": 7}}
    now = {"clicks": [0, 1, 2], "views": [0]}
    assert with_new_partitions(recorded, now) == {
        "clicks": {"0": 12, "1": 7, "2": -2},
        "views": {"0": -2},
    }
    assert recorded == {"clicks": {"0": 12, "1": 7}}
    assert with_new_partitions(recorded, {}) == recorded


def test_the_topics_a_subscription_reads_are_those_named_or_matched() -> None:
    topics = ["clicks", "clicks-eu", "views"]
    assert subscribed({"subscribe": "views, clicks,gone"}, topics) == ["clicks", "views"]
    assert subscribed({"subscribePattern": "clicks.*"}, topics) == ["clicks", "clicks-eu"]
    assert subscribed({"subscribePattern": "click"}, topics) == []
