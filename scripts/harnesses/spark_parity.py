"""Differential schedules: the same per-key logic through Spark's ``applyInPandasWithState``
and through pyspark-abs, as a per-key operator and as an ``arrow_operator`` (see
:func:`arrow_function` for the two documented conventions it maps), on the same input files;
outputs must be equal.

Spark is the oracle: nothing here uses pyspark-abs's own conversions. Each seed draws a state
schema from every scalar Spark SQL type (each nullable, with extremes, empty strings and
unicode, NaN and infinities, dates and instants before 1970) and arrays, maps and structs
(integers beyond 2**53 beside nulls, NaN inside), a schedule of micro-batches
(one Parquet file each) whose rows set, merge, keep or remove a key's state, several rows
per key, and keys sharing key groups. Every call outputs the state it read, as typed columns
and as the ``repr`` of its Python values (a NaN and a null differ there), so a value that
changes on its way through pandas, the state blob, the state table or the output shows.

Spark's own ``applyInPandasWithState`` (4.2, 4.3) cannot keep an array or a map in its
state (its worker fails to parse the state schema: ``KeyError: 'elementType'``), so the oracle
keeps the nested columns pickled in one binary state column, in the forms its ``GroupState``
gives a struct (a ``Row``) and would give an array (a list) and a map (a dict). Its output
conversion fails on some schedules with an array column (``convert_array``: ``'float' object
is not iterable``, seed 7), so the oracle outputs nested values as :func:`canonical` text;
they still cross Spark's own row conversion.

    python scripts/harnesses/spark_parity.py --seeds 200 [--first-seed 0]
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import os
import pickle
import random
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

UTC = dt.timezone.utc
BIG_DECIMAL = Decimal("12345678901234567890.123456789012345678")
# (Spark DDL, Arrow type, values drawn for it); instants within what Spark's own pandas
# conversion (nanoseconds) holds, so that the oracle itself changes none of them
TYPES: dict[str, tuple[pa.DataType, list[Any]]] = {
    "tinyint": (pa.int8(), [-128, 127, 0]),
    "smallint": (pa.int16(), [-32768, 32767, 5]),
    "int": (pa.int32(), [-(2**31), 2**31 - 1, 7]),
    "bigint": (pa.int64(), [-(2**63), 2**63 - 1, 2**60 + 1, 0]),
    "float": (pa.float32(), [0.5, -1.5, 3.0e38, math.inf]),
    "double": (pa.float64(), [1 / 3, 1e308, -math.inf, 2.0**60 + 2.0**8]),
    "decimal(38,18)": (pa.decimal128(38, 18), [BIG_DECIMAL, Decimal("-0.000000000000000001")]),
    "string": (pa.string(), ["", "ünï €", "a"]),
    "binary": (pa.binary(), [b"", b"\x00\xff"]),
    "boolean": (pa.bool_(), [True, False]),
    "date": (pa.date32(), [dt.date(1969, 12, 31), dt.date(9999, 12, 31), dt.date(1, 1, 1)]),
    "timestamp": (
        pa.timestamp("us", tz="UTC"),
        [
            dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
            dt.datetime(2262, 4, 10, 1, 2, 3, 456789, tzinfo=UTC),
            dt.datetime(2026, 3, 29, 1, 30, tzinfo=UTC),
        ],
    ),
}
# nested kinds: (Spark DDL, Arrow type, values drawn for it)
NESTED: dict[str, tuple[pa.DataType, list[Any]]] = {
    "array<bigint>": (pa.list_(pa.int64()), [[2**60 + 1, -(2**63)], [1, None], []]),
    "array<double>": (pa.list_(pa.float64()), [[math.nan, 1.5], [None, -math.inf]]),
    "map<string,bigint>": (
        pa.map_(pa.string(), pa.int64()),
        [[("a", 2**60 + 1), ("b", None)], [("ü", -1)], []],
    ),
    "struct<x:bigint,y:string>": (
        pa.struct([("x", pa.int64()), ("y", pa.string())]),
        [{"x": 2**60 + 1, "y": None}, {"x": None, "y": "ü"}],
    ),
}
TYPES.update(NESTED)
OPS = ("set", "merge", "keep", "remove", "nan")


class Schedule:
    """One seed's state columns and micro-batches."""

    def __init__(self, seed: int) -> None:
        rng = random.Random(seed)
        kinds = list(TYPES)
        rng.shuffle(kinds)
        self.columns = {f"c{i}": kind for i, kind in enumerate(kinds[: rng.randint(3, len(kinds))])}
        keys = [f"k{i}" for i in range(rng.randint(2, 6))]
        self.batches: list[list[dict[str, Any]]] = []
        for batch in range(rng.randint(3, 5)):
            rows = []
            for key in rng.sample(keys, rng.randint(1, len(keys))):
                for _ in range(rng.randint(1, 3)):
                    row: dict[str, Any] = {"id": key, "batch": batch, "op": rng.choice(OPS)}
                    for name, kind in self.columns.items():
                        values = TYPES[kind][1]
                        row[name] = None if rng.random() < 0.3 else rng.choice(values)
                    rows.append(row)
            self.batches.append(rows)
        # a last batch reads every key's final state
        self.batches.append([{"id": k, "batch": len(self.batches), "op": "keep"} for k in keys])

    @property
    def state_ddl(self) -> str:
        return ", ".join(f"{n} {k}" for n, k in self.columns.items())

    @property
    def scalars(self) -> list[str]:
        return [n for n, k in self.columns.items() if k not in NESTED]

    @property
    def spark_state_ddl(self) -> str:
        """The oracle's state: the scalar columns, and the nested ones pickled."""
        return ", ".join([*(f"{n} {self.columns[n]}" for n in self.scalars), "nested binary"])

    @property
    def input_ddl(self) -> str:
        return f"id string, batch int, op string, {self.state_ddl}"

    @property
    def output_ddl(self) -> str:
        return f"id string, batch int, rows int, had string, {self.state_ddl}"

    @property
    def spark_output_ddl(self) -> str:
        """The oracle's output: nested columns as :func:`canonical` text."""
        kinds = ("string" if k in NESTED else k for k in self.columns.values())
        columns = ", ".join(f"{n} {k}" for n, k in zip(self.columns, kinds, strict=True))
        return f"id string, batch int, rows int, had string, {columns}"

    def arrow_schema(self) -> pa.Schema:
        fields: list[pa.Field[Any]] = [pa.field("id", pa.string()), pa.field("batch", pa.int32())]
        fields.append(pa.field("op", pa.string()))
        return pa.schema(fields + [pa.field(n, TYPES[k][0]) for n, k in self.columns.items()])

    def write(self, directory: Path) -> None:
        """One Parquet file per micro-batch, oldest first."""
        directory.mkdir(parents=True)
        schema = self.arrow_schema()
        for i, rows in enumerate(self.batches):
            full = [{f.name: r.get(f.name) for f in schema} for r in rows]
            path = directory / f"part-{i:03d}.parquet"
            pq.write_table(pa.Table.from_pylist(full, schema=schema), path)
            stamp = 1_700_000_000 + i
            os.utime(path, (stamp, stamp))


