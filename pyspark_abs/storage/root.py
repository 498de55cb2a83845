"""The layout of a snapshot root: where its manifest, state tables, sinks and logs are.

A snapshot root holds the ``_manifest`` Delta table and, under table ids, the state table
of each operator (``state/<operator>``) and the log of each back-edge
(``backedge/<edge>``). Sinks (``sink/<output>``) are named the same way in the manifest
but may live anywhere. The data files a root writes into any table are named
``abs-e<epoch>-t<root tag>-<writer>-<random>.parquet`` (``abs-c<epoch>-compact-...`` for a
compaction): :func:`file_prefix` and :func:`file_name`. Every module spells these through
here.
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from dataclasses import dataclass

from pyspark_abs.errors import SnapshotNotFoundError

MANIFEST_TABLE = "_manifest"
"""Table id, and directory under the root, of the manifest."""

STATE_PREFIX = "state/"
"""Table ids of operator state tables start with this."""

SINK_PREFIX = "sink/"
"""Table ids of sinks start with this."""

BACKEDGE_PREFIX = "backedge/"
"""Table ids of back-edge logs start with this."""

_FILE_NAME = re.compile(r"(?:^|/)abs-([ec])(\d{12})-(?:t([0-9a-f]{8})-)?[^/]*\.parquet$")


def state_table(operator: str) -> str:
    """The table id of an operator's state table."""
    return f"{STATE_PREFIX}{operator}"


def sink_table(output: str) -> str:
    """The table id of an output's sink."""
    return f"{SINK_PREFIX}{output}"


def backedge_table(edge: str) -> str:
    """The table id of a back-edge's log."""
    return f"{BACKEDGE_PREFIX}{edge}"


def normalize_uri(location: str) -> str:
    """A table location as delta-rs and pyarrow want it: absolute path or URL."""
    if "://" in location:
        return location.rstrip("/")
    return os.path.abspath(os.path.expanduser(location))


class SnapshotRoot(str):
    """A snapshot root's location, normalized once: an absolute path or a URL.

    It is a ``str`` (users read and format it as one), and a type of its own: the modules
    below the public entries take a ``SnapshotRoot``, never a bare string, so a location is
    normalized where it enters (``SnapshotRoot(location)``) and nowhere else.
    """

    __slots__ = ()

    def __new__(cls, location: str | os.PathLike[str]) -> SnapshotRoot:
        """The root at ``location``, a path (``~`` expanded, made absolute) or a URL."""
        if isinstance(location, SnapshotRoot):
            return location
        return super().__new__(cls, normalize_uri(os.fspath(location)))

    def __getnewargs__(self) -> tuple[str]:
        return (str(self),)

    @property
    def manifest_uri(self) -> str:
        """Location of the root's ``_manifest`` table."""
        return f"{self}/{MANIFEST_TABLE}"

    def table_uri(self, table: str) -> str:
        """Location of a table the root holds (a state table or a back-edge log)."""
        return f"{self}/{table}"

    @property
    def tag(self) -> str:
        """The root's tag in the names of the files it writes (8 hex digits).

        A sink table can be written by several pipelines; the tag tells vacuum which files
        are this root's to delete.
        """
        return hashlib.sha256(self.encode()).hexdigest()[:8]

    def not_found(self) -> SnapshotNotFoundError:
        """The error for a location that holds no snapshot root."""
        return SnapshotNotFoundError(
            f"{self} is not a pyspark-abs snapshot root (it has no {MANIFEST_TABLE} table)"
        )


def file_prefix(epoch: int, writer: str, tag: str = "") -> str:
    """Name prefix of the data files ``writer`` writes for ``epoch`` (see :func:`file_name`).

    Args:
        epoch: The epoch the files are written for.
        writer: Who writes them, e.g. ``p00003-a0`` (partition 3, attempt 0) or ``restore``.
        tag: The writing root's :attr:`SnapshotRoot.tag`, or empty.
    """
    tagged = f"t{tag}-" if tag else ""
    return f"abs-e{epoch:012d}-{tagged}{writer}-{uuid.uuid4().hex[:12]}"


def compaction_prefix(epoch: int) -> str:
    """Name prefix of the files a compaction as of snapshot ``epoch`` writes."""
    return f"abs-c{epoch:012d}-compact-{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True)
class FileName:
    """What a data file's name says about it.

    Attributes:
        epoch: The epoch it was written for (compaction: the snapshot compacted).
        compaction: Whether a compaction wrote it (else a pre-commit task or restore).
        tag: The writing root's tag, or None in names without one.
    """

    epoch: int
    compaction: bool
    tag: str | None


def file_name(path: str) -> FileName | None:
    """Parse a data file name pyspark-abs writes; None for any other file."""
    match = _FILE_NAME.search(path)
    if match is None:
        return None
    return FileName(int(match.group(2)), match.group(1) == "c", match.group(3))


def file_epoch(path: str) -> int | None:
    """The epoch a pre-commit or restore file was written for; None for other files."""
    name = file_name(path)
    return name.epoch if name is not None and not name.compaction else None
