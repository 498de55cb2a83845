"""The commands that load the user's code: ``write-state`` and ``check``.

``write-state`` writes an operator's state from a file as a new snapshot; ``check`` reports
what starting a new pipeline definition on a root would do.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from pyspark_abs.cli.output import print_json, print_table, progress
from pyspark_abs.errors import ConfigError
from pyspark_abs.operators.contract import Operator
from pyspark_abs.pipeline.check import check
from pyspark_abs.pipeline.declaration import Pipeline
from pyspark_abs.pipeline.savepoints import write_state
from pyspark_abs.storage.root import SnapshotRoot, state_table
from pyspark_abs.storage.store import DeltaStore

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def add_definition_commands(command: Callable[..., Any]) -> None:
    """Add ``write-state`` and ``check`` through ``command(name, help, run)``."""
    edit = command(
        "write-state", "write an operator's state from a file as a new snapshot", _write_state
    )
    edit.add_argument(
        "--operator",
        required=True,
        metavar="MODULE:NAME",
        help="the pyspark_abs Operator the state is for, e.g. my_job.operators:sessions",
    )
    edit.add_argument(
        "--from",
        dest="path",
        required=True,
        metavar="PATH",
        help="the state: a Delta table, Parquet, or CSV with a header",
    )
    edit.add_argument(
        "--format", choices=FORMATS, help="the format of PATH (default: from PATH's name)"
    )
    edit.add_argument("--pipeline", help="the pipeline a new root belongs to")
    edit.add_argument(
        "--clear-timeouts", action="store_true", help="write without _timeout: drop every timer"
    )
    upgrade = command(
        "check", "report what starting a new pipeline definition on ROOT would do", _check
    )
    upgrade.add_argument(
        "--pipeline",
        required=True,
        metavar="MODULE:NAME",
        help="a pyspark_abs Pipeline, or a function of no arguments returning one",
    )


FORMATS = ("delta", "parquet", "csv")


def _write_state(args: argparse.Namespace) -> int:
    operator = _operator(args.operator)
    root: SnapshotRoot = args.root
    from pyspark_abs.session import local_session

    spark = local_session("pyspark-abs write-state")
    progress(f"reading the state of operator {operator.name!r} from {args.path}")
    state = _read_state(spark, args.path, args.format or _format_of(args.path), root, operator)
    progress(f"writing it into {root}")
    info = write_state(
        state, root, operator, pipeline=args.pipeline, clear_timeouts=args.clear_timeouts
    )
    if args.json:
        print_json(info.to_dict())
    else:
        print(
            f"epoch {info.epoch} RESTORED with the state of operator {operator.name!r} from "
            f"{args.path} ({info.state_keys} keys); the next start continues from it"
        )
    return 0


def _operator(reference: str) -> Operator:
    value = _load(reference, "--operator", "a pyspark_abs Operator")
    if not isinstance(value, Operator):
        raise ConfigError(
            f"--operator {reference!r} is not a pyspark_abs Operator; give MODULE:NAME of one "
            f"built with @operator or @vectorized_operator"
        )
    return value


def _check(args: argparse.Namespace) -> int:
    value = _load(args.pipeline, "--pipeline", "a pyspark_abs Pipeline")
    if callable(value) and not isinstance(value, Pipeline):
        value = value()
    if not isinstance(value, Pipeline):
        raise ConfigError(
            f"--pipeline {args.pipeline!r} is neither a pyspark_abs Pipeline nor a function "
            f"returning one, got {type(value).__name__}"
        )
    report = check(value, args.root)
    if args.json:
        items = [{**asdict(i), "verdict": i.verdict.value} for i in report.items]
        print_json({"exit_code": report.exit_code, "items": items})
        return report.exit_code
    rows = []
    for item in report.items:
        details = item.details or ("",)
        rows.append([item.kind, item.name, item.verdict.value, details[0]])
        rows += [["", "", "", line] for line in details[1:]]
    print_table(["KIND", "NAME", "VERDICT", "DETAILS"], rows)
    return report.exit_code


def _load(reference: str, option: str, what: str) -> Any:
    """The object ``MODULE:NAME`` names."""
    module_name, _, attribute = reference.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attribute) if attribute else None
    except (ImportError, AttributeError) as err:
        raise ConfigError(
            f"{option} {reference!r} cannot be loaded ({err}); give MODULE:NAME of {what} "
            f"importable from here (check PYTHONPATH)"
        ) from None


def _format_of(path: str) -> str:
    name = path.lower().rstrip("/")
    if name.endswith((".csv", ".parquet")):
        return name.rsplit(".", 1)[1]
    return "delta" if _is_delta(path) else "parquet"


def _is_delta(path: str) -> bool:
    try:
        return DeltaStore().exists(path)
    except OSError:  # e.g. a file, not a directory
        return False


def _read_state(
    spark: SparkSession, path: str, fmt: str, root: SnapshotRoot, operator: Operator
) -> DataFrame:
    """The state at ``path``; CSV columns are cast to the types of the root's state table."""
    from pyspark.errors import AnalysisException

    from pyspark_abs.storage.spark import load_dataframe

    try:
        if fmt == "delta":
            if not _is_delta(path):
                raise ConfigError(f"--from {path!r} is not a Delta table")
            return load_dataframe(spark, path, DeltaStore().open(path).version())
        if fmt == "parquet":
            return spark.read.parquet(path)
        frame = spark.read.option("header", True).option("inferSchema", True).csv(path)
    except AnalysisException as err:
        raise ConfigError(f"--from {path!r} cannot be read as {fmt}: {err}") from None
    table = root.table_uri(state_table(operator.name))
    if not DeltaStore().exists(table):
        return frame
    from pyspark.sql import functions as F

    from pyspark_abs.operators.arrow_types import to_spark
    from pyspark_abs.storage.schemas import arrow_schema

    types = {f.name: f.dataType for f in to_spark(arrow_schema(DeltaStore().open(table))).fields}
    return frame.select(
        *(F.col(c).cast(types[c]).alias(c) if c in types else F.col(c) for c in frame.columns)
    )