def plain(value: Any, kind: str, time_zone: str) -> Any:
    """A cell as a Python value of its Spark type, whichever engine handed it over."""
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if kind in NESTED:
        return _nested(value, NESTED[kind][0])
    if kind in ("float", "double"):
        return float(value)
    if isinstance(value, float) and math.isnan(value):
        return None  # pandas' null in a column of another type
    if kind in ("tinyint", "smallint", "int", "bigint"):
        return int(value)
    if kind == "boolean":
        return bool(value)
    if kind == "binary":
        return bytes(value)
    if kind == "timestamp":
        stamp = pd.Timestamp(value)
        if stamp.tzinfo is None:
            stamp = stamp.tz_localize(time_zone)
        return _utc(stamp)
    if kind == "date" and isinstance(value, dt.datetime):
        return value.date()
    return value


def _nested(value: Any, kind: pa.DataType) -> Any:
    """A nested value (a NumPy array, a list, a dict or a Row) in ``GroupState``'s forms."""
    from pyspark.sql import Row

    if value is None:
        return None
    if pa.types.is_map(kind):
        pairs = value.items() if isinstance(value, dict) else value
        return {k: _nested(v, kind.item_type) for k, v in pairs}
    if pa.types.is_list(kind):
        return [_nested(v, kind.value_type) for v in value]
    if pa.types.is_struct(kind):
        return Row(**{f.name: _nested(value[f.name], f.type) for f in kind})
    return value.item() if hasattr(value, "item") else value


