"""Where live-state files go on an executor's local disk, and removing what nobody uses.

Each snapshot root has a folder under ``<local_state_dir>/pyspark-abs-state/``, named by its
id and location (see :class:`~pyspark_abs.protocol.live_state.LocalLiveState`). A folder
whose root no run has used for :data:`UNUSED_SECONDS` (a deleted root, a root moved or
copied elsewhere, a folder of an older pyspark-abs) is removed by the first worker that
uses the same directory afterwards. Removing a folder is always safe: a run that needs its
files again rebuilds them from the snapshot root, and a task that has a file mapped keeps
its pages. The writers of live-state files are here too.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

import pyarrow as pa

TOP = "pyspark-abs-state"
"""The folder under ``local_state_dir`` that holds every root's folder."""

UNUSED_SECONDS = 7 * 24 * 3600.0
"""How long a root's folder may go unused before another root's worker removes it."""

_STAMP = ".used"
_TOUCH_EVERY_SECONDS = 3600.0
_touched: dict[str, float] = {}


@lru_cache(maxsize=64)
def operator_home(directory: str, root_key: str, operator: str) -> str:
    """The folder of one operator's live state files on this host.

    The first call in a process for a directory removes the root folders nobody used for
    :data:`UNUSED_SECONDS`.
    """
    top = os.path.join(directory or tempfile.gettempdir(), TOP)
    _sweep(top)
    return os.path.join(top, root_key, operator)


def mark_used(home: str) -> None:
    """Stamp the root folder of an operator's ``home`` as in use (at most once an hour)."""
    root_folder = os.path.dirname(home)
    now = time.time()
    if now - _touched.get(root_folder, 0.0) < _TOUCH_EVERY_SECONDS:
        return
    stamp = os.path.join(root_folder, _STAMP)
    try:
        os.utime(stamp)
    except FileNotFoundError:
        with contextlib.suppress(OSError):
            os.makedirs(root_folder, exist_ok=True)
            open(stamp, "a").close()
    except OSError:
        return
    _touched[root_folder] = now


@lru_cache(maxsize=16)
def _sweep(top: str) -> None:
    """Remove the root folders under ``top`` that nobody used for :data:`UNUSED_SECONDS`."""
    limit = time.time() - UNUSED_SECONDS
    try:
        entries = list(os.scandir(top))
    except OSError:
        return
    for entry in entries:
        if not entry.is_dir(follow_symlinks=False):
            continue
        try:
            used = os.stat(os.path.join(entry.path, _STAMP)).st_mtime
        except OSError:
            used = entry.stat(follow_symlinks=False).st_mtime
        if used < limit:
            shutil.rmtree(entry.path, ignore_errors=True)


def create_file(path: str, parts: Sequence[bytes | pa.Buffer]) -> bool:
    """Write a file, creating its folder if needed; True."""
    try:
        out = open(path, "wb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        out = open(path, "wb")  # noqa: SIM115
    with out:
        for part in parts:
            out.write(part)
    return True


def replace_file(path: str, parts: Sequence[bytes | pa.Buffer]) -> bool:
    """Write a file through a temporary one: a task still mapping the old file keeps it."""
    temporary = f"{path}.{os.getpid()}"
    create_file(temporary, parts)
    os.replace(temporary, path)
    return True


def recycling(stale: str) -> Callable[[str, Sequence[bytes | pa.Buffer]], bool]:
    """A writer that renames ``stale`` to its path and overwrites it.

    The writer returns False if another task took the stale file first.
    """

    def write(path: str, parts: Sequence[bytes | pa.Buffer]) -> bool:
        try:
            os.rename(stale, path)
        except FileNotFoundError:
            return False
        with open(path, "r+b") as out:
            for part in parts:
                out.write(part)
            out.truncate()
        return True

    return write


@contextmanager
def locked(path: Path, *, exclusive: bool) -> Iterator[None]:
    """Hold a shared or exclusive lock on the file ``path`` (created if missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
