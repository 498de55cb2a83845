"""pyspark-abs: Asynchronous Barrier Snapshotting for PySpark Structured Streaming.

Stateful pandas operators whose state and outputs are snapshotted every micro-batch epoch
and committed to Delta Lake tables through a two-phase commit, exactly once.

The lifecycle, module by module: ``operator`` (what you write) → ``keygroups`` and
``execution`` (running it per key group) → ``envelope`` → ``precommit`` (tasks write files)
→ ``barrier`` (markers) → ``alignment`` → ``manifest`` (PREPARED, COMMITTED) → ``store``
(Delta) → ``coordinator``, ``commit`` and ``committer`` (phase 2) → ``recovery`` →
``snapshots`` (read) → ``restore`` (rollback, restore, written state) with ``sources``
(replayable Delta source) → ``maintenance`` (compaction, retention, vacuum, validate).
``backedge`` closes feedback loops: back-edge logs in each snapshot, loop heads, quiescence.
"""

from pyspark_abs.backedge import BackEdge
from pyspark_abs.config import AbsConfig
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
from pyspark_abs.faults import Fault, FaultAction, FaultStep
from pyspark_abs.manifest import EpochStatus
from pyspark_abs.operator import (
    Clock,
    KeyGroupContext,
    KeyGroupResult,
    KeyState,
    Operator,
    TimeoutMode,
    operator,
    vectorized_operator,
)
from pyspark_abs.pipeline import DeltaSink, Pipeline, PipelineQuery, Quiescence
from pyspark_abs.restore import restore, rollback, write_state
from pyspark_abs.session import local_session
from pyspark_abs.snapshots import SnapshotInfo, Snapshots
from pyspark_abs.sources import DeltaSource

__version__ = "0.1.0"

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
    "InjectedFault",
    "InvalidTimeoutError",
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
    "SchemaMismatchError",
    "SnapshotDamagedError",
    "SnapshotInfo",
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
