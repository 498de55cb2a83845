"""Fencing: one live pipeline run per snapshot root.

A run holds the root's **lease** (run id, pipeline, host, process, and when it was last
renewed), and renews it in a background thread every third of :data:`LEASE_SECONDS`. A
second start on the root is refused with a :class:`~pyspark_abs.errors.FencingError` while
the holder is alive: on the same host, while its process exists and has renewed within
:data:`LEASE_SECONDS`; on another host, while it has renewed within :data:`LEASE_SECONDS`. A
crashed run's lease is taken over at once on the same host, and after :data:`LEASE_SECONDS`
from elsewhere; :func:`break_lease` frees it at once when you know the holder is gone.

A run checks that it still holds the lease before every manifest entry and table commit it
writes, so a *zombie* (a run that was paused or partitioned while another took over) stops
with a :class:`~pyspark_abs.errors.FencingError` instead of recording anything, and its late
table commits are no-ops because a table's application-transaction version never goes
backwards. Rollback, restore and written state (which hold no lease) are refused while a run
holds the root; when they find a lease that is no longer live, they break it before they
write, so its holder cannot take it back.

**A lapse nobody acted on.** A run whose renewals were late (its process or machine stalled,
or the wall clock stepped forward) finds its lease lapsed. Where creating a generation is
exclusive (local file systems), it renews the lease again if nobody changed it since its last
renewal, by the same compare-and-swap as every renewal: whoever acted on the lapse (a start
that took the root over, a rollback that broke the lease) created that generation first, and
the run stops. On object stores, where that is best effort, a lapsed run stops.

**Generations.** Every change of the lease (acquire, renew, release, break) is a
compare-and-swap: the lease lives in ``<root>/_lease/`` as one file per *generation*,
``<generation>.json``, the current lease being the highest generation, and a change that read
generation g succeeds only by creating generation g + 1, which fails if another writer created
it first. On local file systems the new file is written aside and hard-linked into place
(``link`` never replaces an existing file, so of two writers of one generation exactly one
wins, and readers never see half a lease). So a renewal that races a takeover cannot put the
old holder's lease back: it finds its generation taken and stops renewing. A released or
broken lease is a generation without a holder. Generations older than the previous one are
removed after each change. A ``_lease.json`` written by an older pyspark-abs is read as
generation 0 until the first change.

The lease is a guard against mistakes, not a distributed lock: on object stores (URIs with a
scheme other than ``file``) creating a generation is best effort (check, then write), and a
run paused between its check and its write can still write that one manifest entry, which
the manifest's own compare-and-swap then rejects if anything was appended meanwhile.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass, replace

import pyarrow as pa
import pyarrow.fs as pafs

from pyspark_abs.errors import FencingError, SnapshotRootError
from pyspark_abs.logs import logger
from pyspark_abs.storage.root import SnapshotRoot

log = logger(__name__)

LEASE_SECONDS = 30.0
"""How long a lease stays valid without renewal."""

_ADOPT_ATTEMPTS = 3
"""Tries to adopt a lease whose holder renews it at the same moment."""

LEASE_DIR = "_lease"
"""The folder under the snapshot root that holds the lease's generations."""

LEASE_FILE = "_lease.json"
"""The lease file of older pyspark-abs versions, read as generation 0."""

