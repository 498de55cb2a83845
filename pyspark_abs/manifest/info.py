"""What one epoch of a snapshot root says: its status, tables, figures and timings."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from pyspark_abs.manifest.entries import EpochRecord, ManifestEntry


@dataclass(frozen=True)
class SnapshotInfo(EpochRecord):
    """One epoch of a snapshot root: the fields of :class:`EpochRecord` and its names.

    Attributes:
        tags: The names of the snapshot (named savepoints), sorted.
    """

    tags: tuple[str, ...] = ()

    @classmethod
    def from_entry(cls, entry: ManifestEntry, tags: Sequence[str] = ()) -> SnapshotInfo:
        """The snapshot view of an epoch's latest manifest entry, with its names."""
        shared = {f.name: getattr(entry, f.name) for f in fields(EpochRecord)}
        return cls(**shared, tags=tuple(tags))

    def to_dict(self) -> dict[str, Any]:
        """The epoch as a JSON-ready dict (status as text, time in ISO 8601)."""
        data = asdict(self)
        data["status"] = self.status.value
        data["recorded_at"] = self.recorded_at.isoformat()
        data["tags"] = list(self.tags)
        return data
