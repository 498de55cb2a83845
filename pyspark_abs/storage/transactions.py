"""Delta application transactions: how a commit names its pipeline, table, root and epoch."""

from __future__ import annotations

from deltalake import CommitProperties, Transaction

from pyspark_abs.storage.root import SnapshotRoot

EPOCH_KEY = "pyspark_abs.epoch"


APP_ID_KEY = "pyspark_abs.app_id"


ROOT_KEY = "pyspark_abs.root"


def app_id(pipeline: str, table: str, root_id: str | None, query_id: str | None = None) -> str:
    """The Delta application transaction id under which a snapshot root commits a table.

    It names the root by its id, so that a new root (a restored copy, a recreated root)
    never finds its epochs "already committed" by another root's transactions, and with
    snapshots off also the checkpoint's query, whose micro-batch ids restart at 0. Roots
    created before root ids (``root_id`` None) keep the ids they committed with.
    """
    scope = [part for part in (root_id, query_id) if part is not None]
    return "/".join(["pyspark-abs", pipeline, *scope, table])


def epoch_commit(app_id: str, epoch: int, root: SnapshotRoot | None) -> CommitProperties:
    """Commit properties that make a commit epoch ``epoch`` of ``app_id``, exactly once."""
    metadata = {EPOCH_KEY: str(epoch), APP_ID_KEY: app_id}
    if root is not None:
        metadata[ROOT_KEY] = str(root)
    return CommitProperties(
        custom_metadata=metadata,
        app_transactions=[Transaction(app_id, epoch)],
    )
