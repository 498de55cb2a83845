"""The layout of a snapshot root: where its manifest, state tables, sinks and logs are.

A snapshot root holds the ``_manifest`` Delta table and, under table ids, the state table
of each operator (``state/<operator>``) and the log of each back-edge
(``backedge/<edge>``). Sinks (``sink/<output>``) are named the same way in the manifest
but may live anywhere. Every module spells these through here.
"""

from __future__ import annotations

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


def state_table(operator: str) -> str:
    """The table id of an operator's state table."""
    return f"{STATE_PREFIX}{operator}"


def sink_table(output: str) -> str:
    """The table id of an output's sink."""
    return f"{SINK_PREFIX}{output}"


def backedge_table(edge: str) -> str:
    """The table id of a back-edge's log."""
    return f"{BACKEDGE_PREFIX}{edge}"


@dataclass(frozen=True)
class SnapshotRoot:
    """A snapshot root at a location (a normalized URI).

    Attributes:
        uri: The root's location.
    """

    uri: str

    @property
    def manifest_uri(self) -> str:
        """Location of the root's ``_manifest`` table."""
        return f"{self.uri}/{MANIFEST_TABLE}"

    def table_uri(self, table: str) -> str:
        """Location of a table the root holds (a state table or a back-edge log)."""
        return f"{self.uri}/{table}"

    def not_found(self) -> SnapshotNotFoundError:
        """The error for a location that holds no snapshot root."""
        return SnapshotNotFoundError(
            f"{self.uri} is not a pyspark-abs snapshot root (it has no {MANIFEST_TABLE} table)"
        )