def canonical(value: Any, kind: pa.DataType) -> str | None:
    """A nested output value as comparable text: maps sorted by key, and a NaN inside null,
    as Spark's own output conversion stores it (``pa.array(..., from_pandas=True)``)."""

    def text(value: Any, kind: pa.DataType) -> Any:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return None
        if pa.types.is_map(kind):
            pairs = value.items() if isinstance(value, dict) else value
            return sorted((k, text(v, kind.item_type)) for k, v in pairs)
        if pa.types.is_list(kind):
            return [text(v, kind.value_type) for v in value]
        if pa.types.is_struct(kind):
            return [(f.name, text(value[f.name], f.type)) for f in kind]
        return value

    return None if value is None else repr(text(value, kind))


def _utc(stamp: pd.Timestamp) -> dt.datetime:
    return stamp.tz_convert(UTC).to_pydatetime()


def step(
    columns: dict[str, str],
    rows: list[dict[str, Any]],
    old: dict[str, Any] | None,
) -> tuple[dict[str, Any] | str | None, dict[str, Any]]:
    """The per-key logic both engines run: the new state (or "keep"), and the output row."""
    output = {"id": rows[0]["id"], "batch": rows[-1]["batch"], "rows": len(rows)}
    output["had"] = repr(None if old is None else [old[c] for c in columns])
    output.update(old or dict.fromkeys(columns))
    new: dict[str, Any] | str | None = "keep"
    current = old
    for row in rows:
        values = {c: row[c] for c in columns}
        if row["op"] == "set":
            current = values
        elif row["op"] == "merge":
            base = current or dict.fromkeys(columns)
            current = {c: base[c] if values[c] is None else values[c] for c in columns}
        elif row["op"] == "remove":
            current = None
        elif row["op"] == "nan":
            base = current or values
            nan = {c: math.nan for c, k in columns.items() if k in ("float", "double")}
            current = {**base, **nan}
        new = current
    if all(r["op"] == "keep" for r in rows):
        new = "keep"
    return new, output


def spark_function(
    columns: dict[str, str], time_zone: str
) -> Callable[[tuple[Any, ...], Iterator[pd.DataFrame], Any], Iterator[pd.DataFrame]]:
    """The step logic through Spark's ``applyInPandasWithState``."""
    names = list(columns)
    scalars = [c for c in names if columns[c] not in NESTED]

    def function(key: tuple[Any, ...], frames: Iterator[pd.DataFrame], state: Any) -> Any:
        rows = [
            {**r, **{c: plain(r[c], columns[c], time_zone) for c in names}}
            for frame in frames
            for r in frame.to_dict("records")
        ]
        old = None
        if state.exists:
            *values, nested = state.get
            old = {c: plain(v, columns[c], time_zone) for c, v in zip(scalars, values, strict=True)}
            old = {c: old[c] if c in old else pickle.loads(nested)[c] for c in names}
        new, output = step(columns, rows, old)
        if new is None:
            state.remove()
        elif isinstance(new, dict):
            nested = pickle.dumps({c: new[c] for c in names if c not in scalars})
            state.update((*(new[c] for c in scalars), nested))
        out = {k: pd.Series([v], dtype=object) for k, v in output.items()}
        for c in names:
            if columns[c] in NESTED:
                out[c] = pd.Series([canonical(output[c], NESTED[columns[c]][0])], dtype=object)
            if columns[c] == "timestamp":
                # Spark reads naive output datetimes as wall-clock times in the session zone
                stamp = pd.to_datetime(pd.Series([output[c]], dtype=object), utc=True)
                out[c] = stamp.dt.tz_convert(time_zone).dt.tz_localize(None)
        yield pd.DataFrame(out)

    return function


