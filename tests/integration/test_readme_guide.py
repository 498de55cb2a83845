"""The documentation's how-to blocks that stand alone: running a pipeline, a snapshot interval, the
two versions of an evolved operator over a FileSource, a DeltaSource, a bronze table in front
of a source that cannot rewind, a loop, and the pytest example. Each runs as printed, with
the example's paths (and any ``...``) replaced by this run's; each result is checked against
counts computed here."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any, cast

import pandas as pd
import pytest
from chispa import DataFramesNotEqualError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pyspark_abs import (
    AbsConfig,
    DeltaSource,
    FileSource,
    Operator,
    Pipeline,
    Snapshots,
    operator,
    rollback,
    vectorized_operator,
)
from pyspark_abs.errors import OperatorDefinitionError
from pyspark_abs.examples import components
from pyspark_abs.examples.wordcount import word_count, words_of
from tests.support.docs import run_block
from tests.support.inputs import write_epochs
from tests.support.pipelines import assert_same, counts_df, expected_sink, user_count, word_table

TEXTS = ("a b a", "b c", "c c a")
CLICKS = (
    [("ann", "/home", "2026-03-01T10:00:00"), ("bob", "/docs", "2026-03-01T10:01:00")],
    [("ann", "/docs", "2026-03-01T10:02:00"), ("ann", "/blog", "2026-03-01T10:03:00")],
    [("bob", "/home", "2026-03-01T10:04:00"), ("cy", "/home", "2026-03-01T10:05:00")],
)


def land_clicks(landing: Path, epochs: tuple[list[tuple[str, str, str]], ...]) -> None:
    """One JSON-lines file of (user, url, ts) clicks per epoch, landed in order."""
    landing.mkdir(exist_ok=True)
    for number, clicks in enumerate(epochs, start=len(list(landing.iterdir()))):
        lines = [json.dumps({"user": u, "url": url, "ts": ts}) for u, url, ts in clicks]
        (landing / f"part-{number:04d}.json").write_text("\n".join(lines) + "\n")


def clicks_per_user(
    spark: SparkSession, epochs: tuple[list[tuple[str, str, str]], ...]
) -> DataFrame:
    counts = Counter(user for clicks in epochs for user, _, _ in clicks)
    return spark.createDataFrame(sorted(counts.items()), "user string, count long")


def test_the_run_a_pipeline_and_snapshot_interval_blocks(
    spark: SparkSession, tmp_path: Path
) -> None:
    landing, root, sink = tmp_path / "in", tmp_path / "root", tmp_path / "sink"
    write_epochs(landing, TEXTS)  # Spark's file source takes the oldest file first
    places = {
        "/data/in": str(landing),
        "/data/abs/wordcount": str(root),
        "/data/tables/word_counts": str(sink),
        "key_groups=256": "key_groups=4",
        '"10 seconds"': '"1 second"',
        "\n...\n": "\nquery.process_all_available()\n",
    }
    ns: dict[str, object] = {"word_count": word_count}
    run_block('query = pipeline.start(processing_time="10 seconds")', ns, places)
    snapshots = Snapshots(str(root), spark)
    assert [s.epoch for s in snapshots.list()] == [0, 1, 2]  # one file a trigger
    assert_same(snapshots.state("word_count"), counts_df(spark, TEXTS))
    assert_same(snapshots.sink("output"), expected_sink(spark, TEXTS))

    run_block("config = AbsConfig(snapshot_interval=5)", ns, {})
    assert cast(AbsConfig, ns["config"]).snapshot_interval == 5


def activity_v1(key: tuple[Any, ...], rows: pd.DataFrame, state: Any) -> dict[str, Any]:
    clicks = state.get({"clicks": 0, "last_page": None})["clicks"] + len(rows)
    state.update({"clicks": clicks, "last_page": rows.sort_values("ts")["url"].iloc[-1]})
    return {"user": key[0], "clicks": clicks}


def activity_v2(key: tuple[Any, ...], rows: pd.DataFrame, state: Any) -> dict[str, Any]:
    old = state.get({"clicks": 0, "pages": 0})
    new = {"clicks": old["clicks"] + len(rows), "pages": old["pages"] + len(rows)}
    state.update(new)
    return {"user": key[0], "clicks": new["clicks"]}


def test_the_evolution_blocks_migrate_an_operator_over_the_file_source_block(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Version 1 counts clicks and keeps the last page; version 2 starts on its snapshot:
    ``pages`` comes from the old ``clicks``, so it equals the clicks of the whole stream."""
    landing, root = tmp_path / "clicks", tmp_path / "root"
    land_clicks(landing, CLICKS[:2])
    ns: dict[str, object] = {"operator": operator, "FileSource": FileSource}
    run_block(
        '    schema="user string, url string, ts timestamp",',
        ns,
        {"/landing/clicks": str(landing), "FileSource(": "source = FileSource("},
    )

    stub = {
        "def activity(key, rows, state): ...": (
            "def activity(key, rows, state):\n    return body(key, rows, state)"
        )
    }

    def run(line: str, body: Any) -> Snapshots:
        ns["body"] = body
        run_block(line, ns, stub)
        Pipeline(
            "activity",
            cast(FileSource, ns["source"]),
            cast(Operator, ns["activity"]),
            root=str(root),
            sinks=str(tmp_path / "sink"),
            config=AbsConfig(key_groups=4, commit_mode="sync"),
        ).run()
        return Snapshots(str(root), spark)

    version_1 = run('state_schema="clicks int, last_page string"', activity_v1)
    last_pages = [("ann", 3, "/blog"), ("bob", 1, "/docs")]
    v1 = spark.createDataFrame(last_pages, "user string, clicks int, last_page string")
    assert_same(version_1.state("activity"), v1)

    land_clicks(landing, CLICKS[2:])
    version_2 = run("from datetime import timedelta", activity_v2)
    counts = clicks_per_user(spark, CLICKS)
    migrated = counts.selectExpr("user", "count AS clicks", "count AS pages")
    assert_same(version_2.state("activity"), migrated)
    assert_same(version_2.state("activity", 0), v1)  # the old snapshot keeps its schema
    assert [s.status for s in version_2.list()][-2:] == ["RESTORED", "COMMITTED"]


