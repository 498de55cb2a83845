"""The medallion job in tests: its input, a model of its results, and comparisons."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from pyspark_abs import AbsConfig, Job, JobSnapshot, Pipeline, Snapshots, StateEvolution
from pyspark_abs.examples import medallion, wordcount
from pyspark_abs.operators.contract import KeyGroupContext, KeyGroupResult, vectorized_operator
from tests.support.pipelines import OP, assert_same

Event = tuple[str, str, int]
Forget = frozenset[str]
"""Event ids silver's state forgets (written state), between two files."""

FILES: list[list[Event]] = [
    [("e1", "ann", 5), ("e2", "bob", 7)],
    [("e2", "bob", 7), ("e3", "ann", 1)],
    [],
    [("e4", "cy", 2), ("e1", "ann", 5), ("e4", "cy", 2)],
    [("e5", "bob", 3), ("e6", "ann", 4)],
]
"""One file per epoch: duplicates across files and within one, and an empty file."""

SCHEMAS = {
    "silver": "event_id string, user string",
    "gold": "user string, total long, events long",
    "audit": "user string, landed long, kept long",
}
"""The state of each stateful stage."""


@vectorized_operator(
    key="event_id",
    state_schema="user string, seen long",
    output_schema=medallion.EVENT_DDL,
    name="dedup",
    evolution=StateEvolution(added={"seen": 1}),
)
def dedup_v2(rows: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext) -> KeyGroupResult:
    """Silver, redeployed: its state also counts how often each event id was seen."""
    fresh = rows.drop_duplicates("event_id")
    fresh = fresh[~fresh["event_id"].isin(state["event_id"])].copy()
    fresh["seen"] = 1
    return KeyGroupResult(
        state=fresh[["event_id", "user", "seen"]], output=fresh[["event_id", "user", "amount"]]
    )


def job_of(
    spark: SparkSession,
    base: Path,
    stage_configs: Mapping[str, AbsConfig] | None = None,
    **config: Any,
) -> Job:
    """The medallion job over ``base/in`` with its root at ``base/job``, small and sync."""
    settings: dict[str, Any] = {"key_groups": 4, "commit_mode": "sync"}
    settings.update(config)
    return medallion.build(
        spark,
        str(base / "in"),
        str(base / "job"),
        config=AbsConfig(**settings),
        stage_configs=stage_configs,
    )


def run_streaming(job: Job) -> list[str]:
    """Start ``job`` streaming, catch every stage up with its input so far, and stop it.

    Returns the stages that waited to start, as the start left them.
    """
    query = job.start()
    waiting = query.waiting
    try:
        query.process_all_available()
    finally:
        query.stop()
    return waiting


def model(
    files: Sequence[Sequence[Event] | Forget], through: int
) -> dict[str, list[tuple[Any, ...]]]:
    """Each stage's state after step ``through`` (file ``through``), computed directly.

    A step is a file, or a :data:`Forget` that takes event ids out of silver's state.
    """
    seen: dict[str, str] = {}
    totals: dict[str, list[int]] = {}
    audit: dict[str, list[int]] = {}
    for events in files[: through + 1]:
        if isinstance(events, frozenset):
            seen = {e: u for e, u in seen.items() if e not in events}
            continue
        for event_id, user, amount in events:
            audit.setdefault(user, [0, 0])[0] += 1
            if event_id in seen:
                continue
            seen[event_id] = user
            audit[user][1] += 1
            total = totals.setdefault(user, [0, 0])
            total[0] += amount
            total[1] += 1
    return {
        "silver": sorted(seen.items()),
        "gold": sorted((u, t, n) for u, (t, n) in totals.items()),
        "audit": sorted((u, landed, kept) for u, (landed, kept) in audit.items()),
    }


def history(
    job: Job, stage: str, snapshots: Sequence[JobSnapshot], columns: Sequence[str]
) -> DataFrame:
    """A stage's state (``columns``) as of each of the job's ``snapshots``, with the job epoch.

    Each is read at the stage epoch the job snapshot names, as :meth:`Job.state` reads it,
    from one listing (``Job.state`` lists the job snapshots again at each call, reading every
    stage's manifest), and through :meth:`Snapshots.state_table`: the snapshots become one
    DataFrame instead of a union of one windowed query per snapshot, which Spark spent a
    third of a job test planning and running.
    """
    pipeline = job.stages[stage]
    reader = pipeline.snapshots
    tables = []
    for s in snapshots:
        table = reader.state_table(pipeline.plan.name, s.stages[stage]).select(list(columns))
        epochs = pa.array([s.epoch] * table.num_rows, pa.int32())
        tables.append(table.append_column("job_epoch", epochs))
    rows = [tuple(r.values()) for r in pa.concat_tables(tables).to_pylist()]
    return pipeline.spark.createDataFrame(rows, f"{SCHEMAS[stage]}, job_epoch int")


def expected_history(
    spark: SparkSession,
    stage: str,
    epochs: Mapping[int, int],
    files: Sequence[Sequence[Event] | Forget],
) -> DataFrame:
    """What :func:`history` must give: job epoch to the input file it ends after."""
    rows = [
        (*row, epoch) for epoch, through in epochs.items() for row in model(files, through)[stage]
    ]
    return spark.createDataFrame(rows, f"{SCHEMAS[stage]}, job_epoch int")


def assert_job_matches(
    spark: SparkSession,
    job: Job,
    epochs: Mapping[int, int],
    files: Sequence[Sequence[Event] | Forget] = FILES,
    stages: Sequence[str] = tuple(SCHEMAS),
) -> None:
    """Every job snapshot holds the state the model gives for its input (chispa).

    Args:
        epochs: Each job snapshot expected, and the last input step it has read.
        files: The input steps.
        stages: The stages compared (silver by its event ids and users only).
    """
    snapshots = job.snapshots()
    assert [s.epoch for s in snapshots] == list(epochs)
    for stage in stages:
        columns = [f.split()[0] for f in SCHEMAS[stage].split(", ")]
        actual = history(job, stage, snapshots, columns)
        assert_same(actual, expected_history(spark, stage, epochs, files))


def words_and_updates(base: Path, words: Pipeline) -> Job:
    """A job of ``words`` (a word count whose root is ``base/words``) and a word count over
    its channel, ``updates``: how often each word's count changed."""
    again = Pipeline(
        "updates",
        words.channel(),
        wordcount.word_count,
        root=str(base / "updates"),
        sinks=str(base / "sinks" / "updates"),
        config=AbsConfig(key_groups=4, commit_mode="sync"),
    )
    return Job("words", str(base), [words, again])


def assert_same_words_and_updates(spark: SparkSession, actual: Path, expected: Path) -> None:
    """Both stages of two :func:`words_and_updates` jobs hold the same state and sinks."""
    for stage in ("words", "updates"):
        rerun, uninterrupted = (Snapshots(str(b / stage), spark) for b in (actual, expected))
        assert_same(rerun.state(OP), uninterrupted.state(OP))
        assert_same(rerun.sink("output"), uninterrupted.sink("output"))
