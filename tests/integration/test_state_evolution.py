"""State schema evolution: version 1 of an operator runs, version 2 migrates its state once.

The model is plain Python over the input events; it knows nothing of the migration.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pyspark_abs import (
    DeltaSource,
    EpochStatus,
    KeyState,
    Operator,
    Pipeline,
    Snapshots,
    StateEvolution,
    check,
    operator,
    restore,
    rollback,
)
from pyspark_abs.cli import main as cli
from pyspark_abs.errors import InjectedFault, StateEvolutionError
from pyspark_abs.faults import Fault, FaultStep
from pyspark_abs.upkeep.validation import validate
from tests.support.pipelines import assert_same, event_table, session_pipeline

Batch = Sequence[tuple[str, int]]
BATCHES: list[Batch] = [
    [("ann", 3), ("bob", 5), ("ann", 4)],
    [("cy", 7), ("bob", 1)],
    [("ann", 10), ("dee", 2)],
    [("cy", 1), ("cy", 2), ("eve", 9)],
]
SINK_DDL = "user string, total long"


@operator(
    key="user",
    state_schema="total int, n int, first string",
    output_schema=SINK_DDL,
    name="spend",
)
def spend_v1(key: tuple[Any, ...], rows: pd.DataFrame, state: KeyState) -> Any:
    old = state.get({"total": 0, "n": 0, "first": None})
    total = int(old["total"] + rows["amount"].sum())
    state.update({"total": total, "n": old["n"] + len(rows), "first": old["first"] or "seen"})
    return {"user": key[0], "total": total}


def _mean(old: pd.DataFrame) -> pd.Series:
    return old["total"] / old["n"]


@operator(
    key="user",
    state_schema="total long, count long, mean double",
    output_schema=SINK_DDL,
    name="spend",
    evolution=StateEvolution(renamed={"n": "count"}, dropped=["first"], added={"mean": _mean}),
)
def spend_v2(key: tuple[Any, ...], rows: pd.DataFrame, state: KeyState) -> Any:
    old = state.get({"total": 0, "count": 0, "mean": 0.0})
    total = int(old["total"] + rows["amount"].sum())
    count = int(old["count"] + len(rows))
    state.update({"total": total, "count": count, "mean": total / count})
    return {"user": key[0], "total": total}


def as_spend(df: DataFrame) -> DataFrame:
    return df.selectExpr("word AS user", "ts AS amount")


def spend_pipeline(events: str, root: Path, op: Operator, *faults: Fault) -> Pipeline:
    return session_pipeline(events, root, op, "spend", as_spend, faults=faults)


def ran_version_one(tmp_path: Path, batches: int) -> tuple[str, Path]:
    """Events and a root that version 1 ran on over the first ``batches`` batches."""
    events, root = str(tmp_path / "events"), tmp_path / "root"
    event_table(Path(events), BATCHES[:batches])
    spend_pipeline(events, root, spend_v1).run()
    return events, root


def model_state(spark: SparkSession, batches: Sequence[Batch]) -> DataFrame:
    amounts: dict[str, list[int]] = {}
    for batch in batches:
        for user, amount in batch:
            amounts.setdefault(user, []).append(amount)
    rows = [(u, sum(a), len(a), sum(a) / len(a)) for u, a in sorted(amounts.items())]
    return spark.createDataFrame(rows, "user string, total long, count long, mean double")


def model_sink(spark: SparkSession, batches: Sequence[Batch]) -> DataFrame:
    totals: dict[str, int] = {}
    rows = []
    for batch in batches:
        for user, amount in batch:
            totals[user] = totals.get(user, 0) + amount
        rows += [(user, totals[user]) for user in sorted({u for u, _ in batch})]
    return spark.createDataFrame(rows, SINK_DDL)


def test_version_two_migrates_the_state_once_and_a_rollback_across_the_migration_redoes_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    events, root = ran_version_one(tmp_path, 2)

    event_table(Path(events), BATCHES[2:])
    spend_pipeline(events, root, spend_v2).run()
    snapshots = Snapshots(str(root), spark)
    assert [(i.epoch, i.status) for i in snapshots.list()] == [
        (0, EpochStatus.COMMITTED),
        (1, EpochStatus.COMMITTED),
        (2, EpochStatus.RESTORED),
        (3, EpochStatus.COMMITTED),
        (4, EpochStatus.COMMITTED),
    ]
    assert "migrated" in (snapshots.get(2).origin or "")
    assert_same(snapshots.state("spend"), model_state(spark, BATCHES))
    assert_same(snapshots.state("spend", 2), model_state(spark, BATCHES[:2]))
    assert_same(snapshots.sink("output"), model_sink(spark, BATCHES))
    # the snapshots before the migration keep their schema
    old = snapshots.state("spend", 1)
    assert old.columns == ["user", "total", "n", "first"]
    assert dict(old.dtypes)["total"] == "int"

    # a second start finds nothing to migrate
    spend_pipeline(events, root, spend_v2).run()
    assert len(snapshots.list()) == 5

    # a copy of the version-1 snapshot, started with version 2, migrates there
    copy = tmp_path / "copy"
    restore(str(root), 1, str(copy))
    spend_pipeline(events, copy, spend_v2).run()
    assert_same(Snapshots(str(copy), spark).state("spend"), model_state(spark, BATCHES))

    # rolled back across the migration, version 2 migrates again and ends where it was
    rollback(str(root), 1)
    assert snapshots.state("spend").columns == ["user", "total", "n", "first"]
    spend_pipeline(events, root, spend_v2).run()
    assert [i.status for i in snapshots.list()[-4:]] == [
        EpochStatus.RESTORED,
        EpochStatus.RESTORED,
        EpochStatus.COMMITTED,
        EpochStatus.COMMITTED,
    ]
    assert_same(snapshots.state("spend"), model_state(spark, BATCHES))
    assert_same(snapshots.sink("output"), model_sink(spark, BATCHES))
    assert validate(str(root)) == []


def test_a_crash_after_the_migration_is_decided_is_finished_by_the_next_start(
    spark: SparkSession, tmp_path: Path
) -> None:
    events, root = ran_version_one(tmp_path, 2)
    event_table(Path(events), BATCHES[2:])
    crash = Fault(FaultStep.AFTER_PREPARED, epoch=2)
    with pytest.raises(InjectedFault):
        spend_pipeline(events, root, spend_v2, crash).start(available_now=True)
    snapshots = Snapshots(str(root), spark)
    assert snapshots.get(2).status is EpochStatus.PREPARED
    # the decided schema is in the manifest: recovery commits it, and nothing migrates twice
    spend_pipeline(events, root, spend_v2).run()
    assert [i.status for i in snapshots.list()][2:] == [
        EpochStatus.RESTORED,
        EpochStatus.COMMITTED,
        EpochStatus.COMMITTED,
    ]
    assert_same(snapshots.state("spend"), model_state(spark, BATCHES))
    assert_same(snapshots.sink("output"), model_sink(spark, BATCHES))


@operator(key="user", state_schema="total string", output_schema=SINK_DDL, name="spend")
def spend_as_text(key: tuple[Any, ...], rows: pd.DataFrame, state: KeyState) -> Any:
    cents = int(state.get({"total": "0 cents"})["total"].split()[0]) + int(rows["amount"].sum())
    state.update({"total": f"{cents} cents"})
    return {"user": key[0], "total": cents}


def test_a_change_no_rule_covers_is_refused_before_anything_runs_and_migrate_rewrites_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    events, root = ran_version_one(tmp_path, 1)
    state_version = DeltaTable(str(root / "state" / "spend")).version()

    event_table(Path(events), BATCHES[1:2])
    with pytest.raises(StateEvolutionError) as refused:
        spend_pipeline(events, root, spend_as_text).start(available_now=True)
    message = str(refused.value)
    assert "nothing was run or changed" in message
    assert "total: refused (int -> string is not a widening)" in message
    assert "StateEvolution(migrate=" in message
    assert "n: refused (stored column of type int is not declared)" in message
    assert "StateEvolution(dropped=['n'])" in message
    snapshots = Snapshots(str(root), spark)
    assert [i.epoch for i in snapshots.list()] == [0]
    assert DeltaTable(str(root / "state" / "spend")).version() == state_version

    def as_text(old: DataFrame) -> DataFrame:
        return old.select("user", F.format_string("%d cents", "total").alias("total"))

    migrated = replace(spend_as_text, evolution=StateEvolution(migrate=as_text))
    spend_pipeline(events, root, migrated).run()
    totals = model_sink(spark, BATCHES[:2]).groupBy("user").agg(F.max("total").alias("n"))
    expected = totals.select("user", F.format_string("%d cents", "n").alias("total"))
    assert_same(snapshots.state("spend"), expected)
    assert_same(snapshots.sink("output"), model_sink(spark, BATCHES[:2]))


def test_the_upgrade_check_reports_each_operator_and_sink_without_changing_anything(
    spark: SparkSession,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    events, root = ran_version_one(tmp_path, 1)
    manifest_version = DeltaTable(str(root / "_manifest")).version()

    same = check(spend_pipeline(events, root, spend_v1))
    assert [(i.kind, i.name, i.verdict.value) for i in same.items] == [
        ("operator", "spend", "compatible"),
        ("sink", "output", "compatible"),
    ]
    assert same.exit_code == 0

    upgrade = check(spend_pipeline(events, root, spend_v2))
    assert upgrade.exit_code == 3
    assert upgrade.items[0].verdict.value == "needs migration"
    assert set(upgrade.items[0].details) == {
        "total: widened (int -> bigint)",
        "count: widened (from 'n', int -> bigint)",
        "mean: added (new, double)",
        "first: dropped (was string)",
    }

    refused = check(spend_pipeline(events, root, spend_as_text))
    assert refused.exit_code == 1
    assert refused.items[0].verdict.value == "incompatible"

    renamed = replace(spend_v2, name="spending")
    assert spend_v2.evolution is not None
    moved = replace(renamed, evolution=replace(spend_v2.evolution, renamed_from="spend"))
    wider_sink = Pipeline(
        "spend",
        DeltaSource(events),
        replace(renamed, outputs=(("output", "user string, total long, extra int"),)),
        root=str(root),
        sinks=str(root / "sink"),
        transform=lambda df: df.selectExpr("word AS user", "ts AS amount"),
    )
    assert [(i.kind, i.name, i.verdict.value) for i in check(wider_sink).items] == [
        ("operator", "spending", "new"),
        ("sink", "output", "incompatible"),
        ("operator", "spend", "removed"),
    ]
    assert check(spend_pipeline(events, root, moved)).items[0].details[0] == (
        "state moves from state/spend"
    )

    module = tmp_path / "upgrade_job.py"
    module.write_text(
        "from tests.integration.test_state_evolution import spend_pipeline, spend_v2\n"
        "from pathlib import Path\n"
        f"def pipeline():\n    return spend_pipeline({events!r}, Path({str(root)!r}), spend_v2)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cli(["check", str(root), "--pipeline", "upgrade_job:pipeline"]) == 3
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].split() == ["KIND", "NAME", "VERDICT", "DETAILS"]
    assert printed[1].split()[:4] == ["operator", "spend", "needs", "migration"]
    assert cli(["check", str(root), "--pipeline", "upgrade_job:pipeline", "--json"]) == 3
    report = json.loads(capsys.readouterr().out)
    assert report["exit_code"] == 3
    assert [(i["kind"], i["verdict"]) for i in report["items"]] == [
        ("operator", "needs migration"),
        ("sink", "compatible"),
    ]
    assert cli(["check", str(root), "--pipeline", "upgrade_job:nothing"]) == 2
    assert "cannot be loaded" in capsys.readouterr().err
    assert DeltaTable(str(root / "_manifest")).version() == manifest_version

    # the checked upgrade, renamed on the way: the state moves to the new operator's table
    event_table(Path(events), BATCHES[1:])
    spend_pipeline(events, root, moved).run()
    snapshots = Snapshots(str(root), spark)
    assert snapshots.operators() == ["spending"]
    assert_same(snapshots.state("spending"), model_state(spark, BATCHES))
    assert_same(snapshots.sink("output"), model_sink(spark, BATCHES))
    assert check(spend_pipeline(events, root, moved)).exit_code == 0


def batch_totals(key: tuple[Any, ...], rows: pd.DataFrame, state: KeyState) -> Any:
    return {"user": key[0], "total": int(rows["amount"].sum())}


def running_totals(key: tuple[Any, ...], rows: pd.DataFrame, state: KeyState) -> Any:
    old = state.get({"total": 0, "count": 0})
    total = int(old["total"] + rows["amount"].sum())
    state.update({"total": total, "count": int(old["count"] + len(rows))})
    return {"user": key[0], "total": total}


def test_an_operator_turns_stateful_without_rules_and_stateless_by_dropping_its_columns(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Stateless on batch 0, stateful on batches 1 and 2 (its state starts empty), then
    stateless again: refused until the evolution drops the state columns."""
    events, root = str(tmp_path / "events"), tmp_path / "root"
    event_table(Path(events), BATCHES[:1])
    stateless = operator(key="user", output_schema=SINK_DDL, name="spend")(batch_totals)
    spend_pipeline(events, root, stateless).run()

    event_table(Path(events), BATCHES[1:3])
    stateful = operator(
        key="user", state_schema="total long, count long", output_schema=SINK_DDL, name="spend"
    )(running_totals)
    spend_pipeline(events, root, stateful).run()
    snapshots = Snapshots(str(root), spark)
    assert_same(snapshots.state("spend"), model_state(spark, BATCHES[1:3]).drop("mean"))

    event_table(Path(events), BATCHES[3:])
    with pytest.raises(StateEvolutionError, match=r"dropped=\['total'\]"):
        spend_pipeline(events, root, stateless).run()
    dropping = StateEvolution(dropped=["total", "count"])
    stateless_again = operator(
        key="user", output_schema=SINK_DDL, name="spend", evolution=dropping
    )(batch_totals)
    spend_pipeline(events, root, stateless_again).run()
    snapshots = Snapshots(str(root), spark)
    assert snapshots.state("spend").count() == 0
    *_, before, last = [i.epoch for i in snapshots.list()]
    added = snapshots.sink("output", last).exceptAll(snapshots.sink("output", before))
    assert_same(added, model_sink(spark, BATCHES[3:]))  # one batch: its sums
