"""The manifest table of a snapshot root: its spec, owner and root id, and opening its epoch log."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable

from pyspark_abs.errors import (
    ManifestError,
    PipelineMismatchError,
)
from pyspark_abs.logs import logger
from pyspark_abs.manifest.entries import FORMAT_VERSION, MANIFEST_SCHEMA, ManifestEntry, entries_of
from pyspark_abs.manifest.log import EpochLog
from pyspark_abs.manifest.relocation import relocated
from pyspark_abs.storage.root import MANIFEST_TABLE, SnapshotRoot
from pyspark_abs.storage.store import (
    DeltaStore,
    TableSpec,
)

log = logger(__name__)


def manifest_spec(root: SnapshotRoot, pipeline: str) -> TableSpec:
    """The ``_manifest`` table of a snapshot root, with a new root id if it is created."""
    return TableSpec(
        table=MANIFEST_TABLE,
        uri=root.manifest_uri,
        schema=MANIFEST_SCHEMA,
        description=json.dumps(
            {"pipeline": pipeline, "format_version": FORMAT_VERSION, "root_id": uuid.uuid4().hex}
        ),
    )


def open_manifest(store: DeltaStore, root: SnapshotRoot, pipeline: str) -> EpochLog:
    """Create the root's manifest, or load it after checking it belongs to ``pipeline``.

    A manifest written by an older pyspark-abs first gets the columns added since (null in
    its existing rows).

    Raises:
        PipelineMismatchError: The root belongs to another pipeline.
        ManifestError: The manifest cannot be read or breaks the epoch state machine.
    """
    spec = manifest_spec(root, pipeline)
    if store.exists(spec.uri):
        owner = manifest_owner(store, root)
        if owner != pipeline:
            raise PipelineMismatchError(
                f"snapshot root {root} belongs to pipeline {owner!r}, not {pipeline!r}; give "
                f"this pipeline its own snapshot root"
            )
        added = store.add_missing_columns(spec)
        if added:
            log.info("manifest at %s: added column(s) %s", spec.uri, ", ".join(added))
    store.ensure_table(spec)
    return load_epoch_log(store, spec.uri)


def load_epoch_log(store: DeltaStore, uri: str) -> EpochLog:
    """The manifest table at ``uri`` as an :class:`EpochLog`, with the version it was read at.

    Entries written at another location (a root copied or moved as a directory) name their
    tables where they are now (see :mod:`~pyspark_abs.manifest.relocation`).

    Raises:
        ManifestError: The manifest cannot be read or breaks the epoch state machine.
    """
    root = SnapshotRoot(uri[: -len(MANIFEST_TABLE) - 1])
    try:
        rows, version = store.read_versioned(uri)
        entries = entries_of(rows)
        return EpochLog(relocated(root, entries), version)
    except ManifestError:
        raise
    except Exception as err:
        raise ManifestError(f"cannot read the manifest at {uri}: {err}") from err


def manifest_owner(store: DeltaStore, root: SnapshotRoot) -> str | None:
    """The pipeline a snapshot root belongs to, from its manifest's description."""
    return _described(store, root, "pipeline")


def manifest_root_id(store: DeltaStore, root: SnapshotRoot) -> str | None:
    """The id a snapshot root was created with (None: created before root ids existed).

    Every Delta transaction the root commits to a table carries it (see
    :func:`~pyspark_abs.storage.transactions.app_id`), so two roots never take each other's epochs
    for their own.
    """
    return _described(store, root, "root_id")


def _described(store: DeltaStore, root: SnapshotRoot, key: str) -> str | None:
    try:
        value = json.loads(store.description(root.manifest_uri) or "{}").get(key)
    except json.JSONDecodeError:
        value = None
    return value if isinstance(value, str) else None


def tables_of(entries: Iterable[ManifestEntry]) -> dict[str, str]:
    """Every table the entries name, by table id."""
    tables: dict[str, str] = {}
    for entry in entries:
        tables.update(entry.tables)
    return tables


def open_root(store: DeltaStore, root: SnapshotRoot) -> EpochLog:
    """The epoch log of a snapshot root, opened for the pipeline that owns it."""
    return open_manifest(store, root, root_owner(store, root))


def root_owner(store: DeltaStore, root: SnapshotRoot) -> str:
    """The pipeline that owns a snapshot root.

    Raises:
        SnapshotNotFoundError: ``root`` is not a snapshot root.
    """
    owner = manifest_owner(store, root) if store.exists(root.manifest_uri) else None
    if owner is None:
        raise root.not_found()
    return owner
