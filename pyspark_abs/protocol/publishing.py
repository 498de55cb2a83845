"""Exactly-once publishing of a sink's committed snapshots to a Kafka topic.

The sink's Delta table is the outbox: phase 1 pre-commits the rows with the epoch, phase 2
commits them with every other table. Then each COMMITTED snapshot's rows go to the topic in
one Kafka transaction, together with a marker record naming the snapshot on a marker topic of
the sink's own. ``read_committed`` consumers see a snapshot's records only once its epoch is
committed, and each snapshot once: at start, a crashed run's open transaction is aborted
(Kafka's ``initTransactions``, which also fences a zombie run), the marker says which
snapshot the topic holds last, and the snapshots after it are sent again from the table.

Kafka's participation in an outside two-phase commit (KIP-939) would let phase 1 write into
the topic itself; no Kafka release and no Python client offer it yet.
"""

from __future__ import annotations

import datetime as dt
import json
import time
import traceback
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from pyspark_abs.errors import ExternalChangeError, FencingError, PublishError
from pyspark_abs.faults import FaultInjector, FaultStep
from pyspark_abs.logs import logger
from pyspark_abs.manifest.entries import ManifestEntry
from pyspark_abs.manifest.publication import Publication, unpublished
from pyspark_abs.storage.commits import read_commit
from pyspark_abs.storage.files import read_added

log = logger(__name__)

EPOCH_HEADER = "pyspark-abs-epoch"
"""Header of every published record: the snapshot (epoch) that committed it."""
_TAIL = 64


@dataclass(frozen=True)
class KafkaTarget:
    """Where and how one sink's rows are published.

    Attributes:
        uri: The sink table.
        table: The sink table's id in the manifest.
        output: The operator output the sink holds.
        topic: The topic its records go to.
        servers: Kafka bootstrap servers.
        key: The column whose text is each record's key (None: no key).
        value: A string or binary column that is each record's value (None: the row as JSON).
        options: More producer settings (security, compression, ...).
        timeout_s: How long each Kafka call may wait.
        transactional_id: Bound to the root and the output; a second run with the same id
            fences the first.
        schema: The sink's columns.
    """

    uri: str
    table: str
    output: str
    topic: str
    servers: str
    key: str | None
    value: str | None
    options: Mapping[str, str]
    timeout_s: float
    transactional_id: str
    schema: pa.Schema = field(compare=False)

    @property
    def marker_topic(self) -> str:
        """The compacted one-partition topic whose last record names the last snapshot sent."""
        return self.transactional_id


