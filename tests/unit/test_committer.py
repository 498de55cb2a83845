"""The ordered background committer: order, back-pressure, failure, drain."""

import datetime as dt
import threading

import pytest

from pyspark_abs import CommitError, InjectedFault
from pyspark_abs.committer import OrderedCommitter
from pyspark_abs.manifest import EpochStatus, ManifestEntry


def prepared(epoch: int) -> ManifestEntry:
    return ManifestEntry("p", epoch, EpochStatus.PREPARED, dt.datetime.now(dt.timezone.utc), "r")


def test_commits_in_submission_order_and_drains() -> None:
    committed: list[int] = []
    committer = OrderedCommitter(lambda e: committed.append(e.epoch), max_pending=2)
    for epoch in range(5):
        committer.submit(prepared(epoch))
    committer.drain()
    assert committed == [0, 1, 2, 3, 4]
    assert committer.pending == 0
    committer.close()


def test_submit_blocks_while_max_pending_epochs_wait() -> None:
    release = threading.Event()
    started = threading.Event()

    def slow(entry: ManifestEntry) -> None:
        started.set()
        assert release.wait(10)

    committer = OrderedCommitter(slow, max_pending=1)
    committer.submit(prepared(0))
    assert started.wait(10)
    third_done = threading.Event()

    def submit_next() -> None:
        committer.submit(prepared(1))
        third_done.set()

    thread = threading.Thread(target=submit_next)
    thread.start()
    assert not third_done.wait(0.2), "submit did not block with one epoch pending"
    assert committer.pending == 1
    release.set()
    assert third_done.wait(10)
    thread.join()
    committer.drain()
    committer.close()


def test_a_failure_stops_later_epochs_and_is_reported() -> None:
    committed: list[int] = []

    def commit(entry: ManifestEntry) -> None:
        if entry.epoch == 1:
            raise InjectedFault("boom at 1")
        committed.append(entry.epoch)

    committer = OrderedCommitter(commit, max_pending=3)
    committer.submit(prepared(0))
    committer.submit(prepared(1))
    with pytest.raises(InjectedFault, match="boom at 1"):
        committer.drain()
    with pytest.raises(InjectedFault):
        committer.submit(prepared(2))
    assert committed == [0]
    committer.close()


def test_non_pyspark_abs_failures_become_commit_errors() -> None:
    def commit(entry: ManifestEntry) -> None:
        raise OSError("disk full")

    committer = OrderedCommitter(commit, max_pending=1)
    committer.submit(prepared(0))
    with pytest.raises(CommitError, match="disk full; the epochs it did not commit stay PREPARED"):
        committer.drain()
    committer.close()


def test_close_commits_what_is_queued() -> None:
    committed: list[int] = []
    committer = OrderedCommitter(lambda e: committed.append(e.epoch), max_pending=4)
    for epoch in range(3):
        committer.submit(prepared(epoch))
    committer.close()
    assert committed == [0, 1, 2]
    with pytest.raises(CommitError, match="closed"):
        committer.submit(prepared(3))
