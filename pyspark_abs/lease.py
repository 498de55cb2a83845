"""Fencing: one live pipeline run per snapshot root.

A run holds the root's **lease**, ``<root>/_lease.json`` (run id, pipeline, host, process,
and when it was last renewed), and renews it in a background thread every third of
:data:`LEASE_SECONDS`. A second start on the root is refused with a
:class:`~pyspark_abs.errors.FencingError` while the holder is alive: on the same host, while
its process exists and has renewed within :data:`LEASE_SECONDS`; on another host, while it
has renewed within :data:`LEASE_SECONDS`. A crashed run's lease is taken over at once on the
same host, and after :data:`LEASE_SECONDS` from elsewhere; :func:`break_lease` frees it at once
when you know the holder is gone.

A run checks that it still holds the lease before every manifest entry and table commit it
writes, so a *zombie* (a run that was paused or partitioned while another took over) stops
with a FencingError instead of recording anything, and its late table commits are no-ops
because a table's application-transaction version never goes backwards. Rollback, restore
and written state (which hold no lease) are refused while a run holds the root.

The lease is a guard against mistakes, not a distributed lock: it is written by rename,
which is atomic on local and HDFS-like file systems but not on object stores, and a run
paused between its check and its append can still write that one entry.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass

import pyarrow as pa
import pyarrow.fs as pafs

from pyspark_abs.errors import FencingError, SnapshotRootError

LEASE_SECONDS = 30.0
"""How long a lease stays valid without renewal."""

LEASE_FILE = "_lease.json"

_HELD: set[str] = set()
"""Run ids of the leases this process holds."""


@dataclass(frozen=True)
class LeaseRecord:
    """Who holds a snapshot root.

    Attributes:
        run_id: The holding run.
        pipeline: Its pipeline.
        host: The host it runs on.
        pid: Its process id.
        acquired_at: When it took the lease (seconds since the Unix epoch).
        renewed_at: When it last renewed the lease.
    """

    run_id: str
    pipeline: str
    host: str
    pid: int
    acquired_at: float
    renewed_at: float

    def is_live(self, now: float) -> bool:
        """Whether the holder may still be running (see the module docstring)."""
        if now - self.renewed_at >= LEASE_SECONDS:
            return False
        if self.host != socket.gethostname():
            return True
        if self.pid == os.getpid():
            return self.run_id in _HELD
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def describe(self, now: float) -> str:
        """The holder, for messages."""
        return (
            f"run {self.run_id} of pipeline {self.pipeline!r} (host {self.host}, pid "
            f"{self.pid}, lease renewed {now - self.renewed_at:.0f} s ago)"
        )


def read_lease(root: str) -> LeaseRecord | None:
    """The root's lease, or None if nobody holds it.

    Raises:
        SnapshotRootError: The lease file cannot be read or parsed.
    """
    fs, path = pafs.FileSystem.from_uri(root)
    try:
        with fs.open_input_stream(f"{path}/{LEASE_FILE}") as stream:
            data = stream.read()
    except FileNotFoundError:
        return None
    except (OSError, pa.ArrowException) as err:
        raise SnapshotRootError(f"cannot read the lease {root}/{LEASE_FILE}: {err}") from None
    try:
        return LeaseRecord(**json.loads(data))
    except (ValueError, TypeError) as err:
        raise SnapshotRootError(
            f"the lease {root}/{LEASE_FILE} is damaged ({err}); if no pipeline runs on "
            f"{root}, remove it with pyspark_abs.lease.break_lease({root!r})"
        ) from None


def break_lease(root: str) -> LeaseRecord | None:
    """Free a root whose lease holder you know is gone; return the lease it held.

    A holder that is in fact still running stops at its next write with a FencingError.
    """
    record = read_lease(root)
    fs, path = pafs.FileSystem.from_uri(root)
    with contextlib.suppress(FileNotFoundError):
        fs.delete_file(f"{path}/{LEASE_FILE}")
    return record


def require_no_live_holder(root: str, action: str) -> None:
    """Refuse ``action`` while a live run holds the root.

    Raises:
        FencingError: A live run holds the root's lease.
    """
    record = read_lease(root)
    now = time.time()
    if record is not None and record.is_live(now):
        raise FencingError(
            f"snapshot root {root} is held by {record.describe(now)}; {action} is refused "
            f"while it runs. Stop that pipeline first"
        )


class Lease:
    """A run's lease on a snapshot root, renewed in the background until released."""

    def __init__(self, root: str, record: LeaseRecord, *, owned: bool = True) -> None:
        self.root = root
        self.record = record
        self._owned = owned
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._renew, name=f"pyspark-abs-lease-{record.pipeline}", daemon=True
        )

    @classmethod
    def acquire(cls, root: str, pipeline: str, run_id: str) -> Lease:
        """Take the root's lease for a run, unless a live run holds it.

        Raises:
            FencingError: Another live run holds the root.
            SnapshotRootError: The lease cannot be read or written.
        """
        current = read_lease(root)
        now = time.time()
        if current is not None and current.run_id != run_id and current.is_live(now):
            raise FencingError(
                f"pipeline {pipeline!r} cannot start: snapshot root {root} is held by "
                f"{current.describe(now)}. Stop that run first; if it is gone, start again "
                f"after its lease expires ({LEASE_SECONDS:.0f} s after its last renewal) or "
                f"free the root with pyspark_abs.lease.break_lease({root!r})"
            )
        record = LeaseRecord(run_id, pipeline, socket.gethostname(), os.getpid(), now, now)
        _write(root, record)
        winner = read_lease(root)
        if winner is None or winner.run_id != run_id:
            shown = "another run" if winner is None else winner.describe(time.time())
            raise FencingError(
                f"pipeline {pipeline!r} cannot start: {shown} took snapshot root {root} at "
                f"the same moment"
            )
        _HELD.add(run_id)
        lease = cls(root, record)
        lease._thread.start()
        return lease

    @classmethod
    def follow(cls, root: str, record: LeaseRecord) -> Lease:
        """A lease held by a run in another process, as seen from a process writing for it.

        Checking it fails once the holder has lost the root; it is never renewed or
        released here (Spark Connect's server-side run follows its client's lease).
        """
        return cls(root, record, owned=False)

    def check(self, what: str) -> None:
        """Make sure this run still holds the root before it writes ``what``.

        Raises:
            FencingError: Another run took the root over (or its lease was broken).
        """
        current = read_lease(self.root)
        if current is not None and current.run_id == self.record.run_id:
            return
        holder = (
            "nobody (the lease was broken)" if current is None else current.describe(time.time())
        )
        raise FencingError(
            f"run {self.record.run_id} of pipeline {self.record.pipeline!r} no longer holds "
            f"snapshot root {self.root}, now held by {holder}; {what} is not written. This run "
            f"must stop: the current holder (or the next start) finishes its epochs"
        )

    def release(self) -> None:
        """Stop renewing and give the root up, if this run still holds it."""
        if not self._owned:
            return
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        _HELD.discard(self.record.run_id)
        current = read_lease(self.root)
        if current is not None and current.run_id == self.record.run_id:
            break_lease(self.root)

    def _renew(self) -> None:
        while not self._stop.wait(LEASE_SECONDS / 3):
            try:
                current = read_lease(self.root)
                if (
                    current is None
                    or current.run_id != self.record.run_id
                    or time.time() - current.renewed_at >= LEASE_SECONDS
                ):
                    return  # taken over, or expired and maybe being taken over: not renewed
                _write(self.root, LeaseRecord(**{**asdict(current), "renewed_at": time.time()}))
            except SnapshotRootError:
                continue  # a transient storage error: renew at the next beat


def _write(root: str, record: LeaseRecord) -> None:
    """Replace the lease file by rename, so that readers never see half a lease."""
    fs, path = pafs.FileSystem.from_uri(root)
    temporary = f"{path}/.{LEASE_FILE}.{uuid.uuid4().hex}"
    try:
        with fs.open_output_stream(temporary) as out:
            out.write(json.dumps(asdict(record)).encode())
        fs.move(temporary, f"{path}/{LEASE_FILE}")
    except (OSError, pa.ArrowException) as err:
        raise SnapshotRootError(f"cannot write the lease {root}/{LEASE_FILE}: {err}") from None