def abs_function(columns: dict[str, str], time_zone: str) -> Callable[..., Any]:
    """The step logic as a pyspark-abs per-key function."""

    def function(key: tuple[Any, ...], rows: pd.DataFrame, state: Any) -> Any:
        records = [
            {**r, **{c: plain(r[c], kind, time_zone) for c, kind in columns.items()}}
            for r in rows.to_dict("records")
        ]
        # the state as pyspark-abs gives it, only instants made comparable: a NaN or a NumPy
        # scalar where Spark gives None or an int shows in the output's repr
        old = None
        if state.exists:
            old = {c: _utc(v) if isinstance(v, pd.Timestamp) else v for c, v in state.get().items()}
        new, output = step(columns, records, old)
        if new is None:
            state.remove()
        elif isinstance(new, dict):
            state.update(new)
        return output

    return function


def arrow_function(columns: dict[str, str], time_zone: str) -> Callable[..., Any]:
    """The step logic as a pyspark-abs function in the Arrow form, key by key.

    The oracle runs through pandas, so two documented conventions of the Arrow form are
    mapped to it, and nothing else: a null in a float input column is NaN to a pandas
    function (the Arrow form gets null), and a NaN in a float output column is null after
    Spark's pandas conversion (the Arrow form keeps NaN, as ``applyInArrow`` does).
    """
    floats = {c for c, k in columns.items() if k in ("float", "double")}
    state_schema = pa.schema(
        [pa.field("id", pa.string()), *(pa.field(c, TYPES[k][0]) for c, k in columns.items())]
    )
    output_schema = pa.schema(
        [
            pa.field("id", pa.string()),
            pa.field("batch", pa.int32()),
            pa.field("rows", pa.int32()),
            pa.field("had", pa.string()),
            *state_schema.remove(0),
        ]
    )

    def typed(value: Any) -> Any:  # a struct value as Arrow takes it back
        return value.asDict(recursive=True) if hasattr(value, "asDict") else value

    def function(rows: pa.Table, state: pa.Table, ctx: Any) -> Any:
        from pyspark_abs import KeyGroupResult

        by_key: dict[str, list[dict[str, Any]]] = {}
        for r in rows.to_pylist():
            row = {**r, **{c: plain(r[c], kind, time_zone) for c, kind in columns.items()}}
            row.update({c: math.nan for c in floats if row[c] is None})
            by_key.setdefault(r["id"], []).append(row)
        # the state as the Arrow form gives it, through the oracle's own reading of values
        held = {
            r["id"]: {c: plain(r[c], kind, time_zone) for c, kind in columns.items()}
            for r in state.to_pylist()
        }
        kept: list[dict[str, Any]] = []
        removed: list[dict[str, Any]] = []
        outputs: list[dict[str, Any]] = []
        for key, key_rows in by_key.items():
            new, output = step(columns, key_rows, held.get(key))
            if new is None:
                removed.append({"id": key})
            elif isinstance(new, dict):
                kept.append({"id": key, **{c: typed(v) for c, v in new.items()}})
            nan = {c for c in floats if isinstance(output[c], float) and math.isnan(output[c])}
            outputs.append({c: None if c in nan else typed(v) for c, v in output.items()})
        return KeyGroupResult(
            state=pa.Table.from_pylist(kept, schema=state_schema),
            removed=pa.table({"id": pa.array([r["id"] for r in removed], pa.string())}),
            output=pa.Table.from_pylist(outputs, schema=output_schema),
        )

    return function


