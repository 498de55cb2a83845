"""pyspark-abs: Asynchronous Barrier Snapshotting for PySpark Structured Streaming.

Stateful pandas operators whose state and outputs are snapshotted every micro-batch epoch
(or every N epochs, ``AbsConfig.snapshot_interval``) and committed to Delta Lake tables
through a two-phase commit, exactly once.

The subpackages are the layers, lowest first: ``operators``, ``storage``, ``manifest``,
``sources``, ``protocol``, ``snapshots``, ``upkeep``, ``job_ledger``, ``install``,
``job_actions``, ``pipeline``, ``job``; each imports only from the ones before it
(``tests/unit/test_layers.py`` holds the order and docs/architecture.md lists it).

The names here are the ones the guide uses. The errors live in :mod:`pyspark_abs.errors`
(only their root, :class:`AbsError`, is here) and fault injection in :mod:`pyspark_abs.faults`;
their old top-level names still work for this release, with a ``DeprecationWarning``.

Importing the package is cheap: every public name is imported on first use, so Spark's
Python workers that unpickle one class (say the Delta source) do not load pandas and the
pipeline machinery.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any

from pyspark_abs.errors import AbsError, error_classes
from pyspark_abs.runtime import require_pyspark

require_pyspark()

if TYPE_CHECKING:
    from pyspark_abs.config import AbsConfig
    from pyspark_abs.job.declaration import Job
    from pyspark_abs.job.query import JobQuery
    from pyspark_abs.job_ledger.cut import JobSnapshot
    from pyspark_abs.manifest.entries import EpochStatus
    from pyspark_abs.manifest.info import SnapshotInfo
    from pyspark_abs.operators.contract import (
        ArrowContext,
        Clock,
        KeyGroupContext,
        KeyGroupResult,
        Operator,
        OperatorOptions,
        TimeoutMode,
        arrow_operator,
        vectorized_operator,
    )
    from pyspark_abs.operators.evolution import StateEvolution
    from pyspark_abs.operators.key_state import KeyState
    from pyspark_abs.operators.per_key import operator
    from pyspark_abs.operators.windows import session_window, tumbling_window
    from pyspark_abs.pipeline.backedge import BackEdge
    from pyspark_abs.pipeline.check import UpgradeReport, check
    from pyspark_abs.pipeline.declaration import Pipeline
    from pyspark_abs.pipeline.query import PipelineQuery, Quiescence
    from pyspark_abs.pipeline.savepoints import restore, rollback, write_state
    from pyspark_abs.pipeline.sinks import DeltaSink, KafkaSink
    from pyspark_abs.protocol.listeners import SnapshotListener
    from pyspark_abs.session import local_session
    from pyspark_abs.snapshots.reading import Snapshots
    from pyspark_abs.sources import (
        ChannelSource,
        DeltaSource,
        FileSource,
        KafkaSource,
        SparkDeltaSource,
        SparkFileSource,
    )
    from pyspark_abs.upkeep.compaction import compact
    from pyspark_abs.upkeep.retention import vacuum
    from pyspark_abs.upkeep.tags import tag, untag
    from pyspark_abs.upkeep.validation import validate

__version__ = "0.1.0"

_PUBLIC: dict[str, tuple[str, ...]] = {
    "pyspark_abs.upkeep.compaction": ("compact",),
    "pyspark_abs.upkeep.retention": ("vacuum",),
    "pyspark_abs.pipeline.savepoints": ("restore", "rollback", "write_state"),
    "pyspark_abs.upkeep.tags": ("tag", "untag"),
    "pyspark_abs.upkeep.validation": ("validate",),
    "pyspark_abs.config": ("AbsConfig",),
    "pyspark_abs.job_ledger.cut": ("JobSnapshot",),
    "pyspark_abs.job.declaration": ("Job",),
    "pyspark_abs.job.query": ("JobQuery",),
    "pyspark_abs.manifest.entries": ("EpochStatus",),
    "pyspark_abs.manifest.info": ("SnapshotInfo",),
    "pyspark_abs.operators.contract": (
        "ArrowContext",
        "Clock",
        "KeyGroupContext",
        "KeyGroupResult",
        "Operator",
        "OperatorOptions",
        "TimeoutMode",
        "arrow_operator",
        "vectorized_operator",
    ),
    "pyspark_abs.operators.evolution": ("StateEvolution",),
    "pyspark_abs.operators.key_state": ("KeyState",),
    "pyspark_abs.operators.per_key": ("operator",),
    "pyspark_abs.operators.windows": ("session_window", "tumbling_window"),
    "pyspark_abs.pipeline.backedge": ("BackEdge",),
    "pyspark_abs.pipeline.check": ("UpgradeReport", "check"),
    "pyspark_abs.pipeline.declaration": ("Pipeline",),
    "pyspark_abs.pipeline.sinks": ("DeltaSink", "KafkaSink"),
    "pyspark_abs.pipeline.query": ("PipelineQuery", "Quiescence"),
    "pyspark_abs.protocol.listeners": ("SnapshotListener",),
    "pyspark_abs.session": ("local_session",),
    "pyspark_abs.snapshots.reading": ("Snapshots",),
    "pyspark_abs.sources": (
        "ChannelSource",
        "DeltaSource",
        "FileSource",
        "KafkaSource",
        "SparkDeltaSource",
        "SparkFileSource",
    ),
}
"""The public names imported on first use, by the module that defines them.

The ``TYPE_CHECKING`` imports above say the same for type checkers; a unit test keeps
the two equal.
"""

_LAZY = {name: module for module, names in _PUBLIC.items() for name in names}

_MOVED: dict[str, str] = {
    **{cls.__name__: "pyspark_abs.errors" for cls in error_classes()[1:]},
    **{name: "pyspark_abs.faults" for name in ("Fault", "FaultAction", "FaultStep")},
}
"""Names the package exported before this release, and the module that has them now."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value
    moved = _MOVED.get(name)
    if moved is None:
        raise AttributeError(f"module 'pyspark_abs' has no attribute {name!r}")
    warnings.warn(
        f"pyspark_abs.{name} is deprecated: import it from {moved} (from {moved} import "
        f"{name}); the top-level name goes in the next release",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(moved), name)


__all__ = sorted(["AbsError", *_LAZY])