def pages_model(epochs: tuple[list[tuple[str, str, str]], ...]) -> list[tuple[Any, ...]]:
    """Per user: pages in first-seen order, visits per page, and the totals."""
    seen: dict[str, list[str]] = {}
    visits: dict[str, Counter[str]] = {}
    for clicks in epochs:
        for user, url, _ in clicks:
            if url not in seen.setdefault(user, []):
                seen[user].append(url)
            visits.setdefault(user, Counter())[url] += 1
    return [
        (u, seen[u], dict(visits[u]), (sum(visits[u].values()), len(seen[u]))) for u in sorted(seen)
    ]


def test_the_list_and_map_state_block_survives_a_rollback(
    spark: SparkSession, tmp_path: Path
) -> None:
    landing = tmp_path / "clicks"
    land_clicks(landing, CLICKS)
    ns: dict[str, object] = {"operator": operator}
    run_block('state_schema="pages array<string>, visits map<string, bigint>, "', ns, {})

    def pipeline(root: Path) -> Pipeline:
        return Pipeline(
            "pages",
            FileSource(str(landing), "json", "user string, url string", max_files_per_trigger=1),
            cast(Operator, ns["pages"]),
            root=str(root),
            sinks=str(root / "sink"),
            config=AbsConfig(key_groups=4, commit_mode="sync"),
        )

    pipeline(tmp_path / "clean").run()
    root = tmp_path / "root"
    pipeline(root).run()
    rollback(str(root), 0)
    pipeline(root).run()
    entries = F.array_sort(F.map_entries("visits"))  # maps cannot be sorted or compared
    schema = (
        "user string, pages array<string>, visits map<string, bigint>, "
        "totals struct<clicks: bigint, pages: bigint>"
    )
    for path, epoch, epochs in (
        (root, 0, CLICKS[:1]),
        (root, None, CLICKS),
        (tmp_path / "clean", None, CLICKS),
    ):
        state = Snapshots(str(path), spark).state("pages", epoch)
        expected = spark.createDataFrame(pages_model(epochs), schema)
        assert_same(*(df.withColumn("visits", entries) for df in (state, expected)))


def test_the_delta_source_block(spark: SparkSession, tmp_path: Path) -> None:
    words = word_table(tmp_path / "words", TEXTS)
    places = {
        "/data/tables/words": words,
        "/data/abs/wordcount": str(tmp_path / "root"),
        "/data/tables/word_counts": str(tmp_path / "sink"),
    }
    ns: dict[str, object] = {"word_count": word_count}
    run_block('DeltaSource("/data/tables/words", max_files_per_trigger=1)', ns, places)
    cast(Pipeline, ns["pipeline"]).run()
    snapshots = Snapshots(str(tmp_path / "root"), spark)
    assert_same(snapshots.state("word_count"), counts_df(spark, TEXTS))
    assert_same(snapshots.sink("output"), expected_sink(spark, TEXTS))