_GENERATION = re.compile(r"^(\d{12})\.json$")

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
        generation: The lease generation this record was read from or written as.
    """

    run_id: str
    pipeline: str
    host: str
    pid: int
    acquired_at: float
    renewed_at: float
    generation: int = 0

    def is_live(self, now: float) -> bool:
        """Whether the holder may still be running (see the module docstring)."""
        if self.lapsed(now):
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

    def lapsed(self, now: float) -> bool:
        """Whether the lease was not renewed within :data:`LEASE_SECONDS`."""
        return now - self.renewed_at >= LEASE_SECONDS

    def describe(self, now: float) -> str:
        """The holder, for messages."""
        return (
            f"run {self.run_id} of pipeline {self.pipeline!r} (host {self.host}, pid "
            f"{self.pid}, lease renewed {now - self.renewed_at:.0f} s ago)"
        )


def read_lease(root: SnapshotRoot) -> LeaseRecord | None:
    """The root's lease, or None if nobody holds it.

    Raises:
        SnapshotRootError: The lease cannot be read or parsed.
    """
    return _current(root)[1]


def break_lease(root: SnapshotRoot) -> LeaseRecord | None:
    """Free a root whose lease holder you know is gone; return the lease it held.

    A holder that is in fact still running stops at its next write with a FencingError.

    Raises:
        SnapshotRootError: The lease cannot be read or written.
    """
    for _attempt in range(10):
        generation, record = _current(root)
        if record is None or _publish(root, generation + 1, None):
            return record
    raise SnapshotRootError(
        f"cannot break the lease of snapshot root {root}: it keeps changing; stop the runs "
        f"that start on it, then try again"
    )


def require_no_live_holder(root: SnapshotRoot, action: str) -> None:
    """Refuse ``action`` while a live run holds the root; break a lease no longer live.

    Raises:
        FencingError: A live run holds the root's lease.
        SnapshotRootError: The lease cannot be read or written.
    """
    for _attempt in range(10):
        generation, record = _current(root)
        now = time.time()
        if record is None:
            return
        if record.is_live(now):
            raise FencingError(
                f"snapshot root {root} is held by {record.describe(now)}; {action} is refused "
                f"while it runs. Stop that pipeline first"
            )
        if _publish(root, generation + 1, None):
            return  # broken: a holder that only stalled cannot renew it again
    raise SnapshotRootError(
        f"cannot write {action} to snapshot root {root}: its lease keeps changing; stop the "
        f"runs that start on it, then try again"
    )


class Lease:
    """A run's lease on a snapshot root, renewed in the background until released."""

    def __init__(self, root: SnapshotRoot, record: LeaseRecord) -> None:
        self.root = root
        self.record = record
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._renew, name=f"pyspark-abs-lease-{record.pipeline}", daemon=True
        )

    @classmethod
    def acquire(cls, root: SnapshotRoot, pipeline: str, run_id: str) -> Lease:
        """Take the root's lease for a run, unless a live run holds it.

        Raises:
            FencingError: Another live run holds the root, or took it at the same moment.
            SnapshotRootError: The lease cannot be read or written.
        """
        generation, current = _current(root)
        now = time.time()
        if current is not None and current.run_id != run_id and current.is_live(now):
            raise FencingError(
                f"pipeline {pipeline!r} cannot start: snapshot root {root} is held by "
                f"{current.describe(now)}. Stop that run first; if it is gone, start again "
                f"after its lease expires ({LEASE_SECONDS:.0f} s after its last renewal) or "
                f"free the root with pyspark_abs.protocol.lease.break_lease({root!r})"
            )
        record = LeaseRecord(
            run_id, pipeline, socket.gethostname(), os.getpid(), now, now, generation + 1
        )
        if not _publish(root, record.generation, record):
            winner = read_lease(root)
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
    def adopt(cls, root: SnapshotRoot, record: LeaseRecord) -> Lease:
        """Take a run's lease over into this process, which writes the run's epochs.

        Under Spark Connect the client starts the run and acquires its lease, but the
        server's ``foreachBatch`` process writes the epochs. It adopts the lease on its first
        micro-batch: the lease then names this process and is renewed here, so the root
        stays held while the writer lives, not while the client does (a dead client's root
        is not taken over while its query still commits), and the client's own renewals
        stop because its generation is gone. The client releases the lease when the query
        has stopped; this process's renewals then stop too.

        Raises:
            FencingError: The run no longer holds the root, or its lease lapsed.
            SnapshotRootError: The lease cannot be read or written.
        """
        for _attempt in range(_ADOPT_ATTEMPTS):
            generation, current = _current(root)
            now = time.time()
            if (
                current is None
                or current.run_id != record.run_id
                or (current.lapsed(now) and not _exclusive(root))
            ):
                holder = "nobody" if current is None else current.describe(now)
                raise FencingError(
                    f"run {record.run_id} of pipeline {record.pipeline!r} cannot take its lease "
                    f"on snapshot root {root} into the writing process: the root is held by "
                    f"{holder}. Start the pipeline again"
                )
            adopted = replace(
                current,
                host=socket.gethostname(),
                pid=os.getpid(),
                renewed_at=now,
                generation=generation + 1,
            )
            if _publish(root, adopted.generation, adopted):
                _HELD.add(adopted.run_id)
                lease = cls(root, adopted)
                lease._thread.start()
                return lease
        raise FencingError(
            f"run {record.run_id} of pipeline {record.pipeline!r} could not take its lease on "
            f"snapshot root {root} into the writing process: it kept changing. Start the "
            f"pipeline again"
        )

    def check(self, what: str) -> None:
        """Make sure this run still holds the root before it writes ``what``.

        Raises:
            FencingError: Another run took the root over (or its lease was broken), or this
                run's lease lapsed: it was not renewed within :data:`LEASE_SECONDS`.
        """
        current = read_lease(self.root)
        now = time.time()
        if current is not None and current.run_id == self.record.run_id:
            if not current.lapsed(now):
                return
            if self.renew():
                log.warning(
                    "run %s of pipeline %r renewed its lapsed lease on snapshot root %s (last "
                    "renewed %.0f s before: a stall or a clock step); nobody had acted on it",
                    self.record.run_id,
                    self.record.pipeline,
                    self.root,
                    now - current.renewed_at,
                )
                return
            current = read_lease(self.root)
            now = time.time()
        if current is not None and current.run_id == self.record.run_id:
            raise FencingError(
                f"the lease of run {self.record.run_id} of pipeline {self.record.pipeline!r} "
                f"on snapshot root {self.root} lapsed: it was last renewed "
                f"{now - current.renewed_at:.0f} s ago (it must be renewed within "
                f"{LEASE_SECONDS:.0f} s), so another run may take the root over; {what} is "
                f"not written. This run must stop: the next start finishes its epochs"
            )
        holder = "nobody (the lease was broken)" if current is None else current.describe(now)
        raise FencingError(
            f"run {self.record.run_id} of pipeline {self.record.pipeline!r} no longer holds "
            f"snapshot root {self.root}, now held by {holder}; {what} is not written. This run "
            f"must stop: the current holder (or the next start) finishes its epochs"
        )

    def release(self) -> None:
        """Stop renewing and give the root up, if this run still holds it.

        Never raises: a run that ends on a storage error (a full disk, say) must report that
        error, not this one. A lease that cannot be released frees itself: a run that
        stopped renewing is no longer live in its own process, and lapses for others.
        """
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        _HELD.discard(self.record.run_id)
        try:
            generation, current = _current(self.root)
            if current is not None and current.run_id == self.record.run_id:
                _publish(self.root, generation + 1, None)
        except SnapshotRootError as err:
            log.warning("run %s could not release its lease: %s", self.record.run_id, err)

    def renew(self) -> bool:
        """Renew the lease once, if nobody changed it since this run's last renewal.

        A compare-and-swap: it writes the generation after the one holding this run's last
        renewal, so it fails when anyone changed the lease since. A lapsed lease is renewed
        only where that is exclusive (see the module docstring). Returns whether it renewed;
        once it has not, the run's next :meth:`check` fails and renewing stops.

        Raises:
            SnapshotRootError: The lease cannot be read or written.
        """
        generation, current = _current(self.root)
        if (
            current is None
            or current.run_id != self.record.run_id
            or generation != self.record.generation
        ):
            return False  # taken over, broken, or adopted by the writing process
        now = time.time()
        if current.lapsed(now) and not _exclusive(self.root):
            return False  # lapsed where a takeover cannot be excluded: another run may hold it
        renewed = replace(current, renewed_at=now, generation=generation + 1)
        if not _publish(self.root, renewed.generation, renewed):
            return False
        self.record = renewed
        return True

    def _renew(self) -> None:
        while not self._stop.wait(LEASE_SECONDS / 3):
            try:
                if not self.renew():
                    return
            except SnapshotRootError:
                continue  # a transient storage error: renew at the next beat


