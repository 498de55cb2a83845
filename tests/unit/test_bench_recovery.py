"""The recovery benchmark's own check of the state after a restart; no Spark."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "scripts" / "bench"))

from bench_recovery import check

LANDED = [np.array([0, 1, 2, 3]), np.array([1, 1, 3])]


def emitted(keys: list[int], counts: list[int]) -> pa.Table:
    return pa.table({"key": pa.array(keys, pa.int64()), "count": pa.array(counts, pa.int64())})


def test_newest_counts_of_the_last_files_keys_pass() -> None:
    # key 1: 1 then 3; key 3: 1 then 2; key 0 and 2 were not in the last file
    check("abs", emitted([0, 1, 2, 3, 1, 3], [1, 1, 1, 1, 3, 2]), LANDED)


@pytest.mark.parametrize(
    ("keys", "counts", "wrong"),
    [
        ([0, 1, 2, 3, 1, 3], [1, 1, 1, 1, 2, 2], "(1, 2, 3)"),  # the load epoch's count lost
        ([0, 1, 2, 3, 1], [1, 1, 1, 1, 3], "(3, 1, 2)"),  # key 3 not emitted after the restart
    ],
)
def test_a_count_that_lost_records_stops_the_benchmark(
    keys: list[int], counts: list[int], wrong: str
) -> None:
    with pytest.raises(SystemExit, match=r"abs_new_cluster: 1 keys .*" + re.escape(wrong)):
        check("abs_new_cluster", emitted(keys, counts), LANDED)