class KafkaPublisher:
    """Publishes the committed snapshots of one sink that its topic does not hold yet."""

    def __init__(self, target: KafkaTarget, faults: FaultInjector) -> None:
        self.target = target
        self.faults = faults
        self._producer: Any = None
        self._published: Publication | None = None

    def publish(self, entries: Iterable[ManifestEntry]) -> list[int]:
        """Send every snapshot the marker does not cover yet; return their epochs.

        Raises:
            FencingError: Another run took this sink's transactional id over.
            PublishError: Kafka refused or timed out; the snapshots stay owed and the next
                start sends them.
            ExternalChangeError: A file an owed snapshot added to the table is gone.
        """
        if self._producer is None:
            self._open()
        owed = unpublished(entries, self.target.table, self._published)
        for publication in owed:
            self._send(publication)
            self._published = publication
        return [p.epoch for p in owed]

    def close(self) -> None:
        """Let the producer go.

        An open transaction of a failed publication is aborted by the next run's start, or
        by Kafka's transaction timeout.
        """
        producer, self._producer = self._producer, None
        if producer is None:
            return
        try:
            producer.purge()
            producer.flush(0)
        except _client().KafkaException as err:  # a fenced or failed producer has nothing left
            log.debug("sink %r: producer closed after %s", self.target.output, err)

    def _open(self) -> None:
        kafka = _client()
        target = self.target
        try:
            _ensure_marker_topic(kafka, target)
            self._producer = kafka.Producer(
                {
                    "bootstrap.servers": target.servers,
                    "transactional.id": target.transactional_id,
                    "enable.idempotence": True,
                    "acks": "all",
                    **target.options,
                }
            )
            self._producer.init_transactions(target.timeout_s)
            self._published = _last_marker(kafka, target)
        except BaseException as err:
            self.close()
            _release_clients(err)
            if isinstance(err, kafka.KafkaException):
                raise self._error("could not start publishing", None, err) from err
            raise
        log.info(
            "sink %r publishes to topic %r as %r; its topic holds snapshot %s",
            target.output,
            target.topic,
            target.transactional_id,
            "none" if self._published is None else self._published.epoch,
        )

    def _send(self, publication: Publication) -> None:
        # The producer is only reached through self: an error the caller keeps (PySpark keeps
        # a batch's) holds this frame, and close() must be able to free the producer.
        kafka = _client()
        target = self.target
        commit = read_commit(target.uri, publication.version)
        if commit is None:
            raise PublishError(
                f"sink {target.output!r}: version {publication.version} of {target.uri}, the "
                f"commit of snapshot {publication.epoch}, is gone from its log, so its rows "
                f"cannot be published to topic {target.topic!r}. Restore the table's log, or "
                f"roll back to an earlier snapshot"
            )
        if not commit.ours:
            log.info(
                "sink %r: snapshot %d appended nothing (version %d is not an epoch's commit)",
                target.output,
                publication.epoch,
                publication.version,
            )
            return
        try:
            rows = read_added(target.uri, commit.added, commit.partitions, target.schema)
        except OSError as err:
            raise self._gone(publication, err) from err
        headers = [(EPOCH_HEADER, str(publication.epoch).encode())]
        marker = json.dumps({"epoch": publication.epoch, "version": publication.version})
        try:
            self._producer.begin_transaction()
            for key, value in records(rows, target.key, target.value):
                self._produce(target.topic, key, value, headers)
            self._produce(target.marker_topic, target.transactional_id, marker, headers)
            self._producer.flush(target.timeout_s)
            self.faults.at(FaultStep.DURING_PUBLISH, publication.epoch)
            self._producer.commit_transaction(target.timeout_s)
        except kafka.KafkaException as err:
            error = err.args[0] if err.args else None
            if error is not None and error.fatal():
                raise FencingError(
                    f"sink {target.output!r}: Kafka fenced the publisher of snapshot "
                    f"{publication.epoch} (transactional id {target.transactional_id!r}): "
                    f"another run of this root publishes now. Stop this one"
                ) from err
            self._producer.abort_transaction(target.timeout_s)
            raise self._error("could not publish", publication.epoch, err) from err
        log.info(
            "sink %r: snapshot %d published to topic %r (%d records)",
            target.output,
            publication.epoch,
            target.topic,
            rows.num_rows,
        )

    def _produce(self, topic: str, key: str | None, value: object, headers: Any) -> None:
        while True:
            try:
                self._producer.produce(topic, value=value, key=key, headers=headers)
                return
            except BufferError:
                self._producer.poll(1.0)

    def _gone(self, publication: Publication, err: OSError) -> ExternalChangeError:
        target = self.target
        return ExternalChangeError(
            f"sink {target.output!r}: snapshot {publication.epoch} is owed to topic "
            f"{target.topic!r}, but a file its commit (version {publication.version} of "
            f"{target.uri}) added is gone ({err}): the table was compacted and vacuumed (an "
            f"OPTIMIZE, then a VACUUM) before the snapshot was published. Restore the file "
            f"from a backup; the topic gets this root's snapshots in order, and a rollback "
            f"cannot go back past the VACUUM either"
        )

    def _error(self, what: str, epoch: int | None, err: BaseException) -> PublishError:
        target = self.target
        snapshot = "" if epoch is None else f" snapshot {epoch} of"
        return PublishError(
            f"sink {target.output!r}: {what}{snapshot} to topic {target.topic!r} at "
            f"{target.servers}, each call waiting up to {target.timeout_s:g} s: {err}. The "
            f"snapshot is committed in {target.uri} and stays owed to the topic: start the "
            f"pipeline again once Kafka is reachable (a slow Kafka: a larger "
            f"KafkaSink(timeout_s=...)), and it is sent exactly once"
        )


