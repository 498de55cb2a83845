"""The envelope: what the operator stage hands to the pre-commit stage.

For each key group and epoch the operator stage emits a few envelope rows, one per target
table with something to write: the key group's state changes, and its rows for each output.
The rows themselves travel as one encoded payload per envelope row, so Spark moves a handful
of binary values per key group instead of every record.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np
import pandas as pd
import pyarrow as pa

ENVELOPE_DDL = (
    "kind int, target int, key_group int, num_rows bigint, keys_delta bigint, payload binary"
)
"""Spark schema of the envelope stream."""

STATE_DDL = "blob binary"
"""Spark schema of the key group state held in Spark's state store."""


class Kind(IntEnum):
    """What an envelope row carries."""

    OUTPUT = 0
    """Rows for one of the operator's outputs (``target`` is the output's index)."""
    STATE = 1
    """State changes of the key group: upserts and tombstones."""


def envelope_frame(
    key_group: int,
    state_changes: tuple[pa.Table, bytes] | None,
    keys_delta: int,
    outputs: list[tuple[int, pa.Table, bytes]],
) -> pd.DataFrame:
    """Build the envelope rows of one key group.

    Args:
        key_group: The key group.
        state_changes: The change table and its encoded payload, or None when state
            snapshots are off or nothing changed.
        keys_delta: Net change of the number of live keys in the group.
        outputs: (output index, rows, encoded payload) for every output with rows.
    """
    count = len(outputs) + (state_changes is not None)
    kinds = np.zeros(count, dtype=np.int32)
    targets = np.zeros(count, dtype=np.int32)
    counts = np.zeros(count, dtype=np.int64)
    deltas = np.zeros(count, dtype=np.int64)
    payloads = np.empty(count, dtype=object)
    row = 0
    if state_changes is not None:
        table, payloads[0] = state_changes
        kinds[0] = Kind.STATE
        counts[0] = table.num_rows
        deltas[0] = keys_delta
        row = 1
    for index, table, payload in outputs:
        kinds[row] = Kind.OUTPUT
        targets[row] = index
        counts[row] = table.num_rows
        payloads[row] = payload
        row += 1
    return pd.DataFrame(
        {
            "kind": kinds,
            "target": targets,
            "key_group": np.full(count, key_group, dtype=np.int32),
            "num_rows": counts,
            "keys_delta": deltas,
            "payload": payloads,
        },
        copy=False,
    )
