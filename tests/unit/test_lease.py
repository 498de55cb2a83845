import json
import socket
import subprocess
import threading
import time
from dataclasses import asdict
from pathlib import Path

import pytest

import pyspark_abs.protocol.lease as lease_module
from pyspark_abs.errors import FencingError
from pyspark_abs.manifest.table import open_manifest
from pyspark_abs.protocol.epoch_writer import EpochWriter, now
from pyspark_abs.protocol.lease import (
    LEASE_DIR,
    LEASE_FILE,
    LEASE_SECONDS,
    Lease,
    LeaseRecord,
    break_lease,
    read_lease,
    require_no_live_holder,
)
from pyspark_abs.storage.root import SnapshotRoot
from pyspark_abs.storage.store import DeltaStore
from tests.support.manifest import entry


def plant(root: Path, **changes: object) -> LeaseRecord:
    """Write a lease as another run would have."""
    now = time.time()
    fields: dict[str, object] = {
        "run_id": "other",
        "pipeline": "wc",
        "host": socket.gethostname(),
        "pid": 1,
        "acquired_at": now,
        "renewed_at": now,
    }
    fields.update(changes)
    record = LeaseRecord(**fields)  # type: ignore[arg-type]
    (root / LEASE_FILE).write_text(json.dumps(asdict(record)))
    return record


def dead_pid() -> int:
    finished = subprocess.Popen(["true"])
    finished.wait()
    return finished.pid


def test_a_live_run_keeps_the_root_until_it_releases_it(tmp_path: Path) -> None:
    first = Lease.acquire(SnapshotRoot(tmp_path), "wc", "first")
    with pytest.raises(
        FencingError,
        match=r"pipeline 'wc' cannot start: snapshot root .* is held by run first of pipeline "
        r"'wc' \(host .*, pid \d+, lease renewed 0 s ago\)\. Stop that run first",
    ):
        Lease.acquire(SnapshotRoot(tmp_path), "wc", "second")
    with pytest.raises(FencingError, match="rollback is refused while it runs"):
        require_no_live_holder(SnapshotRoot(tmp_path), "rollback")
    first.check("epoch 1 PREPARED")
    first.release()
    assert read_lease(SnapshotRoot(tmp_path)) is None
    require_no_live_holder(SnapshotRoot(tmp_path), "rollback")
    Lease.acquire(SnapshotRoot(tmp_path), "wc", "second").release()


def test_a_dead_process_on_this_host_is_taken_over_at_once(tmp_path: Path) -> None:
    plant(tmp_path, pid=dead_pid())
    lease = Lease.acquire(SnapshotRoot(tmp_path), "wc", "mine")
    assert read_lease(SnapshotRoot(tmp_path)) == lease.record
    lease.release()


def test_another_host_holds_the_root_until_its_lease_expires(tmp_path: Path) -> None:
    plant(tmp_path, host="elsewhere")
    with pytest.raises(FencingError, match=r"held by run other .*host elsewhere"):
        Lease.acquire(SnapshotRoot(tmp_path), "wc", "mine")
    plant(tmp_path, host="elsewhere", renewed_at=time.time() - LEASE_SECONDS - 1)
    Lease.acquire(SnapshotRoot(tmp_path), "wc", "mine").release()


def test_a_run_that_lost_the_root_is_fenced_and_leaves_the_new_lease(tmp_path: Path) -> None:
    zombie = Lease.acquire(SnapshotRoot(tmp_path), "wc", "zombie")
    break_lease(SnapshotRoot(tmp_path))  # the operator declares the zombie gone
    with pytest.raises(FencingError, match=r"no longer holds .* now held by nobody"):
        zombie.check("epoch 3 COMMITTED")
    owner = Lease.acquire(SnapshotRoot(tmp_path), "wc", "owner")
    with pytest.raises(
        FencingError,
        match=r"run zombie of pipeline 'wc' no longer holds snapshot root .*, now held by run "
        r"owner .*; epoch 3 COMMITTED is not written. This run must stop",
    ):
        zombie.check("epoch 3 COMMITTED")
    zombie.release()
    assert read_lease(SnapshotRoot(tmp_path)) == owner.record
    owner.release()


def renew_after(start: threading.Barrier, lease: Lease) -> None:
    start.wait()
    lease.renew()


