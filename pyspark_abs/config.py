"""Typed pipeline configuration.

A configuration is built from code (:class:`AbsConfig`), from the ``[abs]`` table of a TOML
file (:meth:`AbsConfig.from_file`, see ``conf/pipeline.toml``), or from ``spark.abs.*`` keys
of the Spark session's configuration (:meth:`AbsConfig.from_spark_conf`), which is how
``spark-submit --conf spark.abs.commitMode=sync`` or ``conf/spark-defaults.conf`` reach a
pipeline. Unknown keys are rejected everywhere.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pyspark_abs.errors import ConfigError
from pyspark_abs.faults import Fault

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

CommitMode = Literal["sync", "async"]

SPARK_CONF_PREFIX = "spark.abs."

CODE_ONLY = ("faults",)
"""Fields set in code only: not from a file or a Spark conf."""


@dataclass(frozen=True)
class AbsConfig:
    """How a pipeline snapshots and commits.

    Attributes:
        commit_mode: ``"async"`` returns from a micro-batch once its epoch is PREPARED and
            commits in an ordered background committer; ``"sync"`` returns only after the
            epoch is COMMITTED.
        key_groups: Number of key groups K. Keys are grouped by ``pmod(hash(key), K)``, the
            unit of state, rescaling and snapshots; one call of the operator serves all key
            groups of a shuffle partition. K bounds the useful parallelism.
        max_pending_epochs: In async mode, how many closed groups of PREPARED epochs (one
            epoch each with ``snapshot_interval=1``) may wait for the committer before the
            next micro-batch blocks.
        snapshot_interval: Take a snapshot every this many epochs. Every epoch is still
            pre-committed and PREPARED; the tables are committed once per group of
            ``snapshot_interval`` epochs, at its last epoch, so outputs become visible (and
            restore points exist) every N epochs, as with Flink's exactly-once sinks. The
            open group is committed when the query stops. Needs ``snapshots=True``.
        snapshots: When False, only sink outputs are written and committed (one Delta
            commit per sink and epoch, idempotent by epoch); no state table, and a manifest
            that records no epochs (it holds the root's id, which the sink transactions
            carry). This is the baseline the overhead benchmark compares against.
        target_file_bytes: A pre-commit task starts a new Parquet file once the current
            one reaches this size.
        compaction_every_epochs: Compact the state table every this many epochs, in the
            background (0: off).
        compaction_ratio: Compact the state table in the background once its changelog
            holds this many times as many rows as there are live keys (0: off).
        max_key_group_state_bytes: The largest state one key group may hold, measured as
            Arrow before compression (what a Python worker holds in memory). A key
            group whose state outgrows it fails its epoch with a ``StateTooLargeError``
            (nothing of the epoch is committed) instead of exhausting the memory of a
            Python worker or of Spark's state store.
        local_state_dir: Directory on each executor for the key groups' live state, with
            snapshots on ("": the executor's temporary directory). It needs room for about
            the live state, LZ4-compressed Arrow, and is rebuilt from the snapshot root
            when lost.
        local_state_change_share: How a key group's live state file follows its changes:
            an epoch writes only the keys it changed, in a change file on a chain that
            starts from a whole file, until the chain holds this share of the whole file's
            bytes (a little less in some key groups) or 40 change files; the next change
            writes the whole state again. 0 writes the whole state at every change: a
            little less CPU per epoch, but local bytes written that grow with the state.
        faults: Faults to inject at named protocol steps, for tests and demos.
    """

    commit_mode: CommitMode = "async"
    key_groups: int = 256
    max_pending_epochs: int = 2
    snapshot_interval: int = 1
    snapshots: bool = True
    target_file_bytes: int = 128 * 1024 * 1024
    compaction_every_epochs: int = 0
    compaction_ratio: float = 10.0
    max_key_group_state_bytes: int = 256 * 1024 * 1024
    local_state_dir: str = ""
    local_state_change_share: float = 0.25
    faults: tuple[Fault, ...] = field(default_factory=tuple)

    def __new__(cls, *args: object, **kwargs: object) -> AbsConfig:
        """Refuse a misspelt keyword with the known keys, as files and Spark confs do."""
        _refuse_unknown({k: k for k in kwargs}, [f.name for f in dataclasses.fields(cls)])
        return super().__new__(cls)

    def __post_init__(self) -> None:
        if self.commit_mode not in ("sync", "async"):
            raise ConfigError(f"commit_mode must be 'sync' or 'async', got {self.commit_mode!r}")
        _require_positive("key_groups", self.key_groups)
        _require_positive("max_pending_epochs", self.max_pending_epochs)
        _require_positive("snapshot_interval", self.snapshot_interval)
        _require_positive("target_file_bytes", self.target_file_bytes)
        _require_positive("max_key_group_state_bytes", self.max_key_group_state_bytes)
        if (
            isinstance(self.compaction_every_epochs, bool)
            or not isinstance(self.compaction_every_epochs, int)
            or self.compaction_every_epochs < 0
        ):
            raise ConfigError(
                f"compaction_every_epochs must be an integer >= 0, got "
                f"{self.compaction_every_epochs!r}"
            )
        ratio = self.compaction_ratio
        if (
            isinstance(ratio, bool)
            or not isinstance(ratio, (int, float))
            or not (ratio == 0 or ratio > 1)
        ):
            raise ConfigError(f"compaction_ratio must be 0 (off) or above 1, got {ratio!r}")
        if not isinstance(self.snapshots, bool):
            raise ConfigError(f"snapshots must be True or False, got {self.snapshots!r}")
        if self.snapshot_interval > 1 and not self.snapshots:
            raise ConfigError(
                f"snapshot_interval={self.snapshot_interval} groups the commits of snapshots, "
                f"but snapshots=False takes none (each epoch's outputs are committed alone); "
                f"set snapshot_interval=1 or snapshots=True"
            )
        local = self.local_state_dir
        if not isinstance(local, str) or (
            local and ("://" in local or not Path(local).is_absolute())
        ):
            raise ConfigError(
                f"local_state_dir must be an absolute path on the executors' local disk (or "
                f"empty for their temporary directory), got {local!r}: a relative path "
                f"depends on each executor's working directory, and remote storage is what "
                f"the snapshot root is for"
            )
        share = self.local_state_change_share
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share < 1e6:
            raise ConfigError(
                f"local_state_change_share must be a number >= 0 (0: write the whole state "
                f"at every change), got {share!r}"
            )
        for fault in self.faults:
            if not isinstance(fault, Fault):
                raise ConfigError(f"faults must hold Fault objects, got {fault!r}")

    @classmethod
    def from_mapping(cls, values: Mapping[str, object]) -> AbsConfig:
        """Build a configuration from a mapping of field names to values.

        Strings are converted to the field's type, so values read from a file or a Spark
        conf work unchanged.

        Raises:
            ConfigError: A key is unknown or a value cannot be converted.
        """
        known = {f.name: f for f in dataclasses.fields(cls) if f.name not in CODE_ONLY}
        _refuse_unknown({k: k for k in values}, list(known))
        converted = {name: _convert(name, known[name].type, v) for name, v in values.items()}
        return cls(**converted)  # type: ignore[arg-type]

    @classmethod
    def from_file(cls, path: str | Path) -> AbsConfig:
        """Build a configuration from the ``[abs]`` table of a TOML file.

        Keys are the field names (``commit_mode = "sync"``, ``key_groups = 64``). Other
        tables of the file are left alone, for the job's own settings.

        Raises:
            ConfigError: The file cannot be read, is not TOML, has no ``[abs]`` table, or
                a key in it is unknown or invalid.
        """
        import tomllib

        try:
            document = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as err:
            raise ConfigError(f"cannot read configuration file {path}: {err}") from None
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"configuration file {path} is not valid TOML: {err}") from None
        values = document.get("abs")
        if not isinstance(values, dict):
            raise ConfigError(
                f"configuration file {path} has no [abs] table; put the pyspark-abs settings "
                f"under [abs]"
            )
        try:
            return cls.from_mapping(values)
        except ConfigError as err:
            raise ConfigError(f"in [abs] of {path}: {err}") from None

    @classmethod
    def from_spark_conf(cls, spark: SparkSession) -> AbsConfig:
        """Build a configuration from the session's ``spark.abs.*`` keys.

        ``spark.abs.commitMode`` sets ``commit_mode``, ``spark.abs.keyGroups`` sets
        ``key_groups``, and so on (camelCase of the field name).

        Raises:
            ConfigError: A ``spark.abs.*`` key is unknown or its value is invalid.
        """
        given = {k: v for k, v in spark.conf.getAll.items() if k.startswith(SPARK_CONF_PREFIX)}
        fields = {key: _snake(key[len(SPARK_CONF_PREFIX) :]) for key in given}
        try:
            _refuse_unknown(
                fields,
                [f.name for f in dataclasses.fields(cls) if f.name not in CODE_ONLY],
                spell=spark_conf_key,
            )
        except ConfigError as err:
            raise ConfigError(f"in the Spark conf: {err}") from None
        values = {fields[key]: value for key, value in given.items()}
        try:
            return cls.from_mapping(values)
        except ConfigError as err:
            raise ConfigError(f"in Spark conf {SPARK_CONF_PREFIX}*: {err}") from None


def spark_conf_key(name: str) -> str:
    """An :class:`AbsConfig` field's Spark conf key: ``spark.abs.keyGroups`` for ``key_groups``."""
    return SPARK_CONF_PREFIX + _camel(name)


def _snake(camel: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", camel).lower()


def _camel(snake: str) -> str:
    first, *rest = snake.split("_")
    return first + "".join(part.title() for part in rest)


def _refuse_unknown(
    written: Mapping[str, str], known: list[str], spell: Callable[[str], str] = str
) -> None:
    """Refuse keys that name no setting, with the closest known one as a hint.

    Args:
        written: Each key as the user wrote it, and the setting it stands for.
        known: The settings.
        spell: How the user writes a setting (a Spark conf key is camelCase).

    Raises:
        ConfigError: A key names no setting.
    """
    unknown = sorted(key for key, name in written.items() if name not in known)
    if not unknown:
        return
    spelled = sorted(spell(name) for name in known)
    hints = [m for key in unknown for m in difflib.get_close_matches(key, spelled, 1)]
    hint = f" (did you mean {hints}?)" if hints else ""
    raise ConfigError(f"unknown configuration key(s) {unknown}{hint}; known keys are {spelled}")


def _require_positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")


def _convert(name: str, annotation: object, value: object) -> object:
    if not isinstance(value, str):
        return value
    kind = str(annotation)
    try:
        if kind == "int":
            return int(value)
        if kind == "float":
            return float(value)
        if kind == "bool":
            lowered = value.strip().lower()
            if lowered not in ("true", "false"):
                raise ValueError(value)
            return lowered == "true"
    except ValueError:
        raise ConfigError(f"{name}: cannot read {value!r} as {kind}") from None
    return value
