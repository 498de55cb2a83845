"""Rewriting a Delta table's files in place, committed exactly on the version planned on."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import unquote

from deltalake import CommitProperties, DeltaTable
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.transaction import AddAction, RemoveAction

from pyspark_abs.errors import (
    CommitError,
)
from pyspark_abs.logs import logger
from pyspark_abs.storage.files import add_actions
from pyspark_abs.storage.store import DeltaStore

log = logger(__name__)

Actions = list[AddAction | RemoveAction]
"""The actions of one Delta commit."""


CONFLICT_RETRIES = 10


def superseded(current: DeltaTable, since: int, removing: Iterable[str]) -> str | None:
    """Why removes planned at table version ``since`` must not be committed on ``current``.

    They must not when a file to remove is no longer in the table (another compaction or a
    rollback removed it: its rows may live on elsewhere, or be meant gone) or when the table
    was restored or overwritten after ``since`` (a rollback, restore or restore epoch
    replaced the state the plan was made from). None when they may be committed.
    """
    replaced = _replacing_commit(current, since)
    if replaced is not None:
        return f"the table was {replaced} after version {since}: a rollback or restore replaced it"
    present = {str(a["path"]) for a in add_actions(current)}
    gone = [path for path in removing if path not in present]
    if gone:
        return (
            f"file {unquote(gone[0])} of version {since} is no longer in the table "
            f"(version {current.version()}; {len(gone)} such file(s)): another compaction "
            f"replaced it"
        )
    return None


def _replacing_commit(current: DeltaTable, since: int) -> str | None:
    """The first commit after version ``since`` that restored or overwrote the table."""
    newer = int(current.version()) - since
    if newer <= 0:
        return None
    for commit in sorted(current.history(limit=newer), key=lambda c: int(c["version"])):
        if int(commit["version"]) <= since:
            continue
        operation = str(commit.get("operation", "")).upper()
        mode = str((commit.get("operationParameters") or {}).get("mode", "")).lower()
        if operation == "RESTORE" or mode == "overwrite":
            return f"{'restored' if operation == 'RESTORE' else 'overwritten'} at version " + str(
                commit["version"]
            )
    return None


def commit_retrying(
    store: DeltaStore,
    uri: str,
    actions: Callable[[DeltaTable], Actions],
    what: str,
    again: str,
) -> tuple[int | None, Actions]:
    """Commit actions computed against the table's current version, again on a conflict.

    The commit is made exactly on the version the actions were computed against (Delta's
    own retry would rebase it onto newer commits unchecked: delta-rs accepts removes of
    files a concurrent commit already removed). Returns the committed version and actions
    (None and [] if there was nothing to do).

    Raises:
        CommitError: The commit failed, or conflicted with other writers every time.
    """
    for attempt in range(CONFLICT_RETRIES):
        current = store.open(uri)
        todo = actions(current)
        if not todo:
            return None, []
        try:
            current.create_write_transaction(
                todo,
                mode="append",
                schema=current.schema(),
                commit_properties=CommitProperties(max_commit_retries=0),
            )
            current.update_incremental()
            return int(current.version()), todo
        except CommitFailedError as err:
            log.info("%s conflicted (attempt %d): %s", what, attempt + 1, err)
        except DeltaError as err:
            raise CommitError(f"{what} failed: {err}") from err
    raise CommitError(f"{what} conflicted {CONFLICT_RETRIES} times with other writers; {again}")


def history(uri: str) -> dict[int, dict[str, Any]]:
    """A table's commit infos by version."""
    return {int(c["version"]): c for c in DeltaTable(uri).history()}


def compact_small_files(uri: str) -> None:
    """Rewrite the table's small files into fewer (Delta's OPTIMIZE), keeping its rows."""
    DeltaTable(uri).optimize.compact()