def records(
    rows: pa.Table, key: str | None, value: str | None
) -> Iterable[tuple[str | None, str | bytes]]:
    """Each row's record key and value: ``value``'s column, or the row as JSON."""
    for row in rows.to_pylist():
        record_key = None if key is None or row[key] is None else str(row[key])
        yield record_key, row[value] if value is not None else json.dumps(row, default=_json)


def _json(value: object) -> str:
    if isinstance(value, (dt.date, dt.datetime, dt.time)):
        return value.isoformat()
    return str(value)


def _release_clients(err: BaseException) -> None:
    """Drop the locals of the finished frames that ``err`` passed through.

    Such a local may be a Kafka client of the call that failed. The error may be kept long
    after (PySpark keeps a batch's), and a client lives, retrying its brokers, as long as
    something holds it.
    """
    traceback.clear_frames(err.__traceback__)


def _client() -> Any:
    try:
        import confluent_kafka
        import confluent_kafka.admin
    except ImportError as err:
        raise PublishError(
            "a KafkaSink needs the confluent-kafka package: pip install 'pyspark-abs[kafka]'"
        ) from err
    return confluent_kafka


def _ensure_marker_topic(kafka: Any, target: KafkaTarget) -> None:
    admin = kafka.admin.AdminClient({"bootstrap.servers": target.servers, **target.options})
    if target.marker_topic in admin.list_topics(timeout=target.timeout_s).topics:
        return
    config = {"cleanup.policy": "compact", "segment.ms": "3600000"}
    topic = kafka.admin.NewTopic(target.marker_topic, num_partitions=1, config=config)
    try:
        admin.create_topics([topic])[target.marker_topic].result(target.timeout_s)
    except kafka.KafkaException as err:
        if err.args[0].code() != kafka.KafkaError.TOPIC_ALREADY_EXISTS:
            raise
    deadline = time.monotonic() + target.timeout_s
    while not _has_leader(admin, target):  # a new topic's leader comes later
        if time.monotonic() > deadline:
            raise PublishError(
                f"sink {target.output!r}: marker topic {target.marker_topic!r} at "
                f"{target.servers} has no leader {target.timeout_s:g} s after its creation. "
                f"Check the broker"
            )
        time.sleep(0.05)


def _has_leader(admin: Any, target: KafkaTarget) -> bool:
    topic = target.marker_topic
    found = admin.list_topics(topic, timeout=target.timeout_s).topics.get(topic)
    partition = None if found is None or found.error else found.partitions.get(0)
    return partition is not None and partition.leader >= 0


def _last_marker(kafka: Any, target: KafkaTarget) -> Publication | None:
    """The last snapshot the marker topic names: its last committed record, read from the end."""
    consumer = kafka.Consumer(
        {
            "bootstrap.servers": target.servers,
            "group.id": target.transactional_id,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 10,  # the end of the partition is all it waits for
            **target.options,
        }
    )
    try:
        partition = kafka.TopicPartition(target.marker_topic, 0)
        low, high = consumer.get_watermark_offsets(partition, target.timeout_s, cached=False)
        for start in dict.fromkeys((max(low, high - _TAIL), low)):
            found = _read_markers(kafka, consumer, target, start)
            if found is not None or high == low:
                return found
        return None
    finally:
        consumer.close()


def _read_markers(kafka: Any, consumer: Any, target: KafkaTarget, start: int) -> Publication | None:
    consumer.assign([kafka.TopicPartition(target.marker_topic, 0, start)])
    last = None
    while True:
        message = consumer.poll(target.timeout_s)
        if message is None:
            raise PublishError(
                f"sink {target.output!r}: reading marker topic {target.marker_topic!r} at "
                f"{target.servers} timed out after {target.timeout_s:g} s. Check the broker"
            )
        if message.error():
            if message.error().code() == kafka.KafkaError._PARTITION_EOF:
                return last
            raise kafka.KafkaException(message.error())
        if message.key() == target.transactional_id.encode():
            marker = json.loads(message.value())
            last = Publication(int(marker["epoch"]), int(marker["version"]))
