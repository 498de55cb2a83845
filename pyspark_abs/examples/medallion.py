"""A medallion job: bronze JSON files, silver dedup, gold totals, and a fan-in audit.

::

    bronze ──► silver ──► gold
       │          │
       └──► audit ◄┘        (fan-in: one ChannelSource over both channels)

* ``bronze`` lands JSON-lines files of payment events, one file per epoch, keyed by user;
  the source may deliver an event more than once (a producer's retry).
* ``silver`` drops events it has seen before (state: the event ids seen).
* ``gold`` keeps each user's total and number of events (state: both).
* ``audit`` reads bronze and silver together and counts, per user, the events landed and
  the events kept; their difference is the duplicates silver dropped.

Every stage is a :class:`~pyspark_abs.Pipeline` with its own snapshot root under the job's
root, and its sinks in ``<root>/tables``. Run it as a program to process a directory of
event files::

    python -m pyspark_abs.examples.medallion --input DIR --root ROOT [--streaming]
        [--crash STAGE:STEP:EPOCH]

``--crash`` exits the whole application when that stage reaches that protocol step;
running the same command again recovers every stage and finishes. ``--streaming`` starts the
stages as streaming queries (a stage that continues its checkpoint at once) and stops them
once they have caught up with the files landed so far.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd
from pyspark.sql import SparkSession

from pyspark_abs.config import AbsConfig
from pyspark_abs.examples.wordcount import parse_crash
from pyspark_abs.job.declaration import Job
from pyspark_abs.operators.contract import (
    KeyGroupContext,
    KeyGroupResult,
    Operator,
    vectorized_operator,
)
from pyspark_abs.pipeline.declaration import Pipeline
from pyspark_abs.session import local_session
from pyspark_abs.sources import ChannelSource, FileSource

EVENT_DDL = "event_id string, user string, amount long"
STAGES = ("bronze", "silver", "gold", "audit")


@vectorized_operator(key="user", output_schema=EVENT_DDL)
def land(rows: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext) -> KeyGroupResult:
    """Bronze: pass events through (a stateless operator: no state_schema)."""
    return KeyGroupResult(output=rows[["event_id", "user", "amount"]])


@vectorized_operator(key="event_id", state_schema="user string", output_schema=EVENT_DDL)
def dedup(rows: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext) -> KeyGroupResult:
    """Silver: emit each event id once, the first time it arrives."""
    fresh = rows.drop_duplicates("event_id")
    fresh = fresh[~fresh["event_id"].isin(state["event_id"])]
    return KeyGroupResult(
        state=fresh[["event_id", "user"]], output=fresh[["event_id", "user", "amount"]]
    )


@vectorized_operator(
    key="user",
    state_schema="total long, events long",
    output_schema="user string, total long, events long",
)
def totals(rows: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext) -> KeyGroupResult:
    """Gold: each user's running total and number of events."""
    seen = rows.groupby("user", sort=False)["amount"].agg(["sum", "size"]).reset_index()
    merged = seen.merge(state[["user", "total", "events"]], on="user", how="left")
    merged["total"] = merged["total"].fillna(0).astype("int64") + merged["sum"]
    merged["events"] = merged["events"].fillna(0).astype("int64") + merged["size"]
    updated = merged[["user", "total", "events"]]
    return KeyGroupResult(state=updated, output=updated)


@vectorized_operator(
    key="user",
    state_schema="landed long, kept long",
    output_schema="user string, landed long, kept long",
)
def audit(rows: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext) -> KeyGroupResult:
    """Audit (fan-in): per user, events landed in bronze and kept by silver."""
    counts = (
        pd.crosstab(rows["user"], rows["channel"])
        .reindex(columns=["bronze", "silver"], fill_value=0)
        .reset_index()
    )
    merged = counts.merge(state[["user", "landed", "kept"]], on="user", how="left")
    merged["landed"] = merged["landed"].fillna(0).astype("int64") + merged["bronze"]
    merged["kept"] = merged["kept"].fillna(0).astype("int64") + merged["silver"]
    updated = merged[["user", "landed", "kept"]]
    return KeyGroupResult(state=updated, output=updated)


