"""pyspark-abs: Asynchronous Barrier Snapshotting for PySpark Structured Streaming.

Stateful pandas operators whose state and outputs are snapshotted every micro-batch epoch
(or every N epochs, ``AbsConfig.snapshot_interval``) and committed to Delta Lake tables
through a two-phase commit, exactly once.

The lifecycle, module by module: ``operators`` (what you write) → ``keygroups`` and
``execution`` (running it per key group) → ``envelope`` → ``precommit`` (tasks write files)
→ ``barrier`` (markers) → ``alignment`` → ``manifest`` (PREPARED, COMMITTED) → ``store``
(Delta) → ``coordinator``, ``commit`` and ``committer`` (phase 2) → ``recovery`` →
``snapshots`` (read) → ``savepoints`` (rollback, restore, written state) with ``sources``
(replayable Delta source) → ``maintenance`` (compaction, retention, vacuum, validate).
``backedge`` closes feedback loops: back-edge logs in each snapshot, loop heads, quiescence.

Importing the package is cheap: the errors are imported at once, every other public name on
first use, so Spark's Python workers that unpickle one class (say the Delta source) do not
load pandas and the pipeline machinery.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from pyspark_abs.errors import (
    AbsError,
    AlignmentError,
    CommitError,
    ConfigError,
    FencingError,
    InjectedFault,
    InvalidTimeoutError,
    ManifestError,
    OperatorDefinitionError,
    OperatorError,
    PipelineMismatchError,
    PrecommitFileError,
    QuiescenceError,
    ReplayDivergedError,
    SchemaMismatchError,
    SnapshotDamagedError,
    SnapshotNotFoundError,
    SnapshotRootError,
    SourceError,
    StateEncodingError,
    StateNotSetError,
    StateTooLargeError,
    StorageError,
    TableSchemaError,
)
from pyspark_abs.runtime import require_pyspark

require_pyspark()

if TYPE_CHECKING:
    from pyspark_abs.admin.savepoints import restore, rollback, write_state
    from pyspark_abs.config import AbsConfig
    from pyspark_abs.faults import (
        Fault,
        FaultAction,
        FaultStep,
    )
    from pyspark_abs.manifest.entries import EpochStatus
    from pyspark_abs.manifest.info import SnapshotInfo
    from pyspark_abs.operators.contract import (
        Clock,
        KeyGroupContext,
        KeyGroupResult,
        KeyState,
        Operator,
        TimeoutMode,
        operator,
        vectorized_operator,
    )
    from pyspark_abs.pipeline.backedge import BackEdge
    from pyspark_abs.pipeline.declaration import DeltaSink, Pipeline, PipelineQuery, Quiescence
    from pyspark_abs.protocol.listeners import SnapshotListener
    from pyspark_abs.session import local_session
    from pyspark_abs.snapshots.reading import Snapshots
    from pyspark_abs.sources import DeltaSource, FileSource, KafkaSource

__version__ = "0.1.0"

_LAZY = {
    "BackEdge": "pyspark_abs.pipeline.backedge",
    "AbsConfig": "pyspark_abs.config",
    "Fault": "pyspark_abs.faults",
    "FaultAction": "pyspark_abs.faults",
    "FaultStep": "pyspark_abs.faults",
    "EpochStatus": "pyspark_abs.manifest.entries",
    "SnapshotListener": "pyspark_abs.protocol.listeners",
    "Clock": "pyspark_abs.operators.contract",
    "KeyGroupContext": "pyspark_abs.operators.contract",
    "KeyGroupResult": "pyspark_abs.operators.contract",
    "KeyState": "pyspark_abs.operators.contract",
    "Operator": "pyspark_abs.operators.contract",
    "TimeoutMode": "pyspark_abs.operators.contract",
    "operator": "pyspark_abs.operators.contract",
    "vectorized_operator": "pyspark_abs.operators.contract",
    "DeltaSink": "pyspark_abs.pipeline.declaration",
    "Pipeline": "pyspark_abs.pipeline.declaration",
    "PipelineQuery": "pyspark_abs.pipeline.declaration",
    "Quiescence": "pyspark_abs.pipeline.declaration",
    "restore": "pyspark_abs.admin.savepoints",
    "rollback": "pyspark_abs.admin.savepoints",
    "write_state": "pyspark_abs.admin.savepoints",
    "local_session": "pyspark_abs.session",
    "SnapshotInfo": "pyspark_abs.manifest.info",
    "Snapshots": "pyspark_abs.snapshots.reading",
    "DeltaSource": "pyspark_abs.sources",
    "FileSource": "pyspark_abs.sources",
    "KafkaSource": "pyspark_abs.sources",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pyspark_abs' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "AbsConfig",
    "AbsError",
    "AlignmentError",
    "BackEdge",
    "Clock",
    "CommitError",
    "ConfigError",
    "DeltaSink",
    "DeltaSource",
    "EpochStatus",
    "Fault",
    "FaultAction",
    "FaultStep",
    "FencingError",
    "FileSource",
    "InjectedFault",
    "InvalidTimeoutError",
    "KafkaSource",
    "KeyGroupContext",
    "KeyGroupResult",
    "KeyState",
    "ManifestError",
    "Operator",
    "OperatorDefinitionError",
    "OperatorError",
    "Pipeline",
    "PipelineMismatchError",
    "PipelineQuery",
    "PrecommitFileError",
    "Quiescence",
    "QuiescenceError",
    "ReplayDivergedError",
    "SchemaMismatchError",
    "SnapshotDamagedError",
    "SnapshotInfo",
    "SnapshotListener",
    "SnapshotNotFoundError",
    "SnapshotRootError",
    "Snapshots",
    "SourceError",
    "StateEncodingError",
    "StateNotSetError",
    "StateTooLargeError",
    "StorageError",
    "TableSchemaError",
    "TimeoutMode",
    "local_session",
    "operator",
    "restore",
    "rollback",
    "vectorized_operator",
    "write_state",
]
