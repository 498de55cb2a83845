import json
import socket
import subprocess
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from pyspark_abs import FencingError
from pyspark_abs.lease import (
    LEASE_FILE,
    LEASE_SECONDS,
    Lease,
    LeaseRecord,
    break_lease,
    read_lease,
    require_no_live_holder,
)


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
    first = Lease.acquire(str(tmp_path), "wc", "first")
    with pytest.raises(
        FencingError,
        match=r"pipeline 'wc' cannot start: snapshot root .* is held by run first of pipeline "
        r"'wc' \(host .*, pid \d+, lease renewed 0 s ago\)\. Stop that run first",
    ):
        Lease.acquire(str(tmp_path), "wc", "second")
    with pytest.raises(FencingError, match="rollback is refused while it runs"):
        require_no_live_holder(str(tmp_path), "rollback")
    first.check("epoch 1 PREPARED")
    first.release()
    assert read_lease(str(tmp_path)) is None
    require_no_live_holder(str(tmp_path), "rollback")
    Lease.acquire(str(tmp_path), "wc", "second").release()


def test_a_dead_process_on_this_host_is_taken_over_at_once(tmp_path: Path) -> None:
    plant(tmp_path, pid=dead_pid())
    lease = Lease.acquire(str(tmp_path), "wc", "mine")
    assert read_lease(str(tmp_path)) == lease.record
    lease.release()


def test_another_host_holds_the_root_until_its_lease_expires(tmp_path: Path) -> None:
    plant(tmp_path, host="elsewhere")
    with pytest.raises(FencingError, match=r"held by run other .*host elsewhere"):
        Lease.acquire(str(tmp_path), "wc", "mine")
    plant(tmp_path, host="elsewhere", renewed_at=time.time() - LEASE_SECONDS - 1)
    Lease.acquire(str(tmp_path), "wc", "mine").release()


def test_a_run_that_lost_the_root_is_fenced_and_leaves_the_new_lease(tmp_path: Path) -> None:
    zombie = Lease.acquire(str(tmp_path), "wc", "zombie")
    break_lease(str(tmp_path))  # the operator declares the zombie gone
    with pytest.raises(FencingError, match=r"no longer holds .* now held by nobody"):
        zombie.check("epoch 3 COMMITTED")
    owner = Lease.acquire(str(tmp_path), "wc", "owner")
    with pytest.raises(
        FencingError,
        match=r"run zombie of pipeline 'wc' no longer holds snapshot root .*, now held by run "
        r"owner .*; epoch 3 COMMITTED is not written. This run must stop",
    ):
        zombie.check("epoch 3 COMMITTED")
    zombie.release()
    assert read_lease(str(tmp_path)) == owner.record
    owner.release()
