"""The ordered background committer of asynchronous mode.

In asynchronous mode a micro-batch returns once its epoch is PREPARED; this committer then
runs phase 2 for the epochs one at a time, in epoch order, in a background thread. At most
``max_pending`` epochs wait for it: the next micro-batch blocks until one is done. After a
failure it commits nothing more (later epochs must not overtake an earlier one) and reports
the failure to the next caller; recovery finishes the epochs on restart.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

from pyspark_abs.errors import AbsError, CommitError
from pyspark_abs.manifest import ManifestEntry


class OrderedCommitter:
    """Commits PREPARED epochs in order in a background thread."""

    def __init__(self, commit: Callable[[ManifestEntry], None], max_pending: int) -> None:
        """Start the committer thread.

        Args:
            commit: Runs phase 2 for one PREPARED entry.
            max_pending: How many epochs may wait before :meth:`submit` blocks.
        """
        self._commit = commit
        self._max_pending = max_pending
        self._queue: deque[ManifestEntry] = deque()
        self._busy = False
        self._closed = False
        self._failure: BaseException | None = None
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="pyspark-abs-committer", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        """Epochs submitted and not yet committed."""
        with self._cond:
            return len(self._queue) + int(self._busy)

    def submit(self, entry: ManifestEntry) -> None:
        """Queue a PREPARED epoch; block while ``max_pending`` epochs are waiting.

        Raises:
            CommitError: An earlier epoch failed to commit, or the committer is closed.
        """
        with self._cond:
            self.raise_if_failed()
            while len(self._queue) + int(self._busy) >= self._max_pending:
                self._cond.wait()
                self.raise_if_failed()
            if self._closed:
                raise CommitError(f"epoch {entry.epoch}: the committer is closed")
            self._queue.append(entry)
            self._cond.notify_all()

    def drain(self) -> None:
        """Wait until every submitted epoch is committed.

        Raises:
            CommitError: An epoch failed to commit.
        """
        with self._cond:
            while (self._queue or self._busy) and self._failure is None:
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

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue or self._failure is not None:
                    return
                entry = self._queue.popleft()
                self._busy = True
            try:
                self._commit(entry)
            except BaseException as err:
                with self._cond:
                    self._failure = err
                    self._busy = False
                    self._cond.notify_all()
                return
            with self._cond:
                self._busy = False
                self._cond.notify_all()
