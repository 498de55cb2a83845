"""The ordered background committer of asynchronous mode.

In asynchronous mode a micro-batch returns once its epoch is PREPARED; when the epoch closes
a group (see ``AbsConfig.snapshot_interval``; every epoch does with interval 1), the group
is handed to this committer, which runs phase 2 for the groups one at a time, in order, in a
background thread. At most ``max_pending`` groups wait for it: the next hand-over blocks until
one is done. After a failure it commits nothing more (later groups must not overtake an
earlier one) and reports the failure to the next caller; recovery finishes the epochs on
restart.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence

from pyspark_abs.errors import AbsError, CommitError
from pyspark_abs.logs import background
from pyspark_abs.manifest.entries import ManifestEntry

Group = Sequence[ManifestEntry]
"""PREPARED epochs committed together, oldest first; the last one becomes the snapshot."""


class OrderedCommitter:
    """Commits groups of PREPARED epochs in order in a background thread."""

    def __init__(self, commit: Callable[[Group], None], max_pending: int) -> None:
        """Start the committer thread.

        Args:
            commit: Runs phase 2 for one group.
            max_pending: How many groups may wait before :meth:`submit` blocks.
        """
        self._commit = commit
        self._max_pending = max_pending
        self._queue: deque[Group] = deque()
        self._busy: Group = ()
        self._closed = False
        self._failure: BaseException | None = None
        self._cond = threading.Condition()
        self._thread = background(self._run, "pyspark-abs-committer")
        self._thread.start()

    @property
    def pending(self) -> int:
        """Groups submitted and not yet committed."""
        with self._cond:
            return self._waiting()

    @property
    def pending_epochs(self) -> int:
        """Epochs of the groups submitted and not yet committed."""
        with self._cond:
            return sum(len(group) for group in self._queue) + len(self._busy)

    def submit(self, group: Group) -> None:
        """Queue a group; block while ``max_pending`` groups are waiting.

        Raises:
            CommitError: An earlier group failed to commit, or the committer is closed.
        """
        with self._cond:
            self.raise_if_failed()
            while self._waiting() >= self._max_pending:
                self._cond.wait()
                self.raise_if_failed()
            if self._closed:
                raise CommitError(f"epoch {group[-1].epoch}: the committer is closed")
            self._queue.append(group)
            self._cond.notify_all()

    def drain(self) -> None:
        """Wait until every submitted group is committed.

        Raises:
            CommitError: A group failed to commit.
        """
        with self._cond:
            while self._waiting() and self._failure is None:
                self._cond.wait()
            self.raise_if_failed()

    def close(self) -> None:
        """Stop the thread once the queue is empty (or at once after a failure)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()

    def raise_if_failed(self) -> None:
        """Raise the failure that stopped the committer, if any."""
        if self._failure is None:
            return
        if isinstance(self._failure, AbsError):
            raise self._failure
        raise CommitError(
            f"the background committer failed: {self._failure}; the epochs it did not commit "
            f"stay PREPARED and are committed on restart"
        ) from self._failure

    def _waiting(self) -> int:
        return len(self._queue) + int(bool(self._busy))

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue or self._failure is not None:
                    return
                group = self._queue.popleft()
                self._busy = group
            try:
                self._commit(group)
            except BaseException as err:
                with self._cond:
                    self._failure = err
                    self._busy = ()
                    self._cond.notify_all()
                return
            with self._cond:
                self._busy = ()
                self._cond.notify_all()
