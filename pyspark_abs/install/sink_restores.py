"""Which version a sink goes back to when a restore epoch installs an earlier snapshot.

A sink is restored to its Delta version as of the snapshot, with two refinements: a sink the
snapshot predates goes back to the version before the root first wrote it, and changes other
writers made since (a ``DELETE`` erasing a person's rows, an ``OPTIMIZE``) are kept where
the root did not commit after them, and refuse the restore where it did (going back would
bring deleted rows back).
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark_abs.errors import ExternalChangeError, SnapshotDamagedError
from pyspark_abs.manifest.entries import ManifestEntry
from pyspark_abs.manifest.log import EpochLog
from pyspark_abs.protocol.epoch_writer import EpochWriter
from pyspark_abs.protocol.lineage import require_own_sinks
from pyspark_abs.storage.commits import commits_between
from pyspark_abs.storage.files import missing_files
from pyspark_abs.storage.root import SINK_PREFIX
from pyspark_abs.storage.store import DeltaStore


def sinks_written_later(epochs: EpochLog, target: ManifestEntry) -> dict[str, tuple[str, int]]:
    """Sinks the root wrote that ``target`` has no version of, with a version to go back to.

    That is the version before the root's first write to the sink.

    ``target`` predates them: it is a restored copy's first epoch, a ``write_state`` on a
    new root, or a rollback to one of those.

    Raises:
        SnapshotDamagedError: The root's first write to such a sink created the table, so
            no version of it holds the sink as of ``target``.
    """
    first: dict[str, tuple[str, int, int]] = {}
    for entry in epochs.entries:
        for table, version in entry.table_versions.items():
            other = table.startswith(SINK_PREFIX) and table not in target.table_versions
            if other and (table not in first or version < first[table][1]):
                first[table] = (entry.tables[table], version, entry.epoch)
    later = {t: (uri, v) for t, (uri, v, epoch) in first.items() if epoch > target.epoch}
    for table, (uri, version) in later.items():
        if version < 1:
            raise SnapshotDamagedError(
                f"epoch {target.epoch} predates every write to sink {table} at {uri}, but "
                f"version 0 of that table already holds rows of this root, so no version "
                f"holds the sink as of epoch {target.epoch}; roll back to a later epoch"
            )
    return {table: (uri, version - 1) for table, (uri, version) in later.items()}


def keeping_other_writers(
    store: DeltaStore,
    tables: Mapping[str, str],
    versions: Mapping[str, int],
    epoch: int,
    *,
    refuse: bool = True,
) -> dict[str, int]:
    """The version each sink goes back to so that it is as of ``epoch`` for this root.

    ``versions`` gives each sink's version as of ``epoch``. A sink that only other writers
    changed since (a ``DELETE`` erasing a person's rows, an ``OPTIMIZE``) keeps its
    current version: restoring it would undo their changes and bring deleted rows back.

    Raises:
        ExternalChangeError: With ``refuse``: another writer removed rows from a sink
            since, and this root committed to it since too, so no version holds the one
            without the other.
    """
    kept = dict(versions)
    for table, version in versions.items():
        uri = tables[table]
        current = int(store.open(uri).version())
        later = commits_between(uri, version + 1, current)
        if not any(c.ours for c in later):
            kept[table] = current
            continue
        theirs = [c for c in later if not c.ours and c.changes_rows]
        if theirs and refuse:
            shown = ", ".join(f"{c.operation} at version {c.version}" for c in theirs)
            raise ExternalChangeError(
                f"sink {table} at {uri} cannot go back to epoch {epoch} (its version "
                f"{version}): another writer removed rows from it since ({shown}), and "
                f"going back would bring them back. Nothing was changed. Go back to an epoch "
                f"committed after that change, or repeat the change after going back"
            )
    return kept


def check_sink_restores(writer: EpochWriter, target: ManifestEntry) -> dict[str, int]:
    """The versions the sinks of ``target`` go back to, refused before anything is decided.

    Raises:
        ExternalChangeError: See :func:`keeping_other_writers`; or files of a version a sink
            goes back to are gone (a VACUUM).
        PipelineMismatchError: A sink belongs to another root: the original of this root,
            which was copied as a directory (see
            :func:`~pyspark_abs.protocol.lineage.require_own_sinks`).
    """
    store = writer.store
    tables = dict(target.tables)
    versions = {
        t: v
        for t, v in target.table_versions.items()
        if t.startswith(SINK_PREFIX) and store.exists(tables[t])
    }
    for table, (uri, version) in sinks_written_later(writer.epochs, target).items():
        tables[table], versions[table] = uri, version
    decided = writer.epochs.latest_decided()
    sinks = {t: tables[t] for t in versions}
    newest = None if decided is None else decided.epoch
    require_own_sinks(store, writer.pipeline, writer.root, writer.root_id, sinks, newest)
    restores = keeping_other_writers(store, tables, versions, target.epoch)
    for table, version in restores.items():
        gone = missing_files(tables[table], version)
        if gone:
            raise ExternalChangeError(
                f"{table} at {tables[table]} cannot go back to its version {version} (as of "
                f"epoch {target.epoch}): {len(gone)} of that version's files are gone, "
                f"{gone[0]} among them (a VACUUM deleted them). Nothing was changed. Go back "
                f"to a later snapshot, or restore the files from a backup first"
            )
    return restores