def run_spark(spark: Any, schedule: Schedule, source: Path, out: Path) -> None:
    """The schedule through plain ``applyInPandasWithState``; outputs as Parquet in ``out``."""
    from pyspark.sql.streaming.state import GroupStateTimeout

    exact = "spark.sql.execution.pythonUDF.pandas.preferIntExtensionDtype"
    before = spark.conf.get(exact, None)
    spark.conf.set(exact, "true")  # Spark's own exact integers: the oracle must not round
    try:
        time_zone = spark.conf.get("spark.sql.session.timeZone")
        rows = spark.readStream.schema(schedule.input_ddl).option("maxFilesPerTrigger", 1)
        query = (
            rows.parquet(str(source))
            .groupBy("id")
            .applyInPandasWithState(
                spark_function(schedule.columns, time_zone),
                schedule.spark_output_ddl,
                schedule.spark_state_ddl,
                "append",
                GroupStateTimeout.NoTimeout,
            )
            .writeStream.foreachBatch(lambda df, _: df.write.mode("append").parquet(str(out)))
            .option("checkpointLocation", str(out) + "_checkpoint")
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    finally:
        if before is None:
            spark.conf.unset(exact)
        else:
            spark.conf.set(exact, before)


FORMS = ("per_key", "arrow")
"""The forms of pyspark-abs operator each schedule runs: per key, and vectorized on Arrow."""


def run_abs(spark: Any, schedule: Schedule, source: Path, base: Path, form: str) -> Any:
    """The schedule through a pyspark-abs operator in ``form``; returns the pipeline."""
    from pyspark_abs import AbsConfig, FileSource, Pipeline, arrow_operator, operator

    time_zone = spark.conf.get("spark.sql.session.timeZone")
    forms: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
        "per_key": (operator, abs_function),
        "arrow": (arrow_operator, arrow_function),
    }
    declare, function = forms[form]
    declared = declare(
        key="id",
        state_schema=schedule.state_ddl,
        output_schema=schedule.output_ddl,
        name="parity",
    )(function(schedule.columns, time_zone))
    pipeline = Pipeline(
        "parity",
        FileSource(str(source), "parquet", schema=schedule.input_ddl, max_files_per_trigger=1),
        declared,
        root=str(base / form / "root"),
        sinks={"output": str(base / form / "sink")},
        config=AbsConfig(commit_mode="sync", key_groups=2),
    )
    pipeline.run()
    return pipeline


def comparable(frame: Any, schedule: Schedule) -> Any:
    """Outputs with instants as microseconds (collected datetimes depend on the local zone),
    and nested values as :func:`canonical` text (the oracle's already are)."""
    from pyspark.sql import functions as F

    def column(name: str) -> Any:
        kind = schedule.columns.get(name, "")
        if kind == "timestamp":
            return F.unix_micros(name).alias(name)
        if kind in NESTED and dict(frame.dtypes)[name] != "string":
            text = F.udf(lambda v: canonical(v, NESTED[kind][0]), "string")
            return text(name).alias(name)
        return F.col(name)

    return frame.select(*(column(c) for c in frame.columns))


def check(spark: Any, seed: int, workdir: Path, forms: Sequence[str] = FORMS) -> None:
    """Run one seed through Spark and each of pyspark-abs's ``forms``; assert equal outputs
    (chispa)."""
    from chispa import assert_df_equality
    from pyspark import cloudpickle

    # Spark's Python workers cannot import this script: its functions travel by value
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]
    schedule = Schedule(seed)
    base = workdir / f"seed-{seed}"
    source = base / "in"
    schedule.write(source)
    run_spark(spark, schedule, source, base / "spark")
    columns = ["id", "batch", "rows", "had", *schedule.columns]
    expected = comparable(spark.read.parquet(str(base / "spark")), schedule).select(columns)
    for form in forms:
        pipeline = run_abs(spark, schedule, source, base, form)
        actual = comparable(pipeline.snapshots.sink("output"), schedule).select(columns)
        assert_df_equality(
            actual,
            expected,
            ignore_row_order=True,
            ignore_nullable=True,
            allow_nan_equality=True,
        )
        epochs = [s.epoch for s in pipeline.snapshots.list()]
        assert len(epochs) == len(schedule.batches), (seed, form, epochs)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--first-seed", type=int, default=0)
    args = parser.parse_args(argv)
    from pyspark_abs import local_session

    spark = local_session()
    spark.sparkContext.setLogLevel("ERROR")
    workdir = Path(tempfile.mkdtemp(prefix="spark-parity-"))
    failed = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        try:
            check(spark, seed, workdir)
            print(f"seed {seed}: same as Spark", flush=True)
        except Exception as err:  # chispa raises its own error class
            failed.append(seed)
            print(f"seed {seed}: DIFFERS from Spark\n{err}", flush=True)
    shutil.rmtree(workdir, ignore_errors=True)
    print(f"{args.seeds - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
