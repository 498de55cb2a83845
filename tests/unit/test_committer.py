"""The ordered background committer: order, back-pressure, failure, drain, groups."""

import datetime as dt
import threading

import pytest

from pyspark_abs.errors import CommitError, InjectedFault
from pyspark_abs.protocol.committer import Group, OrderedCommitter
from tests.support.manifest import entry


def prepared(*epochs: int) -> Group:
    """A group of PREPARED epochs."""
    now = dt.datetime.now(dt.timezone.utc)
    return tuple(entry(e, recorded_at=now) for e in epochs)


def test_commits_in_submission_order_and_drains() -> None:
    committed: list[int] = []
    committer = OrderedCommitter(lambda g: committed.append(g[-1].epoch), max_pending=2)
    for epoch in range(5):
        committer.submit(prepared(epoch))
    committer.drain()
    assert committed == [0, 1, 2, 3, 4]
    assert committer.pending == 0
    committer.close()


def test_submit_blocks_while_max_pending_epochs_wait() -> None:
    release = threading.Event()
    started = threading.Event()

    def slow(group: Group) -> None:
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

    def commit(group: Group) -> None:
        if group[-1].epoch == 1:
            raise InjectedFault("boom at 1")
        committed.append(group[-1].epoch)

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
    def commit(group: Group) -> None:
        raise OSError("disk full")

    committer = OrderedCommitter(commit, max_pending=1)
    committer.submit(prepared(0))
    with pytest.raises(CommitError, match="disk full; the epochs it did not commit stay PREPARED"):
        committer.drain()
    committer.close()


def test_close_commits_what_is_queued() -> None:
    committed: list[int] = []
    committer = OrderedCommitter(lambda g: committed.append(g[-1].epoch), max_pending=4)
    for epoch in range(3):
        committer.submit(prepared(epoch))
    committer.close()
    assert committed == [0, 1, 2]
    with pytest.raises(CommitError, match="closed"):
        committer.submit(prepared(3))


def test_groups_are_committed_whole_and_counted_in_epochs() -> None:
    release = threading.Event()
    committed: list[list[int]] = []

    def commit(group: Group) -> None:
        assert release.wait(10)
        committed.append([e.epoch for e in group])

    committer = OrderedCommitter(commit, max_pending=2)
    committer.submit(prepared(0, 1, 2))
    committer.submit(prepared(3, 4))
    assert (committer.pending, committer.pending_epochs) == (2, 5)
    release.set()
    committer.drain()
    assert committed == [[0, 1, 2], [3, 4]]
    assert (committer.pending, committer.pending_epochs) == (0, 0)
    committer.close()
