"""Live state on the executors' local disks, rebuilt from the snapshot root when missing.

With snapshots on, a key group's live state between epochs is on the local disk of the
executor that ran it, not a value in Spark's state store: a whole file, or a whole file and
a chain of change files after it (see :mod:`~pyspark_abs.protocol.state_chain`). Spark's
state store keeps only a *marker* per key group: the epoch that last changed the key group,
a random token naming the file written then, and where that file sits in its chain. A steady
epoch therefore adds to Spark's checkpoint a few dozen bytes per changed key group, and to
the snapshot (the Delta state table) only the changed keys: bytes follow the change, not the
size of the state.

The marker is what makes the file trustworthy: it reaches Spark's state store only if the
task that wrote the file succeeded, and its token names exactly that file, so a retried or
zombie task, another run, or a restore never makes a key group read another's state.

A missing file (another executor, a lost disk, a new cluster) is rebuilt from the snapshot
root, which holds every decided change: the newest snapshot older than the running epoch,
plus the pre-committed changes of decided epochs after it up to the marker's epoch (see
:func:`rebuild_steps`). The first key group that misses on an executor splits that snapshot
into one base file per key group for the others (one read of the state table per executor
and snapshot), under a file lock.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
from deltalake.exceptions import DeltaError

from pyspark_abs.errors import (
    AbsError,
    OperatorError,
    SnapshotDamagedError,
    StateEncodingError,
    StorageError,
)
from pyspark_abs.manifest.entries import ManifestEntry
from pyspark_abs.manifest.log import EpochLog
from pyspark_abs.manifest.table import load_epoch_log
from pyspark_abs.operators.changelog import latest_rows, stable_order
from pyspark_abs.operators.keys import BoolArray
from pyspark_abs.operators.plan import OperatorPlan
from pyspark_abs.operators.schema import DELETED, EPOCH, KEY_GROUP
from pyspark_abs.operators.state_codec import Marker, decode_marker, encode_marker
from pyspark_abs.operators.state_diff import apply_changes
from pyspark_abs.operators.task import epoch_changes
from pyspark_abs.protocol.local_folders import (
    create_file,
    locked,
    mark_used,
    operator_home,
    recycling,
    replace_file,
)
from pyspark_abs.protocol.state_chain import (
    ChainRows,
    change_file,
    extends_chain,
    file_identity,
    map_file,
    read_chain,
)
from pyspark_abs.runtime import usable_cores
from pyspark_abs.storage.root import SnapshotRoot
from pyspark_abs.storage.store import DeltaStore, brief_error

_COMPLETE = "_complete"
_RUN_BYTES = 4


@dataclass(frozen=True)
class RebuildSteps:
    """How to rebuild a key group's state as of an epoch from the snapshot root.

    Attributes:
        base: The snapshot to start from (None: start empty).
        changes: PREPARED entries of the decided epochs to apply after it, oldest first.
    """

    base: ManifestEntry | None
    changes: tuple[ManifestEntry, ...]


def rebuild_steps(epochs: EpochLog, table: str, marker_epoch: int, epoch: int) -> RebuildSteps:
    """How to rebuild the state ``marker_epoch`` left, for the micro-batch of ``epoch``.

    No epoch after ``marker_epoch`` and before ``epoch`` changed the key group (the marker
    names the last that did), so any snapshot in between holds its state; a later decided
    epoch (one Spark replays) may have, so no snapshot from ``epoch`` on is used. If the
    newest snapshot before ``epoch`` is older than ``marker_epoch`` (not committed yet,
    or grouped by ``snapshot_interval``), the decided epochs after it up to ``marker_epoch``
    are applied from their pre-committed files.

    Args:
        epochs: The root's manifest, read during the micro-batch of ``epoch``.
        table: The operator's state table id.
        marker_epoch: The epoch that last changed the key group.
        epoch: The epoch of the running micro-batch.
    """
    earlier = [s for s in epochs.snapshots() if s.epoch < epoch and table in s.table_versions]
    base = earlier[-1] if earlier else None
    start = -1 if base is None else base.epoch
    if start >= marker_epoch:
        return RebuildSteps(base, ())
    changes = []
    for candidate in range(start + 1, marker_epoch + 1):
        entry = epochs.prepared(candidate)
        if entry is not None and table in entry.tables:
            changes.append(entry)
    return RebuildSteps(base, tuple(changes))


@dataclass(frozen=True)
class LocalLiveState:
    """Key groups' live state in files on the executor's local disk (see the module).

    Attributes:
        root: The snapshot root.
        root_key: Identifies the root among those whose state shares the directory.
        table: The operator's state table id.
        uri: The state table's location.
        directory: Where the files go ("": the executor's temporary directory).
        epoch_base: The epoch of Spark's micro-batch 0 in this checkpoint.
        run: The first bytes of every token this run writes (hex): a save recycles only
            files that carry them.
        change_share: See :func:`~pyspark_abs.protocol.state_chain.extends_chain`.
    """

    root: SnapshotRoot
    root_key: str
    table: str
    uri: str
    directory: str
    epoch_base: int
    run: str
    change_share: float

    @staticmethod
    def for_root(
        root: SnapshotRoot,
        root_id: str | None,
        table: str,
        uri: str,
        directory: str,
        epoch_base: int,
        run_id: str,
        change_share: float,
    ) -> LocalLiveState:
        """The local live state of one operator of a root (``root_id`` None: an old root).

        The root's folder is named by its id and its location: a root copied as a directory
        (``cp -r``, ``aws s3 sync``) keeps the id, and must not share the original's files.
        """
        place = hashlib.blake2b(root.encode(), digest_size=8).hexdigest()
        key = f"{root_id}-{place}" if root_id else place
        run = hashlib.blake2b(run_id.encode(), digest_size=_RUN_BYTES).hexdigest()
        return LocalLiveState(root, key, table, uri, directory, epoch_base, run, change_share)

    def load(
        self, plan: OperatorPlan, key_group: int, stored: bytes, batch_id: int | None
    ) -> pa.Table:
        """The key group's state the marker ``stored`` names (a blob is decoded).

        Raises:
            StateEncodingError: The marker is damaged.
            OperatorError: The state has to be rebuilt, and a decided epoch's files are gone.
            SnapshotDamagedError: The state has to be rebuilt, and its snapshot is unreadable.
            StorageError: The rebuilt state cannot be written to ``local_state_dir``.
        """
        marker = decode_marker(stored)
        if marker is None:  # a checkpoint written before live state moved to local disk
            return plan.state_codec.decode(stored)
        _READ.clear()
        try:
            state, rows = read_chain(plan, marker, lambda m: self._file(plan, key_group, m))
        except (OSError, StateEncodingError):
            pass  # gone, or a torn file of a crashed host: rebuild it
        else:
            _READ[(self.root_key, plan.name, key_group, bytes(stored))] = rows
            return state
        epoch = self._epoch(plan, batch_id)
        state = self._rebuild(plan, key_group, marker.epoch, epoch)
        path = self._file(plan, key_group, marker)
        _guarded(
            plan, epoch, key_group, path, replace_file, _parts(plan, state, key_group, batch_id)
        )
        with contextlib.suppress(OSError):  # else the next save writes the whole state
            identity = file_identity(path)
            _READ[(self.root_key, plan.name, key_group, bytes(stored))] = ChainRows(
                None, state.num_rows, identity
            )
        return state

    def save(
        self,
        plan: OperatorPlan,
        key_group: int,
        state: pa.Table,
        batch_id: int | None,
        replaced: bytes | None,
        kept: BoolArray | None,
    ) -> bytes:
        """Write the key group's new state to a new file and return its marker.

        The file holds the changes to the state :meth:`load` read from ``replaced`` (in this
        worker), on its chain, or the whole state
        (see :mod:`~pyspark_abs.protocol.state_chain`). Files older than the chain replaced
        are stale: Spark never goes back past it, while a retry of this micro-batch still
        reads it. When the whole state is written, one stale file that this run wrote
        becomes the new file (renamed and overwritten: on ext4 that costs a tenth of
        creating a file); the rest are deleted. A file another run wrote is never
        overwritten, only deleted: a task of that run may still have it memory-mapped, and
        a deleted file's pages stay with the reader, while an overwritten file's would
        change under it.

        The file is written in place, not through a temporary file: its name holds a fresh
        random token, and nothing reads it before Spark commits the marker naming it, which
        it does only once the task has succeeded.

        Raises:
            StateTooLargeError: See :meth:`OperatorPlan.state_message`.
            StorageError: The file cannot be written to ``local_state_dir``.
        """
        epoch = self._epoch(plan, batch_id)
        mark_used(operator_home(self.directory, self.root_key, plan.name))
        token = bytes.fromhex(self.run) + os.urandom(16 - _RUN_BYTES)
        previous = decode_marker(replaced) if replaced is not None else None
        stale = self._stale(plan, key_group, previous.base_epoch) if previous else []
        read = _READ.get((self.root_key, plan.name, key_group, bytes(replaced or b"")))
        chained = None
        if (
            previous
            and kept is not None
            and read
            and read.state_rows == len(kept)
            and extends_chain(previous, 1, key_group, self.change_share)
        ):
            parts = change_file(plan, previous, read, kept, state)
            size = sum(len(part) for part in parts)
            if extends_chain(previous, size, key_group, self.change_share):
                plan.check_state_size(state, key_group, batch_id)
                chained = replace(
                    previous,
                    epoch=epoch,
                    token=token,
                    depth=previous.depth + 1,
                    chain_bytes=previous.chain_bytes + size,
                )
        ours = [p for p in stale if os.path.basename(p)[13:].startswith(self.run)]
        recycled = ours[0] if ours and chained is None else None
        for extra in stale:
            if extra != recycled:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(extra)
        if chained is not None:
            _guarded(
                plan, epoch, key_group, self._file(plan, key_group, chained), create_file, parts
            )
            return encode_marker(chained)
        parts = _parts(plan, state, key_group, batch_id)
        written = Marker(epoch, token, epoch, base_bytes=sum(len(part) for part in parts))
        path = self._file(plan, key_group, written)
        if not (recycled and _guarded(plan, epoch, key_group, path, recycling(recycled), parts)):
            _guarded(plan, epoch, key_group, path, create_file, parts)
        return encode_marker(written)

    def _epoch(self, plan: OperatorPlan, batch_id: int | None) -> int:
        if batch_id is None:
            raise AbsError(
                f"operator {plan.name!r}: live state is kept per epoch, but this Spark task "
                f"runs outside a streaming micro-batch"
            )
        return self.epoch_base + batch_id

    def _home(self, plan: OperatorPlan) -> Path:
        return Path(operator_home(self.directory, self.root_key, plan.name))

    def _file(self, plan: OperatorPlan, key_group: int, marker: Marker) -> str:
        home = operator_home(self.directory, self.root_key, plan.name)
        return f"{home}/kg-{key_group}/{marker.epoch:012d}-{marker.token.hex()}.abs"

    def _stale(self, plan: OperatorPlan, key_group: int, kept_epoch: int) -> list[str]:
        """The key group's files older than ``kept_epoch``."""
        folder = f"{operator_home(self.directory, self.root_key, plan.name)}/kg-{key_group}"
        try:
            with os.scandir(folder) as entries:
                return [
                    entry.path
                    for entry in entries
                    if (name := entry.name.partition("-"))[1]
                    and name[0].isdigit()
                    and int(name[0]) < kept_epoch
                ]
        except FileNotFoundError:
            return []

    def _rebuild(
        self, plan: OperatorPlan, key_group: int, marker_epoch: int, epoch: int
    ) -> pa.Table:
        """The key group's state, rebuilt from the snapshot root.

        The manifest is read once per worker and micro-batch. If what it names cannot be
        read, the manifest is read again first: retention may have expired that snapshot,
        and vacuum deleted its files, while the micro-batch ran (a newer snapshot then holds
        the same state). Only a rebuild that fails on the newest manifest is reported.
        """
        steps = rebuild_steps(self._manifest(epoch), self.table, marker_epoch, epoch)
        try:
            return self._rebuilt(plan, key_group, steps)
        except (SnapshotDamagedError, OperatorError):
            fresh = rebuild_steps(
                self._manifest(epoch, reload=True), self.table, marker_epoch, epoch
            )
            if fresh == steps:
                raise
            return self._rebuilt(plan, key_group, fresh)

    def _rebuilt(self, plan: OperatorPlan, key_group: int, steps: RebuildSteps) -> pa.Table:
        state = (
            plan.blob_schema.empty_table()
            if steps.base is None
            else self._base(plan, steps.base, key_group)
        )
        for entry in steps.changes:
            uri = entry.tables[self.table]
            files = tuple(f"{uri}/{f.path}" for f in entry.files if f.table == self.table)
            state = apply_changes(plan, state, epoch_changes(plan, entry.epoch, files, key_group))
        return state

    def _manifest(self, epoch: int, *, reload: bool = False) -> EpochLog:
        """The manifest, read once per Python worker and micro-batch (or now, ``reload``)."""
        uri = self.root.manifest_uri
        cached = _MANIFESTS.get(uri)
        if reload or cached is None or cached[0] != epoch:
            cached = (epoch, load_epoch_log(DeltaStore(), uri))
            _MANIFESTS.clear()
            _MANIFESTS[uri] = cached
        return cached[1]

    def _base(self, plan: OperatorPlan, snapshot: ManifestEntry, key_group: int) -> pa.Table:
        """The key group's state in ``snapshot``, split per key group once per executor."""
        home = self._home(plan)
        folder = home / f"base-{snapshot.table_versions[self.table]}"
        with locked(home / "base.lock", exclusive=False):
            if (folder / _COMPLETE).exists():
                return _read_base(plan, folder, key_group)
        with locked(home / "base.lock", exclusive=True):
            if not (folder / _COMPLETE).exists():
                with _every_core():
                    self._split(plan, snapshot, folder)
            return _read_base(plan, folder, key_group)

    def _split(self, plan: OperatorPlan, snapshot: ManifestEntry, folder: Path) -> None:
        for old in folder.parent.glob("base-*"):
            shutil.rmtree(old, ignore_errors=True)
        columns = [*plan.blob_schema.names, KEY_GROUP, EPOCH, DELETED]
        version = snapshot.table_versions[self.table]
        try:
            changes = DeltaStore().read(self.uri, version, columns)
        except (OSError, pa.ArrowException, DeltaError) as err:
            raise SnapshotDamagedError(
                f"operator {plan.name!r}: live state missing on this executor is rebuilt from "
                f"snapshot {snapshot.epoch} (version {version} of {self.table} at "
                f"{self.uri}), which cannot be read: {brief_error(err)}. Run validate on the "
                f"snapshot root, roll back to the newest intact snapshot it names, and start "
                f"again"
            ) from None
        rows = latest_rows(changes, plan.key_columns, snapshot.epoch)
        groups = np.asarray(
            changes[KEY_GROUP].take(rows).to_numpy(zero_copy_only=False), dtype=np.int64
        )
        order = stable_order(groups)
        live = changes.select(plan.blob_schema.names).take(rows[order]).cast(plan.blob_schema)
        groups = groups[order]
        bounds = np.flatnonzero(np.diff(groups)) + 1
        folder.mkdir(parents=True, exist_ok=True)
        for start, end in zip(np.r_[0, bounds], np.r_[bounds, len(groups)], strict=True):
            if end > start:
                part = live.slice(int(start), int(end - start))
                message = plan.state_codec.message(part)
                create_file(
                    str(folder / f"kg-{groups[start]}.abs"),
                    plan.state_codec.frame_parts(message, compress=False),
                )
        (folder / _COMPLETE).touch()


_MANIFESTS: dict[str, tuple[int, EpochLog]] = {}
_READ: dict[tuple[str, str, int, bytes], ChainRows] = {}
"""Where the rows of the state this worker read last sit in its chain, by marker."""


@contextlib.contextmanager
def _every_core() -> Iterator[None]:
    """Arrow's threads on every core while the split runs (other tasks wait for its files)."""
    previous = pa.cpu_count()  # PySpark caps a worker's at spark.task.cpus (OMP_NUM_THREADS)
    pa.set_cpu_count(max(previous, usable_cores()))
    try:
        yield
    finally:
        pa.set_cpu_count(previous)


def _read_base(plan: OperatorPlan, folder: Path, key_group: int) -> pa.Table:
    try:
        return _read(plan, str(folder / f"kg-{key_group}.abs"))
    except FileNotFoundError:
        return plan.blob_schema.empty_table()  # the key group had no keys in the snapshot


def _read(plan: OperatorPlan, path: str) -> pa.Table:
    """A state file, memory-mapped: the table shares the file's pages instead of a copy."""
    return plan.state_codec.decode(map_file(path)[0])


def _parts(
    plan: OperatorPlan, state: pa.Table, key_group: int, batch_id: int | None
) -> tuple[bytes | pa.Buffer, ...]:
    """A key group's state as the parts of its file, uncompressed (memory-mapped on reads)."""
    message = plan.state_message(state, key_group, batch_id)
    return plan.state_codec.frame_parts(message, compress=False)


def _guarded(
    plan: OperatorPlan,
    epoch: int,
    key_group: int,
    path: str,
    write: Callable[[str, Sequence[bytes | pa.Buffer]], bool],
    parts: Sequence[bytes | pa.Buffer],
) -> bool:
    """``write(path, parts)``, its failure reported as a :class:`StorageError`."""
    try:
        return write(path, parts)
    except OSError as err:
        raise StorageError(
            f"operator {plan.name!r}, epoch {epoch}, key group {key_group}: cannot write "
            f"the key group's live state to {path}: {err}. Give local_state_dir "
            f"(spark.abs.localStateDir) a writable local directory with room for the "
            f"state; nothing of the epoch is committed, and restarting replays it"
        ) from None