def _exclusive(root: SnapshotRoot) -> bool:
    """Whether creating a lease generation on the root excludes every other writer of it."""
    return isinstance(pafs.FileSystem.from_uri(root)[0], pafs.LocalFileSystem)


def _current(root: SnapshotRoot) -> tuple[int, LeaseRecord | None]:
    """The root's highest lease generation and its holder (None: released or none).

    Raises:
        SnapshotRootError: The lease cannot be read or parsed.
    """
    fs, path = pafs.FileSystem.from_uri(root)
    for _attempt in range(10):
        try:
            infos = fs.get_file_info(pafs.FileSelector(f"{path}/{LEASE_DIR}", allow_not_found=True))
        except (OSError, pa.ArrowException) as err:
            raise SnapshotRootError(f"cannot read the lease {root}/{LEASE_DIR}: {err}") from None
        generations = [int(m.group(1)) for i in infos if (m := _GENERATION.match(i.base_name))]
        if generations:
            generation = max(generations)
            location = f"{root}/{LEASE_DIR}/{generation:012d}.json"
            data = _read(fs, f"{path}/{LEASE_DIR}/{generation:012d}.json", location)
            if data is None:
                continue  # removed as an old generation since the listing: list again
        else:
            generation, location = 0, f"{root}/{LEASE_FILE}"
            data = _read(fs, f"{path}/{LEASE_FILE}", location)
            if data is None:
                return 0, None
        return generation, _parse(data, location, root, generation)
    raise SnapshotRootError(f"cannot read the lease {root}/{LEASE_DIR}: it keeps changing")


