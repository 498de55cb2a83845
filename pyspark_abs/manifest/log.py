"""The epoch log: every manifest entry of a pipeline, and the rules over groups of epochs."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from pyspark_abs.errors import ManifestError, SnapshotNotFoundError
from pyspark_abs.logs import logger
from pyspark_abs.manifest.entries import (
    SNAPSHOT_STATUSES,
    TAG_STATUSES,
    EpochDecision,
    EpochStatus,
    ManifestEntry,
    check_transition,
    commit_order,
)
from pyspark_abs.storage.root import SnapshotRoot

log = logger(__name__)

_TAG_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,99}")


class EpochLog:
    """The manifest folded into the current status of every epoch.

    A manifest written before appends were compare-and-swap may hold a transition twice
    (two vacuums both recorded EXPIRED, two rollbacks both PREPARED one restore epoch, a
    zombie recorded a second COMMITTED). Loading keeps the first one recorded and ignores
    the later ones with a warning (:attr:`duplicates`), instead of refusing the root.

    TAGGED and UNTAGGED rows name snapshots (named savepoints); they are folded after the
    transitions, in the order the manifest's commits recorded them (never by the writers'
    clocks), into :meth:`tags`.
    """

    def __init__(self, entries: Iterable[ManifestEntry] = (), version: int | None = None) -> None:
        """Fold entries into the log.

        Args:
            entries: Manifest entries, in any order.
            version: The manifest table's Delta version the entries were read at; appends
                are made against it (None: not read from a manifest, appends unconditional).

        Raises:
            ManifestError: The entries break the epoch state machine (other than by a
                duplicated transition).
        """
        self.version = version
        self._entries: list[ManifestEntry] = []
        self._latest: dict[int, ManifestEntry] = {}
        self._prepared: dict[int, ManifestEntry] = {}
        self._merged: dict[int, list[int]] = {}
        self._seen: set[tuple[int, EpochStatus]] = set()
        self._tags: dict[str, int] = {}
        self.duplicates: list[ManifestEntry] = []
        """Later copies of a transition already recorded for their epoch, ignored."""
        rows = list(entries)
        for entry in sorted((e for e in rows if e.status in TAG_STATUSES), key=commit_order):
            self._apply_tag(entry)
        for entry in sorted((e for e in rows if e.status not in TAG_STATUSES), key=_order):
            try:
                self.record(entry)
            except ManifestError:
                if (entry.epoch, entry.status) not in self._seen:
                    raise
                self.duplicates.append(entry)
                log.warning(
                    "manifest: epoch %d has %s recorded more than once; the later copy "
                    "(run %s, %s) is ignored",
                    entry.epoch,
                    entry.status.value,
                    entry.run_id,
                    entry.recorded_at.isoformat(),
                )

    def replace_with(self, other: EpochLog) -> None:
        """Take over another log's entries and version, in place (for holders of this one)."""
        self.version = other.version
        self._entries = list(other._entries)
        self._latest = dict(other._latest)
        self._prepared = dict(other._prepared)
        self._merged = {k: list(v) for k, v in other._merged.items()}
        self._seen = set(other._seen)
        self._tags = dict(other._tags)
        self.duplicates = list(other.duplicates)

    @property
    def entries(self) -> list[ManifestEntry]:
        """All entries, in the order they were recorded."""
        return list(self._entries)

    def check(self, entry: ManifestEntry) -> None:
        """Raise if ``entry`` may not be recorded next.

        Raises:
            ManifestError: The transition is not allowed, a PREPARED epoch is not newer
                than every epoch already decided, a MERGED epoch names no later snapshot,
                a named snapshot would expire, or a name is given twice or taken from a
                snapshot that does not have it.
        """
        if entry.status in TAG_STATUSES:
            self._check_tag(entry)
            return
        check_transition(entry.epoch, self.status(entry.epoch), entry.status)
        if entry.status is EpochStatus.EXPIRED and self.tags_of(entry.epoch):
            raise ManifestError(
                f"epoch {entry.epoch} is the named savepoint "
                f"{', '.join(map(repr, self.tags_of(entry.epoch)))}; it cannot expire until "
                f"the name is removed (pyspark_abs.untag)"
            )
        if entry.status is EpochStatus.PREPARED:
            latest = self.latest_decided()
            if latest is not None and entry.epoch <= latest.epoch:
                raise ManifestError(
                    f"epoch {entry.epoch} cannot be PREPARED after epoch {latest.epoch}; "
                    f"epochs are decided in order"
                )
        if entry.status is EpochStatus.MERGED and (
            entry.snapshot_epoch is None or entry.snapshot_epoch <= entry.epoch
        ):
            raise ManifestError(
                f"epoch {entry.epoch} cannot be MERGED into snapshot {entry.snapshot_epoch}; "
                f"an epoch is merged into the snapshot of a later epoch"
            )

    def copy(self) -> EpochLog:
        """An independent copy of this log (to try transitions on)."""
        copied = EpochLog()
        copied.replace_with(self)
        return copied

    def check_all(self, entries: Iterable[ManifestEntry]) -> None:
        """Raise if ``entries`` may not be recorded next, in this order (see :meth:`check`).

        A PREPARED epoch may be recorded ABORTED only together with a restore epoch, which
        replaces it (see :mod:`~pyspark_abs.install.stuck_epochs`).
        """
        batch = list(entries)
        replaced = [
            e.epoch
            for e in batch
            if e.status is EpochStatus.ABORTED and self.status(e.epoch) is EpochStatus.PREPARED
        ]
        if replaced and not any(e.status is EpochStatus.PREPARED and e.is_restore for e in batch):
            raise ManifestError(
                f"epoch(s) {epoch_ranges(replaced)} are PREPARED: the decision stands, and only "
                f"a restore epoch recorded with it can replace it"
            )
        if len(batch) == 1:  # a micro-batch's own transition: no copy of the log per epoch
            self.check(batch[0])
            return
        scratch = self.copy()
        for entry in batch:
            scratch.record(entry)

    def has_tag_row(self, entry: ManifestEntry) -> bool:
        """Whether the log already shows what a TAGGED or UNTAGGED row would make it show."""
        named = self._tags.get(entry.tag or "") == entry.epoch
        return named if entry.status is EpochStatus.TAGGED else not named

    def _check_tag(self, entry: ManifestEntry) -> None:
        name = entry.tag or ""
        if not is_tag_name(name):
            raise ManifestError(
                f"{name!r} cannot name a snapshot: a name starts with a letter and has up to "
                f"100 letters, digits, '_', '.' and '-'"
            )
        named = self._tags.get(name)
        if entry.status is EpochStatus.UNTAGGED:
            if named != entry.epoch:
                where = "no snapshot" if named is None else f"epoch {named}"
                raise ManifestError(
                    f"{name!r} names {where}, not epoch {entry.epoch}; nothing to untag"
                )
            return
        if named is not None:
            raise ManifestError(
                f"{name!r} already names the snapshot of epoch {named}; untag it first, or "
                f"choose another name"
            )
        status = self.status(entry.epoch)
        if status not in SNAPSHOT_STATUSES:
            raise ManifestError(
                f"epoch {entry.epoch} is {status or 'not in the manifest'}; only a COMMITTED "
                f"or RESTORED snapshot can be named"
            )

    def _apply_tag(self, entry: ManifestEntry) -> None:
        assert entry.tag is not None
        if entry.status is EpochStatus.TAGGED:
            self._tags[entry.tag] = entry.epoch
        elif self._tags.get(entry.tag) == entry.epoch:
            del self._tags[entry.tag]

    def record(self, entry: ManifestEntry) -> None:
        """Add a transition after checking it is allowed (see :meth:`check`)."""
        self.check(entry)
        if entry.status in TAG_STATUSES:
            self._apply_tag(entry)
            return
        if entry.status is EpochStatus.PREPARED:
            self._prepared[entry.epoch] = entry
        if entry.status is EpochStatus.MERGED:
            assert entry.snapshot_epoch is not None
            self._merged.setdefault(entry.snapshot_epoch, []).append(entry.epoch)
        self._entries.append(entry)
        self._latest[entry.epoch] = entry
        self._seen.add((entry.epoch, entry.status))

    def status(self, epoch: int) -> EpochStatus | None:
        """The epoch's current status, or None if it has no entry."""
        entry = self._latest.get(epoch)
        return entry.status if entry else None

    def latest(self, epoch: int) -> ManifestEntry | None:
        """The epoch's latest entry."""
        return self._latest.get(epoch)

    def prepared(self, epoch: int) -> ManifestEntry | None:
        """The epoch's PREPARED entry, which holds its files and offsets."""
        return self._prepared.get(epoch)

    def pending(self) -> list[ManifestEntry]:
        """PREPARED entries of epochs neither committed nor merged yet, oldest first."""
        return [
            self._prepared[e]
            for e in sorted(self._prepared)
            if self._latest[e].status is EpochStatus.PREPARED
        ]

    def snapshots(self) -> list[ManifestEntry]:
        """Latest entries of COMMITTED and RESTORED epochs (readable snapshots), oldest first."""
        return [
            self._latest[e]
            for e in sorted(self._latest)
            if self._latest[e].status in SNAPSHOT_STATUSES
        ]

    def require_snapshot(self, epoch: int, root: SnapshotRoot) -> ManifestEntry:
        """The latest entry of ``epoch``, which must be a readable snapshot.

        Raises:
            SnapshotNotFoundError: The epoch is unknown or not COMMITTED or RESTORED; the
                message lists the readable epochs, and for a MERGED epoch names the
                snapshot it was merged into.
        """
        entry = self._latest.get(epoch)
        if entry is not None and entry.status in SNAPSHOT_STATUSES:
            return entry
        readable = epoch_ranges([e.epoch for e in self.snapshots()])
        if entry is not None and entry.status is EpochStatus.MERGED:
            interval = entry.run.snapshot_interval if entry.run is not None else None
            raise SnapshotNotFoundError(
                f"epoch {epoch} of snapshot root {root} is not a snapshot: it was MERGED into "
                f"snapshot {entry.snapshot_epoch} (snapshot_interval "
                f"{interval}), whose commit made its outputs visible. Use "
                f"epoch {entry.snapshot_epoch} or another readable epoch: {readable}"
            )
        shown = "not in the manifest" if entry is None else entry.status.value
        raise SnapshotNotFoundError(
            f"epoch {epoch} of snapshot root {root} is {shown}; readable epochs are {readable}"
        )

    def tags(self) -> dict[str, int]:
        """Named savepoints: each name and the epoch of the snapshot it names."""
        return dict(sorted(self._tags.items()))

    def tags_of(self, epoch: int) -> list[str]:
        """The names of the snapshot of ``epoch``, sorted."""
        return sorted(name for name, named in self._tags.items() if named == epoch)

    def resolve(self, snapshot: int | str, root: SnapshotRoot) -> int:
        """The epoch of ``snapshot``: an epoch number, or the name of a savepoint.

        Raises:
            SnapshotNotFoundError: No savepoint has that name; the message lists the names.
        """
        if not isinstance(snapshot, str):
            return snapshot
        if snapshot in self._tags:
            return self._tags[snapshot]
        names = ", ".join(repr(n) for n in sorted(self._tags)) or "none"
        raise SnapshotNotFoundError(
            f"no savepoint of snapshot root {root} is named {snapshot!r}; the names are {names}"
        )

    def merged_into(self, snapshot: int) -> list[int]:
        """The epochs MERGED into the snapshot of epoch ``snapshot``, oldest first."""
        return sorted(self._merged.get(snapshot, ()))

    def group(self, snapshot: int) -> list[ManifestEntry]:
        """The PREPARED entries whose files the commit of ``snapshot`` made visible.

        Those of the epochs MERGED into the snapshot, then its own, oldest first.
        """
        epochs = [*self.merged_into(snapshot), snapshot]
        return [self._prepared[e] for e in epochs if e in self._prepared]

    def watermark_after(self, epoch: int) -> int | None:
        """The watermark the epoch after ``epoch`` ran with, if this log knows it.

        That is the next epoch's, when it was prepared, else what ``epoch`` itself carries
        as a restore epoch.
        """
        following = self.prepared(epoch + 1)
        if following is not None and not following.is_restore:
            return following.watermark_ms
        own = self.latest(epoch)
        return own.restore.watermark_after_ms if own is not None and own.restore else None

    def latest_decided(self) -> ManifestEntry | None:
        """The latest entry of the newest epoch that was PREPARED."""
        return self._latest[max(self._prepared)] if self._prepared else None

    def decide(self, epoch: int) -> EpochDecision:
        """What to do with a micro-batch of ``epoch``."""
        status = self.status(epoch)
        if status in (
            EpochStatus.COMMITTED,
            EpochStatus.RESTORED,
            EpochStatus.MERGED,
            EpochStatus.EXPIRED,
        ):
            return EpochDecision.SKIP_REPLAY
        if status is EpochStatus.PREPARED:
            return EpochDecision.FINISH_REPLAY
        latest = self.latest_decided()
        if latest is not None and epoch < latest.epoch:
            raise ManifestError(
                f"Spark runs epoch {epoch}, older than epoch {latest.epoch} already decided, "
                f"but epoch {epoch} has no decision; the manifest and the checkpoint do not "
                f"belong together"
            )
        return EpochDecision.PROCESS