def test_a_renewal_racing_a_break_never_puts_the_lease_back(tmp_path: Path) -> None:
    """Renewal is compare-and-swap: of a renewal and a break racing, the break stands."""
    root = str(tmp_path)
    for round_ in range(20):
        zombie = Lease.acquire(SnapshotRoot(root), "wc", f"zombie-{round_}")
        zombie._stop.set()  # only the racing renewal below renews
        start = threading.Barrier(2)
        thread = threading.Thread(target=renew_after, args=(start, zombie))
        thread.start()
        start.wait()
        break_lease(SnapshotRoot(root))
        thread.join()
        assert read_lease(SnapshotRoot(root)) is None, (
            f"round {round_}: the renewal put the lease back"
        )
        assert zombie.renew() is False
        with pytest.raises(FencingError, match="now held by nobody"):
            zombie.check("epoch 1 COMMITTED")
        zombie.release()
    assert len(list((tmp_path / LEASE_DIR).iterdir())) <= 2  # old generations are removed


def test_a_renewal_after_a_takeover_fails_and_leaves_the_new_lease(tmp_path: Path) -> None:
    zombie = Lease.acquire(SnapshotRoot(tmp_path), "wc", "zombie")
    break_lease(SnapshotRoot(tmp_path))
    owner = Lease.acquire(SnapshotRoot(tmp_path), "wc", "owner")
    assert zombie.renew() is False
    assert owner.renew() is True
    assert read_lease(SnapshotRoot(tmp_path)) == owner.record
    assert owner.record.generation == 4
    owner.release()
    zombie.release()


class SteppedClock:
    """The ``time`` module as the lease reads it, with the wall clock stepped forward."""

    def __init__(self, step: float) -> None:
        self.step = step

    def time(self) -> float:
        return time.time() + self.step


def stalled(root: Path, monkeypatch: pytest.MonkeyPatch, run_id: str = "mine") -> Lease:
    """A run's lease whose renewals stopped until it lapsed, as in a process or machine that
    stalled: the clock the lease reads is stepped past :data:`LEASE_SECONDS`."""
    monkeypatch.setattr(lease_module, "time", time)  # unstepped, if an earlier call stepped it
    lease = Lease.acquire(SnapshotRoot(root), "wc", run_id)
    lease.check("epoch 0 PREPARED")
    lease._stop.set()
    lease._thread.join()
    monkeypatch.setattr(lease_module, "time", SteppedClock(LEASE_SECONDS + 1))
    assert read_lease(SnapshotRoot(root)) == lease.record
    return lease


def test_a_run_whose_lease_lapsed_with_nobody_acting_on_it_renews_it_and_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lease = stalled(tmp_path, monkeypatch)
    before = lease.record.generation
    lease.check("epoch 1 PREPARED")
    assert lease.record.generation == before + 1
    assert read_lease(SnapshotRoot(tmp_path)) == lease.record
    with pytest.raises(FencingError, match="cannot start"):  # held again: no takeover
        Lease.acquire(SnapshotRoot(tmp_path), "wc", "next")
    lease.release()


def test_a_wall_clock_step_forward_does_not_stop_a_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lease = Lease.acquire(SnapshotRoot(tmp_path), "wc", "mine")
    monkeypatch.setattr(lease_module, "time", SteppedClock(LEASE_SECONDS + 5))
    lease.check("epoch 1 PREPARED")
    assert lease.renew() is True
    lease.release()
    assert read_lease(SnapshotRoot(tmp_path)) is None


def test_a_lapsed_lease_a_writer_without_a_lease_broke_fences_its_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lease = stalled(tmp_path, monkeypatch)
    require_no_live_holder(SnapshotRoot(tmp_path), "epoch 3 ROLLED_BACK")  # a rollback writes
    assert read_lease(SnapshotRoot(tmp_path)) is None
    broken = (
        r"run mine of pipeline 'wc' no longer holds snapshot root .*, now held by nobody "
        r"\(the lease was broken\); epoch 1 PREPARED is not written. This run must stop"
    )
    with pytest.raises(FencingError, match=broken):
        lease.check("epoch 1 PREPARED")
    assert lease.renew() is False
    store = DeltaStore()
    store.ensure_root(SnapshotRoot(tmp_path))
    writer = EpochWriter(
        "wc",
        SnapshotRoot(tmp_path),
        store,
        open_manifest(store, SnapshotRoot(tmp_path), "wc"),
        "mine",
        lease=lease,
    )
    prepared = entry(0, pipeline="wc", recorded_at=now(), run_id="mine")
    with pytest.raises(FencingError, match="epoch 0 PREPARED is not written"):
        writer.record(prepared)
    assert open_manifest(store, SnapshotRoot(tmp_path), "wc").entries == []
    Lease.acquire(SnapshotRoot(tmp_path), "wc", "next").release()  # the root can be taken over
    lease.release()


