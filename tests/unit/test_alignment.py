import pytest

from pyspark_abs.errors import AlignmentError, PrecommitFileError
from pyspark_abs.protocol.alignment import align, check_files
from pyspark_abs.protocol.barrier import BarrierMarker
from pyspark_abs.storage.files import FileEntry


def marker(partition: int, epoch: int = 3, files: int = 1, delta: int = 2) -> BarrierMarker:
    return BarrierMarker(
        operator="wc",
        epoch=epoch,
        partition=partition,
        attempt=0,
        keys_delta=delta,
        precommit_ms=float(partition),
        acked_at_ms=1_000_000.0 + 5 * partition,
        files=tuple(
            FileEntry("state/wc", f"p{partition}-{i}.parquet", 100 + i, 10, 7) for i in range(files)
        ),
    )


def test_aligned_epoch_sums_partitions_in_order() -> None:
    aligned = align("wc", 3, [marker(2), marker(0), marker(1, files=2)], 3)
    assert aligned.num_partitions == 3
    assert [f.path for f in aligned.files] == [
        "p0-0.parquet",
        "p1-0.parquet",
        "p1-1.parquet",
        "p2-0.parquet",
    ]
    assert aligned.keys_delta == 6
    assert aligned.precommit_ms == 2.0
    assert aligned.align_wait_ms == 10.0
    assert aligned.rows_by_table() == {"state/wc": 40}
    assert aligned.bytes_by_table() == {"state/wc": 100 + 100 + 101 + 100}


def test_partition_without_files_still_aligns() -> None:
    aligned = align("wc", 3, [marker(0, files=0), marker(1)], 2)
    assert len(aligned.files) == 1


def test_missing_partition_is_named() -> None:
    with pytest.raises(AlignmentError, match=r"epoch 3 .*'wc'.*no marker from partition\(s\) 1"):
        align("wc", 3, [marker(0), marker(2)], 3)


def test_repeated_partition_is_named() -> None:
    with pytest.raises(AlignmentError, match=r"several markers from partition\(s\) 0"):
        align("wc", 3, [marker(0), marker(0), marker(1)], 2)


def test_partition_out_of_range() -> None:
    with pytest.raises(AlignmentError, match=r"unknown partition\(s\) 5"):
        align("wc", 3, [marker(0), marker(1), marker(5)], 2)


def test_marker_of_another_epoch() -> None:
    with pytest.raises(AlignmentError, match="marker of epoch 2"):
        align("wc", 3, [marker(0), marker(1, epoch=2)], 2)


def test_check_files_reports_missing_and_wrong_size() -> None:
    files = [
        FileEntry("sink/out", "a.parquet", 10, 1, 0),
        FileEntry("sink/out", "b.parquet", 20, 1, 0),
    ]
    check_files(4, files, lambda fs: [f.size_bytes for f in fs])
    with pytest.raises(PrecommitFileError) as err:
        check_files(4, files, lambda fs: [None, 19])
    message = str(err.value)
    assert "epoch 4" in message
    assert "sink/out/a.parquet is missing" in message
    assert "sink/out/b.parquet has 19 bytes, the marker says 20" in message
