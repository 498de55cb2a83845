"""Where a pipeline's tables live, and the file operations over all of them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pyspark_abs.protocol.precommit import TableTarget
from pyspark_abs.storage.files import FileEntry, delete_files, file_sizes
from pyspark_abs.storage.root import SnapshotRoot


@dataclass(frozen=True)
class SnapshotLayout:
    """Where a pipeline's tables live.

    Attributes:
        pipeline: The pipeline's name.
        root: The snapshot root.
        operator: The operator's name.
        targets: The tables the pre-commit tasks write, state table first.
    """

    pipeline: str
    root: SnapshotRoot
    operator: str
    targets: tuple[TableTarget, ...] = field(default_factory=tuple)

    @property
    def tables(self) -> dict[str, str]:
        """Table id to location, in commit order."""
        return {t.table: t.uri for t in self.targets}

    def file_sizes(self, files: Sequence[FileEntry]) -> list[int | None]:
        """The size of each pre-committed file, None where it does not exist."""
        sizes: dict[FileEntry, int | None] = {}
        for table, uri in self.tables.items():
            mine = [f for f in files if f.table == table]
            sizes.update(zip(mine, file_sizes(uri, [f.path for f in mine]), strict=True))
        return [sizes.get(f) for f in files]

    def delete(self, files: Sequence[FileEntry]) -> None:
        """Delete pre-committed files that no epoch will commit."""
        for table, uri in self.tables.items():
            delete_files(uri, [f.path for f in files if f.table == table])