def build(
    spark: SparkSession,
    input_dir: str,
    root: str,
    *,
    config: AbsConfig | None = None,
    stage_configs: Mapping[str, AbsConfig] | None = None,
    operators: Mapping[str, Operator] | None = None,
) -> Job:
    """The medallion job over the JSON-lines files in ``input_dir``, one file per epoch.

    Args:
        spark: The session (the stages' sources need it active).
        input_dir: Where event files land.
        root: The job's root; each stage's snapshot root and sinks go under it.
        config: Every stage's configuration (default: from ``spark.abs.*``).
        stage_configs: Configurations of single stages, by stage name.
        operators: Other versions of stages' operators, by stage name (a new deploy).
    """
    del spark  # the sources read the active session; the argument says one must exist
    configs = dict(stage_configs or {})
    deployed = dict(operators or {})

    def stage(name: str, source: FileSource | ChannelSource, operator: Operator) -> Pipeline:
        return Pipeline(
            name,
            source,
            deployed.get(name, operator),
            root=f"{root}/stages/{name}",
            sinks=f"{root}/tables/{name}",
            config=configs.get(name, config),
        )

    bronze = stage(
        "bronze", FileSource(input_dir, "json", EVENT_DDL, max_files_per_trigger=1), land
    )
    silver = stage("silver", bronze.channel(), dedup)
    gold = stage("gold", silver.channel(), totals)
    checks = stage("audit", ChannelSource.of(bronze.channel(), silver.channel()), audit)
    return Job("medallion", root, [bronze, silver, gold, checks])


def write_events(input_dir: str | Path, files: Sequence[Sequence[tuple[str, str, int]]]) -> None:
    """Land one JSON-lines file per epoch: ``(event_id, user, amount)`` per event.

    Files get increasing modification times, so the file source reads them in order.
    """
    directory = Path(input_dir)
    directory.mkdir(parents=True, exist_ok=True)
    start = len(list(directory.glob("events-*.json")))
    for number, events in enumerate(files, start=start):
        path = directory / f"events-{number:05d}.json"
        path.write_text(
            "".join(
                json.dumps({"event_id": e, "user": u, "amount": a}) + "\n" for e, u, a in events
            )
        )
        stamp = 1_700_000_000 + number * 10
        os.utime(path, (stamp, stamp))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the medallion job over ``--input`` until every file went through every stage."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", required=True, help="directory of JSON-lines event files")
    parser.add_argument("--root", required=True, help="the job's root")
    parser.add_argument("--crash", help="exit when STAGE reaches STEP:EPOCH")
    parser.add_argument("--commit-mode", choices=["sync", "async"], default="async")
    parser.add_argument(
        "--streaming",
        action="store_true",
        help="start the stages as streaming queries; stop once they caught up with the input",
    )
    args = parser.parse_args(argv)
    spark = local_session("medallion", shuffle_partitions=2)
    config = AbsConfig(commit_mode=args.commit_mode, key_groups=8)
    stage_configs = {}
    if args.crash:
        stage, _, fault = args.crash.partition(":")
        if stage not in STAGES:
            parser.error(f"--crash takes STAGE:STEP:EPOCH with STAGE one of {list(STAGES)}")
        stage_configs[stage] = AbsConfig(
            commit_mode=args.commit_mode, key_groups=8, faults=(parse_crash(fault),)
        )
    job = build(spark, args.input, args.root, config=config, stage_configs=stage_configs)
    if args.streaming:
        query = job.start()
        print(f"stages waiting for their upstream stages at the start: {query.waiting}")
        try:
            query.process_all_available()
        finally:
            query.stop()
    else:
        job.run()
    for snapshot in job.snapshots()[-1:]:
        print(f"job snapshot {snapshot.epoch}: {dict(snapshot.stages)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
