"""The paper's incremental word count as a pyspark-abs pipeline.

Run it as a program to process a directory of text files, one file per epoch::

    python -m pyspark_abs.examples.wordcount --input DIR --root ROOT [--crash STEP:EPOCH]

``--crash`` exits the process at that protocol step, as a crash would; running the same
command again recovers and finishes. ``--pause STEP:EPOCH`` stops the process there
(SIGSTOP) instead, for a supervisor such as ``scripts/harnesses/chaos.py`` to kill.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pyspark_abs.config import AbsConfig
from pyspark_abs.faults import Fault, FaultAction, FaultStep
from pyspark_abs.operators.contract import (
    KeyGroupContext,
    KeyGroupResult,
    Operator,
    vectorized_operator,
)
from pyspark_abs.pipeline.declaration import Pipeline
from pyspark_abs.session import local_session
from pyspark_abs.sources.files.spark import SparkFileSource


@vectorized_operator(key="word", state_schema="count long", output_schema="word string, count long")
def word_count(rows: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext) -> KeyGroupResult:
    """Count words: each epoch adds its words to the running counts and emits them."""
    seen = rows.groupby("word", sort=False).size().rename("seen").reset_index()
    merged = seen.merge(state[["word", "count"]], on="word", how="left")
    merged["count"] = merged["count"].fillna(0).astype("int64") + merged["seen"]
    updated = merged[["word", "count"]]
    return KeyGroupResult(state=updated, output=updated)


def words_of(lines: DataFrame) -> DataFrame:
    """Split text lines into lower-case words."""
    return lines.select(
        F.explode(F.split(F.lower(F.col("value")), r"[^a-z0-9']+")).alias("word")
    ).where(F.col("word") != "")


def build(
    input_dir: str,
    root: str,
    *,
    config: AbsConfig | None = None,
    operator: Operator = word_count,
) -> Pipeline:
    """A word-count pipeline over the text files in ``input_dir``, one file per epoch.

    It reads them with Spark's own text source through a :class:`SparkFileSource`, so that
    a rollback or a restore of its root continues after the files its snapshot had read.
    """
    lines = SparkFileSource(input_dir, "text", options={"maxFilesPerTrigger": "1"})
    return Pipeline(
        "wordcount",
        lines,
        operator,
        root=root,
        sinks={"output": f"{root}/sinks/word_counts"},
        config=config,
        transform=words_of,
    )


def input_files(input_dir: str) -> list[Path]:
    """The text files of ``input_dir`` in the order the pipeline reads them, one per epoch.

    Spark's file source takes the oldest file first; files with the same modification time
    are ordered by name here, which Spark does not promise.
    """
    files = [
        p for p in Path(input_dir).iterdir() if p.is_file() and not p.name.startswith((".", "_"))
    ]
    return sorted(files, key=lambda p: (p.stat().st_mtime, p.name))


def words_in(path: Path) -> list[str]:
    """The words of one file, split and lower-cased as :func:`words_of` does."""
    return [w for w in re.split(r"[^a-z0-9']+", path.read_text().lower()) if w]


def count_directly(input_dir: str) -> Counter[str]:
    """The word count of every file in ``input_dir``, computed without Spark."""
    counts: Counter[str] = Counter()
    for path in input_files(input_dir):
        counts.update(words_in(path))
    return counts


def parse_crash(text: str) -> Fault:
    """Parse ``STEP:EPOCH`` (e.g. ``after_prepared:2``) into an EXIT fault."""
    return _parse_fault(text, FaultAction.EXIT, "--crash")


def parse_pause(text: str) -> Fault:
    """Parse ``STEP:EPOCH`` (e.g. ``after_prepared:2``) into a PAUSE fault."""
    return _parse_fault(text, FaultAction.PAUSE, "--pause")


def _parse_fault(text: str, action: FaultAction, option: str) -> Fault:
    step, _, epoch = text.partition(":")
    try:
        return Fault(FaultStep(step), int(epoch), action)
    except ValueError:
        steps = ", ".join(s.value for s in FaultStep)
        raise argparse.ArgumentTypeError(
            f"{option} takes STEP:EPOCH with STEP one of {steps}, got {text!r}"
        ) from None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the word count over ``--input`` until every file is processed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", required=True, help="directory of text files")
    parser.add_argument("--root", required=True, help="snapshot root")
    parser.add_argument("--crash", type=parse_crash, help="exit at STEP:EPOCH")
    parser.add_argument("--pause", type=parse_pause, help="stop (SIGSTOP) at STEP:EPOCH")
    parser.add_argument("--commit-mode", choices=["sync", "async"], default="async")
    parser.add_argument("--key-groups", type=int, default=16)
    parser.add_argument(
        "--compact-every", type=int, default=0, help="compact the state every N epochs"
    )
    args = parser.parse_args(argv)
    local_session("wordcount", shuffle_partitions=2)
    faults = tuple(f for f in (args.crash, args.pause) if f is not None)
    config = AbsConfig(
        commit_mode=args.commit_mode,
        key_groups=args.key_groups,
        compaction_every_epochs=args.compact_every,
        faults=faults,
    )
    query = build(args.input, args.root, config=config).run()
    if query.recovered_epochs:
        print(f"recovery committed PREPARED epoch(s) {query.recovered_epochs} from the manifest")
    return 0


if __name__ == "__main__":
    sys.exit(main())