def is_tag_name(name: str) -> bool:
    """Whether ``name`` can name a savepoint: a letter, then up to 99 of ``[A-Za-z0-9_.-]``."""
    return _TAG_NAME.fullmatch(name) is not None


def epoch_ranges(epochs: Iterable[int]) -> str:
    """Epoch numbers as compact ranges, e.g. ``0..4, 7, 9..12`` (``none`` when empty)."""
    parts: list[str] = []
    for epoch in sorted(epochs):
        if parts and parts[-1].split("..")[-1] == str(epoch - 1):
            parts[-1] = f"{parts[-1].split('..')[0]}..{epoch}"
        else:
            parts.append(str(epoch))
    return ", ".join(parts) or "none"


def closes_group(epoch: int, last_snapshot: int | None, interval: int) -> bool:
    """Whether the PREPARED micro-batch ``epoch`` closes a group, so its commit is due.

    Args:
        epoch: The epoch just PREPARED.
        last_snapshot: The newest snapshot or group end before it (None: none yet).
        interval: The snapshot interval in epochs.
    """
    return epoch - (-1 if last_snapshot is None else last_snapshot) >= interval


def recovery_groups(
    pending: Sequence[ManifestEntry], last_snapshot: int | None
) -> list[tuple[ManifestEntry, ...]]:
    """How recovery commits the epochs an earlier run left PREPARED, in order.

    Micro-batch epochs form the groups their run would have closed (each entry records its
    run's snapshot interval; none recorded means 1), and the epochs after the last such
    group end form one more group, which ends at the last of them. A restore epoch is
    always a group of its own.

    Args:
        pending: PREPARED entries not committed yet, oldest first.
        last_snapshot: The newest snapshot epoch (None: none yet).
    """
    groups: list[tuple[ManifestEntry, ...]] = []
    open_group: list[ManifestEntry] = []
    last = last_snapshot
    for entry in pending:
        if entry.is_restore and open_group:
            groups.append(tuple(open_group))
            open_group = []
        open_group.append(entry)
        interval = entry.run.snapshot_interval if entry.run is not None else None
        if entry.is_restore or closes_group(entry.epoch, last, interval or 1):
            groups.append(tuple(open_group))
            open_group = []
            last = entry.epoch
    if open_group:
        groups.append(tuple(open_group))
    return groups


