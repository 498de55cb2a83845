"""Errors raised by pyspark-abs.

Every error derives from :class:`AbsError`. Messages name the epoch, operator, table or key
involved and say what to do. Each class takes a single message, so an error raised inside a
Spark task can be rebuilt on the driver from the text Spark reports (see
:func:`rebuild_from_text`).
"""

from __future__ import annotations

import re


class AbsError(Exception):
    """Root of every error raised by pyspark-abs."""


class ConfigError(AbsError, ValueError):
    """A configuration value is missing, unknown or out of range."""


class OperatorDefinitionError(AbsError, ValueError):
    """An operator or pipeline is declared inconsistently (keys, schemas, sinks, timeouts)."""


class OperatorError(AbsError):
    """The user's operator function raised; the message names operator, epoch and key."""


class SchemaMismatchError(AbsError, TypeError):
    """A frame returned by the operator does not match its declared output or state schema."""


class InvalidTimeoutError(AbsError, ValueError):
    """A key's timeout is not allowed (wrong timeout mode, or already in the past)."""


class StateNotSetError(AbsError, LookupError):
    """A per-key function read the state of a key that has none."""


class StateEncodingError(AbsError):
    """A key group's state blob cannot be encoded or decoded."""


class StateTooLargeError(AbsError):
    """A key group's encoded state outgrew ``AbsConfig.max_key_group_state_bytes``."""


class AlignmentError(AbsError):
    """The barrier markers of an epoch do not cover every partition exactly once."""


class PrecommitFileError(AlignmentError):
    """A pre-committed file listed in a barrier marker is missing or has the wrong size."""


class SnapshotRootError(AbsError):
    """The snapshot root cannot be created, read or written."""


class ConcurrentWriteError(SnapshotRootError):
    """Another writer committed to a table after this one read it (a lost compare-and-swap)."""


class StorageError(AbsError):
    """A table's files cannot be written (disk full, read-only or unwritable storage)."""


class SnapshotDamagedError(AbsError):
    """A committed snapshot's files or Delta log are missing, cut short or unreadable."""


class FencingError(AbsError):
    """Another live run holds the snapshot root, or took it over from this run."""


class PipelineMismatchError(AbsError):
    """The snapshot root or checkpoint belongs to another pipeline or another checkpoint."""


class TableSchemaError(AbsError):
    """An existing state or sink table has a schema that differs from the declared one."""


class ManifestError(AbsError):
    """The manifest is unreadable or an epoch transition is not allowed."""


class CommitError(AbsError):
    """Committing an epoch's files to a Delta table failed."""


class SnapshotNotFoundError(AbsError, LookupError):
    """The requested epoch, operator or table is not in the snapshot root."""


class SourceError(AbsError):
    """A streaming source cannot read its table (missing table or log, unreadable change)."""


class QuiescenceError(AbsError):
    """A pipeline did not reach quiescence within its bound on epochs."""


class ReplayDivergedError(AbsError):
    """Spark's replay of a decided epoch could not reach every key group the epoch changed."""


class InjectedFault(AbsError):
    """A fault injected on purpose at a named protocol step (testing only)."""


_ALL: dict[str, type[AbsError]] = {
    cls.__name__: cls
    for cls in (
        AbsError,
        ConfigError,
        OperatorDefinitionError,
        OperatorError,
        SchemaMismatchError,
        InvalidTimeoutError,
        StateNotSetError,
        StateEncodingError,
        StateTooLargeError,
        AlignmentError,
        PrecommitFileError,
        SnapshotRootError,
        StorageError,
        SnapshotDamagedError,
        FencingError,
        PipelineMismatchError,
        TableSchemaError,
        ManifestError,
        CommitError,
        SnapshotNotFoundError,
        SourceError,
        QuiescenceError,
        ReplayDivergedError,
        InjectedFault,
    )
}

_IN_TEXT = re.compile(r"pyspark_abs\.errors\.(\w+): (.+)")


def rebuild_from_text(text: str) -> AbsError | None:
    """Find the innermost pyspark-abs error in a Spark error text and rebuild it.

    Spark reports an exception raised in a Python worker as text. This finds the last
    ``pyspark_abs.errors.<Name>: <message>`` line in it.

    Args:
        text: The text of a Spark exception, including the Python traceback it carries.

    Returns:
        The rebuilt error, or None if the text holds no pyspark-abs error.
    """
    matches = _IN_TEXT.findall(text)
    if not matches:
        return None
    name, message = matches[-1]
    return _ALL.get(name, AbsError)(message.strip())
