"""The root's ``_rewinds`` table: the files a restore epoch's Spark file source had read.

A restore epoch over Spark's file source continues from an offset that only the checkpoint
that recorded it can interpret. When the epoch is installed, the files that offset covers
are appended here under the epoch and the installing run's id (the PREPARED row names the
same run), so an install that crashed before PREPARED and its retry never mix. A rewound
stream, and any later restore from this epoch, reads them back.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pyspark_abs.errors import SourceError
from pyspark_abs.storage.root import SnapshotRoot
from pyspark_abs.storage.store import DeltaStore, TableSpec

REWINDS_TABLE = "_rewinds"
_FIELDS: list[pa.Field[Any]] = [
    pa.field("epoch", pa.int64()),
    pa.field("run_id", pa.string()),
    pa.field("path", pa.string()),
]
REWINDS_SCHEMA = pa.schema(_FIELDS)


def record_rewind(
    store: DeltaStore, root: SnapshotRoot, epoch: int, run_id: str, paths: list[str]
) -> None:
    """Keep the files read through restore epoch ``epoch``, installed by ``run_id``."""
    uri = root.table_uri(REWINDS_TABLE)
    store.ensure_table(
        TableSpec(
            REWINDS_TABLE,
            uri,
            REWINDS_SCHEMA,
            description="pyspark-abs: files Spark's file source had read, per restore epoch",
        )
    )
    rows = pa.table(
        {"epoch": [epoch] * len(paths), "run_id": [run_id] * len(paths), "path": paths},
        schema=REWINDS_SCHEMA,
    )
    store.append(uri, rows)


def rewound_files(store: DeltaStore, root: SnapshotRoot, epoch: int, run_id: str) -> list[str]:
    """The files read through restore epoch ``epoch`` of ``root``.

    Raises:
        SourceError: The root has no record of them.
    """
    uri = root.table_uri(REWINDS_TABLE)
    rows = store.read(uri) if store.exists(uri) else REWINDS_SCHEMA.empty_table()
    mine = rows.filter((pc.field("epoch") == epoch) & (pc.field("run_id") == run_id))
    if mine.num_rows == 0:
        raise SourceError(
            f"restore epoch {epoch} of {root} continues Spark's file source, but {uri} does "
            f"not list the files it had read (the table was removed or the root was copied "
            f"by hand). Roll back or restore again from a snapshot whose checkpoint still exists"
        )
    return sorted({str(p) for p in mine["path"].to_pylist()})