def check_group(group: Sequence[ManifestEntry]) -> None:
    """Raise unless ``group`` can be committed as one snapshot.

    A group is one or more PREPARED entries in epoch order with the same tables; a restore
    epoch is always alone.

    Raises:
        ManifestError: The group is empty, out of order, not PREPARED, mixes a restore epoch
            with others, or its epochs write different tables.
    """
    if not group:
        raise ManifestError("a commit needs at least one PREPARED epoch")
    epochs = [e.epoch for e in group]
    end = group[-1]
    problem = None
    if epochs != sorted(set(epochs)):
        problem = "its epochs are not in increasing order"
    elif any(e.status is not EpochStatus.PREPARED for e in group):
        problem = "not every entry is PREPARED"
    elif len(group) > 1 and any(e.is_restore for e in group):
        problem = "a restore epoch is committed alone"
    elif any(dict(e.tables) != dict(end.tables) for e in group):
        problem = "its epochs write different tables"
    if problem is not None:
        raise ManifestError(f"epochs {epochs} cannot be committed as one snapshot: {problem}")


def _order(entry: ManifestEntry) -> tuple[int, int, tuple[int, int, float]]:
    """Replay order: by epoch, then by the only valid order of one epoch's transitions.

    An ABORTED row may come before a PREPARED one (a failed attempt, then Spark's replay) or
    after it (a rollback replaced the epoch): rows that record their manifest version keep
    the order of their commits, and older rows put ABORTED first, the only order they knew.
    """
    legacy_abort = entry.status is EpochStatus.ABORTED and entry.manifest_version is None
    rank = {
        EpochStatus.ABORTED: 0 if legacy_abort else 1,
        EpochStatus.PREPARED: 1,
        EpochStatus.COMMITTED: 2,
        EpochStatus.RESTORED: 2,
        EpochStatus.MERGED: 2,
        EpochStatus.EXPIRED: 3,
    }
    return (entry.epoch, rank[entry.status], commit_order(entry))