def test_the_options_block_declares_both_forms_from_one_object(
    spark: SparkSession, tmp_path: Path
) -> None:
    ns: dict[str, object] = {}
    run_block('"output_schema": "word string, count long",', ns, {})
    pandas_form, arrow_form = cast(Operator, ns["count_words"]), ns["count_words_in_arrow"]
    assert isinstance(arrow_form, Operator)
    assert (arrow_form.name, pandas_form.name) == ("count_words_arrow", "count_words")
    assert (arrow_form.arrow, pandas_form.arrow) == (True, False)
    words = word_table(tmp_path / "words", TEXTS)
    for form in (pandas_form, arrow_form):
        root = str(tmp_path / form.name)
        Pipeline(
            form.name,
            DeltaSource(words, max_files_per_trigger=1),
            form,
            root=root,
            sinks=f"{root}_sink",
            config=AbsConfig(key_groups=4),
        ).run()
        snapshots = Snapshots(root, spark)
        assert_same(snapshots.state(form.name), counts_df(spark, TEXTS))
        assert_same(snapshots.sink("output"), expected_sink(spark, TEXTS))
    with pytest.raises(OperatorDefinitionError, match=r"unknown option\(s\) \['ttl_clok'\]"):
        vectorized_operator(**{**cast(dict[str, Any], ns["counting"]), "ttl_clok": "x"})(
            lambda rows, state, ctx: None
        )
    with pytest.raises(OperatorDefinitionError, match="key= is missing"):
        vectorized_operator(output_schema="word string")(lambda rows, state, ctx: None)  # type: ignore[call-arg]


@pytest.mark.delta_jvm  # Spark writes the bronze table with Delta's jars
def test_the_bronze_block_lands_a_file_stream_in_delta_for_a_delta_source(
    delta_spark: SparkSession, tmp_path: Path
) -> None:
    landing, bronze = tmp_path / "landing", tmp_path / "bronze"
    land_clicks(landing, CLICKS)
    places = {
        '.start("/bronze/clicks")': (
            '.trigger(availableNow=True).start("/bronze/clicks").awaitTermination()'
        ),
        "/landing/clicks": str(landing),
        "/chk/bronze": str(tmp_path / "chk"),
        "/bronze/clicks": str(bronze),
        'Pipeline("sessions"': 'pipeline = Pipeline("sessions"',
        "root=...": f"root={str(tmp_path / 'root')!r}",
        "sinks=...": f"sinks={str(tmp_path / 'sink')!r}",
    }
    ns: dict[str, object] = {
        "spark": delta_spark,
        "schema": "user string, url string, ts timestamp",
        "Pipeline": Pipeline,
        "DeltaSource": DeltaSource,
        "sessions": user_count,
    }
    run_block('raw = spark.readStream.schema(schema).json("/landing/clicks")', ns, places)
    cast(Pipeline, ns["pipeline"]).run()
    state = Snapshots(str(tmp_path / "root"), delta_spark).state("user_count")
    assert_same(state.select("user", "count"), clicks_per_user(delta_spark, CLICKS))


def test_the_cycles_block_reaches_the_components_of_a_union_find(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edges = components.generate("mixed", 60, seed=7)
    components.write_edges(edges, str(tmp_path / "edges"))
    root = str(tmp_path / "root")
    places = {
        "/data/edges": str(tmp_path / "edges"),
        "/data/abs/components": root,
        "/data/tables/labels": str(tmp_path / "labels"),
        "transform=both_directions,": (
            "transform=both_directions,\n    config=AbsConfig(key_groups=4, commit_mode='sync'),"
        ),
    }
    ns: dict[str, object] = {
        "DeltaSource": DeltaSource,
        "AbsConfig": AbsConfig,
        "propagate": components.propagate,
        "both_directions": components.both_directions,
    }
    capsys.readouterr()
    run_block('back_edges=[BackEdge("offers")],', ns, places)
    epoch, epochs_run, _ = capsys.readouterr().out.split()
    assert int(epochs_run) >= 2  # the loop went round
    assert int(epoch) >= 1
    assert components.components(root) == components.union_find(edges)
    assert Snapshots(root, spark).in_flight("offers").count() == 0


def word_count_over(files_per_epoch: int | None) -> Any:
    """A ``build_pipeline`` for the documentation's pytest example: the word count over a folder."""

    def build_pipeline(landing: Path, *, root: Path) -> Pipeline:
        return Pipeline(
            "wordcount",
            FileSource(str(landing), "text", max_files_per_trigger=files_per_epoch),
            word_count,
            root=str(root),
            sinks={"output": str(root / "sinks" / "output")},
            config=AbsConfig(key_groups=4, commit_mode="sync"),
            transform=words_of,
        )

    return build_pipeline


def test_the_pytest_example_runs_and_its_assertions_can_fail(
    spark: SparkSession, tmp_path: Path
) -> None:
    (tmp_path / "passes").mkdir()
    (tmp_path / "fails").mkdir()
    ns: dict[str, Any] = {"build_pipeline": word_count_over(1)}
    run_block("def test_word_count(spark, tmp_path):", ns, {})
    ns["test_word_count"](spark, tmp_path / "passes")
    ns["build_pipeline"] = word_count_over(None)  # both files in one epoch: epoch 0 differs
    with pytest.raises(DataFramesNotEqualError):
        ns["test_word_count"](spark, tmp_path / "fails")