def _read(fs: pafs.FileSystem, path: str, location: str) -> bytes | None:
    try:
        with fs.open_input_stream(path) as stream:
            return bytes(stream.read())
    except FileNotFoundError:
        return None
    except (OSError, pa.ArrowException) as err:
        raise SnapshotRootError(f"cannot read the lease {location}: {err}") from None


def _parse(data: bytes, location: str, root: SnapshotRoot, generation: int) -> LeaseRecord | None:
    try:
        fields = json.loads(data)
        if fields.get("run_id") is None:
            return None  # released or broken
        fields["generation"] = generation
        return LeaseRecord(**fields)
    except (ValueError, TypeError, AttributeError) as err:
        raise SnapshotRootError(
            f"the lease {location} is damaged ({err}); if no pipeline runs on {root}, remove "
            f"it with pyspark_abs.protocol.lease.break_lease({root!r})"
        ) from None


def _publish(root: SnapshotRoot, generation: int, record: LeaseRecord | None) -> bool:
    """Create lease generation ``generation`` (``record`` None: nobody holds the root).

    Returns False when that generation exists already: another writer changed the lease
    first. Exclusive on local file systems, best effort elsewhere (see the module docstring).

    Raises:
        SnapshotRootError: The lease cannot be written.
    """
    fs, path = pafs.FileSystem.from_uri(root)
    folder = f"{path}/{LEASE_DIR}"
    target = f"{folder}/{generation:012d}.json"
    temporary = f"{folder}/.{generation:012d}.{uuid.uuid4().hex}"
    data = json.dumps(asdict(record) if record is not None else {"run_id": None}).encode()
    try:
        fs.create_dir(folder, recursive=True)
        with fs.open_output_stream(temporary) as out:
            out.write(data)
        if isinstance(fs, pafs.LocalFileSystem):
            try:
                os.link(temporary, target)  # never replaces: one writer per generation wins
            except FileExistsError:
                return False
            finally:
                os.unlink(temporary)
        else:
            if fs.get_file_info(target).type != pafs.FileType.NotFound:
                fs.delete_file(temporary)
                return False
            fs.move(temporary, target)
    except (OSError, pa.ArrowException) as err:
        raise SnapshotRootError(f"cannot write the lease {root}/{LEASE_DIR}: {err}") from None
    _clean(fs, path, generation)
    return True


def _clean(fs: pafs.FileSystem, path: str, generation: int) -> None:
    """Remove generations older than the previous one, and an older version's lease file."""
    with contextlib.suppress(OSError, pa.ArrowException):
        infos = fs.get_file_info(pafs.FileSelector(f"{path}/{LEASE_DIR}", allow_not_found=True))
        for info in infos:
            match = _GENERATION.match(info.base_name)
            if match and int(match.group(1)) < generation - 1:
                with contextlib.suppress(FileNotFoundError):
                    fs.delete_file(info.path)
        with contextlib.suppress(FileNotFoundError):
            fs.delete_file(f"{path}/{LEASE_FILE}")
