"""Manifest entries of a root that was copied or moved: their tables where they are now.

Every entry names its tables by location. A root copied as a directory (``cp -r``, ``aws s3
sync``) or moved keeps entries that name the locations it was written at, and a restore or
rollback following them would write to the original's tables. A root's state tables and
back-edge logs lie in the root itself, so each entry tells where it was written; when that
is not where the root is now, the whole directory that was copied (the longest ancestors
that differ while the rest of the path is the same) is mapped to its new place. Tables
outside it (a sink elsewhere) keep their location: they are not the copy's.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace

from pyspark_abs.manifest.entries import ManifestEntry
from pyspark_abs.storage.root import SnapshotRoot

_IN_ROOT = ("state/", "backedge/")
"""Prefixes of the table ids that lie in the root itself."""


def written_at(entry: ManifestEntry) -> str | None:
    """The root location an entry was written at, from a table it holds in the root."""
    for table, uri in entry.tables.items():
        if table.startswith(_IN_ROOT) and uri.endswith(f"/{table}"):
            return uri[: -len(table) - 1]
    return None


def moved_prefix(old: str, new: str) -> tuple[str, str]:
    """The directory that was copied or moved from ``old``'s side to ``new``'s.

    The paths share their last components; what differs before them is the directory.
    """
    before, after = old.split("/"), new.split("/")
    shared = 0
    while shared < min(len(before), len(after)) - 1 and before[-1 - shared] == after[-1 - shared]:
        shared += 1
    return "/".join(before[: len(before) - shared]), "/".join(after[: len(after) - shared])


def relocated(root: SnapshotRoot, entries: Iterable[ManifestEntry]) -> Iterator[ManifestEntry]:
    """The entries, each with its tables inside the copied directory where they are now."""
    for entry in entries:
        where = written_at(entry)
        if where is None or where == root:
            yield entry
            continue
        old, new = moved_prefix(where, root)
        tables = {
            table: new + uri[len(old) :] if uri == old or uri.startswith(f"{old}/") else uri
            for table, uri in entry.tables.items()
        }
        yield replace(entry, tables=tables)
