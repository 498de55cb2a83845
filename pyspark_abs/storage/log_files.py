"""The files of a Delta table's log: listing them, and removing those below a version."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pyarrow.fs as pafs

_LOG_ENTRY = re.compile(r"^(\d{20})\.(json|checkpoint(?:\.\d+\.\d+)?\.parquet|crc)$")


@dataclass(frozen=True)
class LogEntries:
    """The versions a table's ``_delta_log`` holds entries for.

    Attributes:
        commits: Versions with a commit (JSON) file.
        checkpoints: Versions with a checkpoint.
    """

    commits: frozenset[int]
    checkpoints: frozenset[int]

    def expired(self, version: int) -> bool:
        """Whether ``version`` cannot load because the log before the oldest entry is gone.

        Delta's expired-log cleanup deletes the oldest commits, never one in the middle:
        a version below every remaining entry was cleaned up, one above was damaged.
        """
        remaining = self.commits | self.checkpoints
        return bool(remaining) and version < min(remaining)


def log_entries(uri: str) -> LogEntries:
    """The versions of a table's Delta log entries (see :class:`LogEntries`)."""
    fs, base = pafs.FileSystem.from_uri(uri)
    selector = pafs.FileSelector(f"{base}/_delta_log", allow_not_found=True)
    commits, checkpoints = set(), set()
    for info in fs.get_file_info(selector):
        match = _LOG_ENTRY.match(info.base_name)
        if match is None:
            continue
        if match.group(2) == "json":
            commits.add(int(match.group(1)))
        elif match.group(2).startswith("checkpoint"):
            checkpoints.add(int(match.group(1)))
    return LogEntries(frozenset(commits), frozenset(checkpoints))


def remove_log_below(uri: str, version: int) -> list[str]:
    """Delete a table's log entries that no version from ``version`` on needs.

    Those are the entries before the newest checkpoint at or below ``version``: loading
    that version or a later one starts from the checkpoint. Returns the deleted names.
    """
    start = max((c for c in log_entries(uri).checkpoints if c <= version), default=None)
    if start is None:
        return []
    fs, base = pafs.FileSystem.from_uri(uri)
    selector = pafs.FileSelector(f"{base}/_delta_log", allow_not_found=True)
    deleted = []
    for info in fs.get_file_info(selector):
        match = _LOG_ENTRY.match(info.base_name)
        if match is not None and int(match.group(1)) < start:
            try:
                fs.delete_file(info.path)
            except FileNotFoundError:
                continue
            deleted.append(info.base_name)
    return sorted(deleted)
