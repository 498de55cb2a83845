"""The commits of a Delta table's log, and whether pyspark-abs or another writer made them.

Readers of a channel and restores of a sink must know what other writers did to a table
pyspark-abs commits to: a ``DELETE`` (a person's data erased), an ``OPTIMIZE`` (files
rewritten, the rows kept), an ``UPDATE``. Every pyspark-abs commit carries its application
transaction in its commit info; any other commit is another writer's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.fs as pafs

from pyspark_abs.storage.transactions import APP_ID_KEY


@dataclass(frozen=True)
class Commit:
    """What one version of a table's log did.

    Attributes:
        version: The table version.
        operation: The writer's name for it (``WRITE``, ``DELETE``, ``OPTIMIZE``, ...).
        ours: Whether pyspark-abs made it (it carries an application transaction of ours).
        added: Paths of the files it adds.
        removed: Paths of the files it removes as a change of data.
        rewritten: Paths of the files it removes without a change of data (compaction).
        partitions: The partition values of each file it adds, as the log writes them.
    """

    version: int
    operation: str
    ours: bool
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    rewritten: tuple[str, ...] = ()
    partitions: Mapping[str, tuple[tuple[str, str | None], ...]] = field(default_factory=dict)

    @property
    def changes_rows(self) -> bool:
        """Whether it removes rows from the table (an append or a compaction does not)."""
        return bool(self.removed)


def read_commit(uri: str, version: int) -> Commit | None:
    """Version ``version`` of the table at ``uri``; None if its commit file is not there."""
    fs, base = pafs.FileSystem.from_uri(uri)
    try:
        with fs.open_input_stream(f"{base}/_delta_log/{version:020d}.json") as stream:
            text = stream.read().decode("utf-8")
    except FileNotFoundError:
        return None
    except (OSError, pa.ArrowException, UnicodeDecodeError):
        return None
    actions = [json.loads(line) for line in text.splitlines() if line.strip()]
    return parse_commit(version, actions)


def parse_commit(version: int, actions: list[Mapping[str, Any]]) -> Commit:
    """A commit from its log actions (one JSON object per line of the commit file)."""
    info: Mapping[str, Any] = {}
    added, removed, rewritten = [], [], []
    partitions = {}
    for action in actions:
        if "commitInfo" in action:
            info = action["commitInfo"]
        elif "add" in action:
            path = unquote(str(action["add"]["path"]))
            added.append(path)
            partitions[path] = tuple(sorted((action["add"].get("partitionValues") or {}).items()))
        elif "remove" in action:
            path = unquote(str(action["remove"]["path"]))
            if action["remove"].get("dataChange", True):
                removed.append(path)
            else:
                rewritten.append(path)
    return Commit(
        version,
        str(info.get("operation", "unknown operation")),
        APP_ID_KEY in info,
        tuple(added),
        tuple(removed),
        tuple(rewritten),
        partitions,
    )


def commits_between(uri: str, first: int, last: int) -> list[Commit]:
    """The commits of versions ``first`` to ``last`` (inclusive) whose commit file exists."""
    found = (read_commit(uri, v) for v in range(first, last + 1))
    return [c for c in found if c is not None]
