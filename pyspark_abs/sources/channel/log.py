"""Channels as their upstream manifests show them: which epochs are visible, which files.

A channel is one output of an upstream stage: a Delta table its epochs commit to. Which
rows an upstream epoch holds comes from the upstream stage's manifest (the files its
PREPARED entry lists for the channel table), and whether they are visible from its
COMMITTED and MERGED entries, so a reader never sees rows of an epoch that is not committed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark_abs.errors import ExternalChangeError
from pyspark_abs.manifest.entries import MANIFEST_SCHEMA, EpochStatus, ManifestEntry, entries_of
from pyspark_abs.manifest.log import EpochLog
from pyspark_abs.sources.channel.plan import Upstream, UpstreamEpoch
from pyspark_abs.sources.delta.files import DeltaFilePartition, read_slice
from pyspark_abs.sources.delta.log import DeltaLog, ReadSchema
from pyspark_abs.storage.commits import Commit, commits_between
from pyspark_abs.storage.files import FileEntry
from pyspark_abs.storage.root import SnapshotRoot

if TYPE_CHECKING:
    from pyspark_abs.storage.store import DeltaStore

_VISIBLE = frozenset(
    {EpochStatus.COMMITTED, EpochStatus.MERGED, EpochStatus.RESTORED, EpochStatus.EXPIRED}
)

CHANNEL_COLUMN = "channel"
"""The column naming each row's channel, in the rows of a source with several channels."""


@dataclass(frozen=True)
class Channel:
    """One output of an upstream stage, read by a downstream stage.

    Build it with ``Pipeline.channel(output)``.

    Attributes:
        name: The channel's name: the upstream stage, or ``stage.output`` when the stage
            has several outputs.
        stage: The upstream stage (pipeline) name.
        root: The upstream stage's snapshot root.
        table: The channel's table id in the upstream manifest (``sink/<output>``).
        uri: The channel table's location.
        schema: The rows' Spark schema, as JSON.
    """

    name: str
    stage: str
    root: SnapshotRoot
    table: str
    uri: str
    schema: str

    def upstream(self, log: EpochLog) -> Upstream:
        """The upstream history of this channel, from the upstream manifest."""
        epochs = []
        for epoch in sorted({e.epoch for e in log.entries}):
            entry = log.latest(epoch)
            if entry is None or entry.status not in _VISIBLE:
                continue
            closing = log.latest(epoch if entry.snapshot_epoch is None else entry.snapshot_epoch)
            barrier = None if closing is None else closing.table_versions.get(self.table)
            restored = entry.restored_from if entry.is_restore else None
            epochs.append(UpstreamEpoch(epoch, barrier, restored, _job_wide(entry)))
        return Upstream.of(self.stage, epochs)

    def files(self, log: EpochLog, epoch: int) -> list[FileEntry]:
        """The channel's files of an upstream epoch: none for an idle epoch."""
        prepared = log.prepared(epoch)
        if prepared is None or prepared.is_restore:
            return []
        return [f for f in prepared.files if f.table == self.table]


def _job_wide(entry: ManifestEntry) -> bool:
    """Whether ``entry`` is a stage's part of a job-wide decision."""
    return entry.restore is not None and entry.restore.job is not None


def channels_of(value: str) -> Sequence[Channel]:
    """The channels of the data source's ``channels`` option."""
    return [Channel(**{**c, "root": SnapshotRoot(c["root"])}) for c in json.loads(value)]


