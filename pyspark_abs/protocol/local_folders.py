"""Where live-state files go on an executor's local disk, and removing what nobody uses.

Each snapshot root has a folder under ``<local_state_dir>/pyspark-abs-state/``, named by its
id and location (see :class:`~pyspark_abs.protocol.live_state.LocalLiveState`). A folder
whose root no run has used for :data:`UNUSED_SECONDS` (a deleted root, a root moved or
copied elsewhere, a folder of an older pyspark-abs) is removed by the first worker that
uses the same directory afterwards. Removing a folder is always safe: a run that needs its
files again rebuilds them from the snapshot root, and a task that has a file mapped keeps
its pages.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from functools import lru_cache

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
