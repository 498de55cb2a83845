"""A pipeline whose root an older pyspark-abs wrote, continued by this one.

``tests/data/root-0.x-8664e23.tar.gz`` holds a root that pyspark-abs at commit 8664e23 (the
last before state, rows and outputs kept their exact types and nulls) wrote by running this
module on the first two batches; ``test_old_roots.py`` continues it with the code under
test. The module uses only the public API, so it runs under both::

    git archive 8664e23 pyspark_abs | tar -x -C /tmp/old
    PYTHONPATH=/tmp/old:. .venv/bin/python -m tests.support.old_roots /tmp/base
    tar -czf tests/data/root-0.x-8664e23.tar.gz -C /tmp/base ledger

The state holds what the old code got wrong for other inputs: a nullable long, a nullable
timestamp and a nullable boolean, in key groups where other keys hold values, and timers
that are pending when the old run stops. The batches avoid what the old code computed
wrongly (integers beyond 2**53 beside a null, a timer at the watermark), so the continued root
must equal a root that the code under test wrote alone.
"""

from __future__ import annotations

import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
from deltalake import write_deltalake
from pyspark.sql import DataFrame

from pyspark_abs import AbsConfig, DeltaSource, KeyState, Pipeline, local_session, operator

ARCHIVE = Path(__file__).parent.parent / "data" / "root-0.x-8664e23.tar.gz"
"""The base directory ``ledger`` the old code wrote: its input table, root and sink."""
OLD_BATCHES = 2
"""How many of :data:`BATCHES` the old code read."""
_T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
BATCHES: tuple[tuple[tuple[str, int | None, int], ...], ...] = (
    (("a", 5, 0), ("b", None, 1), ("c", 120, 2), ("d", None, 3)),
    (("a", None, 11), ("b", 7, 12), ("e", 2**40, 13)),
    (("a", 3, 21), ("c", None, 22), ("f", None, 23)),
    (("b", None, 31), ("d", 9, 32), ("e", -(2**40), 33), ("a", 1, 34)),
)
"""Per micro-batch: (user, amount or null, minutes after midnight, 1 January 2026 UTC)."""
STATE_DDL = "total long, last_amount long, last_paid timestamp, flagged boolean"
OUTPUT_DDL = "user string, total long, last_amount long, last_paid timestamp, fired long"


def _missing(value: Any) -> bool:
    """Null as the old code gave it (NaN, NaT) or as this one does (None)."""
    return value is None or bool(pd.isna(value))


@operator(
    key="user",
    state_schema=STATE_DDL,
    output_schema=OUTPUT_DDL,
    timeout="event_time",
    timers=True,
    name="ledger",
)
def ledger(key: tuple[Any, ...], rows: pd.DataFrame, state: KeyState) -> dict[str, Any]:
    """A running total of the paid amounts, the last one and when, whether any was over 100;
    a timer 10 minutes after each row, and how many fired in this call."""
    old = state.get({"total": 0, "last_amount": None, "last_paid": None, "flagged": None})
    total = 0 if _missing(old["total"]) else int(old["total"])
    last = None if _missing(old["last_amount"]) else int(old["last_amount"])
    when = None if _missing(old["last_paid"]) else pd.Timestamp(old["last_paid"])
    flagged = None if _missing(old["flagged"]) else bool(old["flagged"])
    for amount, ts in rows.sort_values("ts")[["amount", "ts"]].itertuples(index=False):
        state.register_timer(ts + timedelta(minutes=10))
        if not _missing(amount):
            total, last, when = total + int(amount), int(amount), pd.Timestamp(ts)
            flagged = bool(flagged) or int(amount) > 100
    state.update({"total": total, "last_amount": last, "last_paid": when, "flagged": flagged})
    fired = len(state.expired_timers)
    return {"user": key[0], "total": total, "last_amount": last, "last_paid": when, "fired": fired}


def append(base: Path, batch: int) -> None:
    """Append one of :data:`BATCHES` to the input table as one Delta version."""
    users, amounts, minutes = zip(*BATCHES[batch], strict=True)
    table = pa.table(
        {
            "user": pa.array(users, pa.string()),
            "amount": pa.array(amounts, pa.int64()),
            "ts": pa.array(
                [_T0 + timedelta(minutes=m) for m in minutes], pa.timestamp("us", "UTC")
            ),
        }
    )
    write_deltalake(str(base / "input"), table, mode="append")


def _watermarked(rows: DataFrame) -> DataFrame:
    return rows.withWatermark("ts", "5 minutes")


def pipeline(base: Path, root: str = "root", sink: str = "sink", key_groups: int = 2) -> Pipeline:
    """The pipeline over ``base``: input table, root and sink all lie inside it."""
    return Pipeline(
        "ledger",
        DeltaSource(str(base / "input")),
        ledger,
        root=str(base / root),
        sinks={"output": str(base / sink)},
        transform=_watermarked,
        config=AbsConfig(commit_mode="sync", key_groups=key_groups),
    )


def run_batches(base: Path, batches: range) -> None:
    """Append each batch and run the pipeline over it, one micro-batch each."""
    for batch in batches:
        append(base, batch)
        pipeline(base).run()


if __name__ == "__main__":
    local_session().sparkContext.setLogLevel("ERROR")
    run_batches(Path(sys.argv[1]) / "ledger", range(OLD_BATCHES))
