"""Errors raised by pyspark-abs.

Every error derives from :class:`AbsError`, through one of five families that say whose
move it is:

- :class:`DefinitionError`: the pipeline, operator, configuration or root is declared
  wrongly; fix the declaration (``ConfigError``, ``OperatorDefinitionError``,
  ``PipelineMismatchError``, ``TableSchemaError``).
- :class:`UserCodeError`: the operator function broke its contract at run time
  (``OperatorError``, ``SchemaMismatchError``, ``InvalidTimeoutError``,
  ``StateNotSetError``, ``StateEncodingError``, ``StateTooLargeError``).
- :class:`ProtocolError`: an epoch could not complete the snapshot protocol; nothing of it
  is visible and a restart recovers (``AlignmentError``, ``PrecommitFileError``,
  ``CommitError``, ``FencingError``, ``ManifestError``, ``QuiescenceError``,
  ``ReplayDivergedError``, ``InjectedFault``).
- :class:`SnapshotError`: a snapshot that was asked for is missing or damaged, or cannot be
  installed as it is (``SnapshotNotFoundError``, ``SnapshotDamagedError``,
  ``UncommittableEpochError``, ``ExternalChangeError``).
- :class:`StorageIOError`: a table, file or log cannot be read or written
  (``SnapshotRootError``, ``ConcurrentWriteError``, ``StorageError``, ``SourceError``).

Messages name the epoch, operator, table or key
involved and say what to do. Each class takes a single message, so an error raised inside a
Spark task can be rebuilt on the driver from the text Spark reports (see
:func:`rebuild_from_text`).
"""

from __future__ import annotations

import os
import re
import traceback
from pathlib import Path


class AbsError(Exception):
    """Root of every error raised by pyspark-abs."""

    def at(self, where: str) -> AbsError:
        """This error with ``where`` before its message, unless the message starts with it."""
        text = str(self)
        return self if text.startswith(where) else type(self)(f"{where}: {text}")


class DefinitionError(AbsError):
    """Family: something is declared wrongly; fix the declaration and start again."""


class UserCodeError(AbsError):
    """Family: the user's operator function broke its contract at run time."""


class ProtocolError(AbsError):
    """Family: an epoch could not complete the snapshot protocol; a restart recovers."""


class SnapshotError(AbsError):
    """Family: a snapshot that was asked for is missing or damaged."""


class StorageIOError(AbsError):
    """Family: a table, file or log cannot be read or written."""


class ConfigError(DefinitionError, ValueError):
    """A configuration value is missing, unknown or out of range."""


class SparkVersionError(DefinitionError):
    """A feature needs a newer Spark than the session runs; the message names both."""


class OperatorDefinitionError(DefinitionError, ValueError):
    """An operator or pipeline is declared inconsistently (keys, schemas, sinks, timeouts)."""


class OperatorError(UserCodeError):
    """The user's operator function raised; the message names operator, epoch and key."""


class SchemaMismatchError(UserCodeError, TypeError):
    """A frame returned by the operator does not match its declared output or state schema."""


class InvalidTimeoutError(UserCodeError, ValueError):
    """A key's timeout is not allowed (wrong timeout mode, or already in the past)."""


class StateNotSetError(UserCodeError, LookupError):
    """A per-key function read the state of a key that has none."""


class StateEncodingError(UserCodeError):
    """A key group's state blob cannot be encoded or decoded."""


class StateTooLargeError(UserCodeError):
    """A key group's encoded state outgrew ``AbsConfig.max_key_group_state_bytes``."""


class AlignmentError(ProtocolError):
    """The barrier markers of an epoch do not cover every partition exactly once."""


class PrecommitFileError(AlignmentError):
    """A pre-committed file listed in a barrier marker is missing or has the wrong size."""


class SnapshotRootError(StorageIOError):
    """The snapshot root cannot be created, read or written."""


class ConcurrentWriteError(SnapshotRootError):
    """Another writer committed to a table after this one read it (a lost compare-and-swap)."""


class StorageError(StorageIOError):
    """A table's files cannot be written (disk full, read-only or unwritable storage)."""


class SnapshotDamagedError(SnapshotError):
    """A committed snapshot's files or Delta log are missing, cut short or unreadable."""


class FencingError(ProtocolError):
    """Another live run holds the snapshot root, or took it over from this run."""


class PipelineMismatchError(DefinitionError):
    """The snapshot root or checkpoint belongs to another pipeline or another checkpoint."""


class TableSchemaError(DefinitionError):
    """An existing state or sink table has a schema that differs from the declared one."""


class StateEvolutionError(TableSchemaError):
    """Stored state differs from the declared state schema in a way no declared rule allows."""


class ManifestError(ProtocolError):
    """The manifest is unreadable or an epoch transition is not allowed."""


class CommitError(ProtocolError):
    """Committing an epoch's files to a Delta table failed."""


class SnapshotNotFoundError(SnapshotError, LookupError):
    """The requested epoch, operator or table is not in the snapshot root."""


class UncommittableEpochError(SnapshotError):
    """A decided (PREPARED) epoch can never be committed: files it needs are gone."""


class ExternalChangeError(SnapshotError):
    """A table was changed outside pyspark-abs in a way a restore or a reader cannot keep."""


class SourceError(StorageIOError):
    """A streaming source cannot read its table (missing table or log, unreadable change)."""


class UpstreamNotReadyError(SourceError):
    """A stage's upstream stages have not committed the epoch its first micro-batch reads."""


class QuiescenceError(ProtocolError):
    """A pipeline did not reach quiescence within its bound on epochs."""


class ReplayDivergedError(ProtocolError):
    """Spark's replay of a decided epoch could not reach every key group the epoch changed."""


class PublishError(StorageIOError):
    """A committed epoch could not be published to its Kafka topic; the next start retries."""


class InjectedFault(ProtocolError):
    """A fault injected on purpose at a named protocol step (testing only)."""


def error_classes() -> list[type[AbsError]]:
    """:class:`AbsError` and every class of this module below it, each after its base."""
    found: list[type[AbsError]] = [AbsError]
    for cls in found:
        found.extend(
            sub for sub in cls.__subclasses__() if sub.__module__ == __name__ and sub not in found
        )
    return found


def describe(err: BaseException) -> str:
    """An exception a user's function raised, on one line: type, message and where.

    Where is the user's own frames of the traceback (the last three, outermost first: file,
    line, function and code), leaving out pyspark-abs and the libraries it calls into, so
    the line that raised shows without DEBUG logging, also after Spark carried the error
    from a Python worker to the driver.
    """
    text = f"{type(err).__name__}: {err}"
    frames = [f for f in traceback.extract_tb(err.__traceback__) if _users(f.filename)][-3:]
    if frames:
        text += " (at " + " -> ".join(_frame(f) for f in frames) + ")"
    return text.replace("\n", " ")


_PACKAGE = str(Path(__file__).resolve().parent) + os.sep
_LIBRARIES = tuple(f"{os.sep}{name}{os.sep}" for name in ("pandas", "numpy", "pyarrow", "pyspark"))


def _users(filename: str) -> bool:
    if filename.startswith(_PACKAGE) or filename.startswith("<frozen"):
        return False
    return not ("-packages" in filename and any(lib in filename for lib in _LIBRARIES))


def _frame(frame: traceback.FrameSummary) -> str:
    code = f": {frame.line.strip()}" if frame.line else ""
    return f"{frame.filename}:{frame.lineno} in {frame.name}{code}"


_ALL: dict[str, type[AbsError]] = {cls.__name__: cls for cls in error_classes()}

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