def test_a_lapsed_lease_where_creation_is_not_exclusive_fences_its_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On object stores a takeover cannot be excluded, so a lapsed run stops."""
    lease = stalled(tmp_path, monkeypatch)
    monkeypatch.setattr(lease_module, "_exclusive", lambda root: False)
    lapsed = (
        r"the lease of run mine of pipeline 'wc' on snapshot root .* lapsed: it was last "
        r"renewed \d+ s ago .*; epoch 1 PREPARED is not written. This run must stop"
    )
    with pytest.raises(FencingError, match=lapsed):
        lease.check("epoch 1 PREPARED")
    assert lease.renew() is False
    lease.release()


def check_after(start: threading.Barrier, lease: Lease, outcomes: list[str]) -> None:
    start.wait()
    try:
        lease.check("epoch 1 PREPARED")
        outcomes.append("stalled run went on")
    except FencingError:
        outcomes.append("stalled run fenced")


def test_of_a_stalled_run_and_a_takeover_racing_for_its_lapsed_lease_exactly_one_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for round_ in range(20):
        root = tmp_path / str(round_)
        lease = stalled(root, monkeypatch, f"stalled-{round_}")
        outcomes: list[str] = []
        start = threading.Barrier(2)
        thread = threading.Thread(target=check_after, args=(start, lease, outcomes))
        thread.start()
        start.wait()
        try:
            taker: Lease | None = Lease.acquire(SnapshotRoot(root), "wc", f"taker-{round_}")
        except FencingError:
            taker = None
        thread.join()
        holder = read_lease(SnapshotRoot(root))
        assert holder is not None
        if taker is None:
            assert outcomes == ["stalled run went on"], f"round {round_}"
            assert holder.run_id == lease.record.run_id
        else:
            assert outcomes == ["stalled run fenced"], f"round {round_}"
            assert holder == taker.record
            taker.release()
        lease.release()


def test_a_lease_file_of_an_older_version_is_honoured_then_replaced(tmp_path: Path) -> None:
    plant(tmp_path, host="elsewhere")
    with pytest.raises(FencingError, match=r"held by run other .*host elsewhere"):
        Lease.acquire(SnapshotRoot(tmp_path), "wc", "mine")
    plant(tmp_path, pid=dead_pid())
    lease = Lease.acquire(SnapshotRoot(tmp_path), "wc", "mine")
    assert not (tmp_path / LEASE_FILE).exists()
    assert read_lease(SnapshotRoot(tmp_path)) == lease.record
    lease.release()
    assert read_lease(SnapshotRoot(tmp_path)) is None


def test_the_writing_process_adopts_the_lease_and_renews_it(tmp_path: Path) -> None:
    """Spark Connect: the client acquires, the server-side run adopts and renews."""
    root = str(tmp_path)
    client = Lease.acquire(SnapshotRoot(root), "wc", "run-1")
    writer = Lease.adopt(SnapshotRoot(root), client.record)
    assert writer.record.generation == client.record.generation + 1
    assert read_lease(SnapshotRoot(root)) == writer.record
    assert client.renew() is False  # its generation is gone: the client stops renewing
    assert writer.renew() is True
    writer.check("epoch 0 PREPARED")
    with pytest.raises(FencingError, match="cannot start"):
        Lease.acquire(SnapshotRoot(root), "wc", "run-2")

    client.release()  # the query has stopped: the client frees the root
    assert read_lease(SnapshotRoot(root)) is None
    assert writer.renew() is False
    with pytest.raises(FencingError, match="no longer holds"):
        writer.check("epoch 1 PREPARED")
    with pytest.raises(FencingError, match="cannot take its lease"):
        Lease.adopt(SnapshotRoot(root), writer.record)
    writer.release()