class ManifestFollower:
    """An upstream stage's manifest, kept up to date by reading only what is appended.

    The first read is a full one. After that, each new Delta version of the manifest that
    only appends rows (every write of the protocol) is read from its own files, so a reader
    following a long-running stage does not reread the whole history at every upstream
    commit. A version that does anything else (a compaction's rewrite, a schema change)
    makes the read a full one again.

    Args:
        root: The upstream stage's snapshot root.
    """

    def __init__(self, root: SnapshotRoot) -> None:
        self.uri = root.manifest_uri
        self._version: int | None = None
        self._entries: list[ManifestEntry] = []
        self._epochs: EpochLog | None = None
        self._log: DeltaLog | None = None
        self.full_reads = 0
        """How many times the whole manifest was read (the first time included)."""

    def read(self, store: DeltaStore) -> EpochLog | None:
        """The manifest as of its latest version; None while the stage has none.

        Raises:
            ManifestError: The manifest cannot be read or breaks the epoch state machine.
            SourceError: Its Delta log cannot be listed.
        """
        if self._epochs is None and not store.exists(self.uri):
            return None
        if self._log is None:
            version = int(store.open(self.uri).version())
        else:
            # a stream polls this between micro-batches: a look for the next commit file
            # instead of bringing the table up to date (a listing of its whole log)
            version = self._log.latest_version()
        if self._epochs is not None and version == self._version:
            return self._epochs
        appended = self._appended(version) if self._log is not None else None
        if appended is None:
            # the store's schema helpers: not in Spark's Python workers
            from pyspark_abs.operators.arrow_types import to_spark
            from pyspark_abs.storage.schemas import arrow_schema

            table = store.open(self.uri)
            rows, version = store.read_versioned(self.uri)
            self._entries = entries_of(rows)
            self._log = DeltaLog(self.uri, ReadSchema(to_spark(arrow_schema(table)), (), version))
            self.full_reads += 1
        else:
            self._entries.extend(appended)
        self._version, self._epochs = version, EpochLog(self._entries, version)
        return self._epochs

    def _appended(self, version: int) -> list[ManifestEntry] | None:
        """The rows versions after the cached one appended; None if one does more."""
        assert self._log is not None
        assert self._version is not None
        rows: list[ManifestEntry] = []
        for number in range(self._version + 1, version + 1):
            parsed = self._log.version(number)
            if parsed.blocked is not None:
                return None
            for data in parsed.files:
                part = DeltaFilePartition(self.uri, number, data.path, 0, data.rows, ())
                for batch in read_slice(part, MANIFEST_SCHEMA):
                    rows.extend(entries_of(batch))
        self._log.forget_before(version + 1)
        return rows


Survivor = tuple[str, tuple[tuple[str, str | None], ...]]
"""A file holding rows of a rewritten one: its path and partition values."""

_FOLLOWED = frozenset({"DELETE"})
"""Operations of other writers that remove rows and that a reader follows: their removed
rows are left out of the epochs not read yet (a compaction, which keeps every row, is
followed too)."""


class Rewrites:
    """Another writer's rewrites of a channel table's files (a ``DELETE``, an ``OPTIMIZE``).

    A reader reads an upstream epoch from the files its PREPARED entry lists. When another
    writer has removed one of them since, the rows still in the table are those of the files
    that replaced it, transitively; the reader keeps the listed file's rows that are still
    there (see :meth:`survivors`).

    Args:
        uri: The channel table.
    """

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self._read_through = -1
        self._replaced: dict[str, Commit] = {}

    def update(self, first: int, last: int) -> None:
        """Read the table's commits up to version ``last``, from ``first`` if not read yet."""
        start = max(first, self._read_through + 1)
        for commit in commits_between(self.uri, start, last):
            if not commit.ours:
                for path in (*commit.removed, *commit.rewritten):
                    self._replaced[path] = commit
        self._read_through = max(self._read_through, last)

    def replaced_by(self, path: str) -> Commit | None:
        """The other writer's commit that removed ``path``, if one did."""
        return self._replaced.get(path)

    def survivors(self, path: str) -> tuple[tuple[Survivor, ...], tuple[Commit, ...]]:
        """The files now holding what remains of ``path``'s rows, and the commits between.

        Raises:
            ExternalChangeError: A commit between changed rows otherwise than by deleting.
        """
        found: dict[str, Survivor] = {}
        chain: list[Commit] = []
        pending: list[Survivor] = [(path, ())]
        while pending:
            current, values = pending.pop()
            commit = self._replaced.get(current)
            if commit is None:
                found[current] = (current, values)
                continue
            if commit.changes_rows and commit.operation not in _FOLLOWED:
                raise ExternalChangeError(
                    f"{commit.operation} at version {commit.version} of {self.uri}, by a writer "
                    f"other than pyspark-abs, changed rows of {current}; a reader cannot tell "
                    f"which of the new rows belong to which upstream epoch (only DELETE and "
                    f"OPTIMIZE can be followed)"
                )
            chain.append(commit)
            pending.extend((p, commit.partitions.get(p, ())) for p in commit.added)
        return tuple(found[p] for p in sorted(found)), tuple(chain)
