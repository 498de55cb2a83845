"""Inputs shared by tests: word-count epochs, schemas, and running calls together."""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pyspark_abs import ArrowContext, KeyGroupResult


def arrow_schema(*fields: tuple[str, pa.DataType]) -> pa.Schema:
    """An Arrow schema from (name, type) pairs."""
    return pa.schema([pa.field(name, kind) for name, kind in fields])


def race(*calls: Callable[[], object]) -> list[BaseException | None]:
    """Run the calls in threads released together; return what each raised."""
    start = threading.Barrier(len(calls))
    outcomes: list[BaseException | None] = [None] * len(calls)

    def run(i: int) -> None:
        start.wait()
        try:
            calls[i]()
        except BaseException as err:
            outcomes[i] = err

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def write_epochs(directory: Path, epochs: Sequence[str], first: int = 0) -> Path:
    """Write one text file per epoch, with increasing modification times.

    Spark's file source with ``maxFilesPerTrigger=1`` takes the oldest file first, so file i
    is processed in epoch i. ``first`` numbers the files of a later landing after those.
    """
    directory.mkdir(parents=True, exist_ok=True)
    for i, text in enumerate(epochs, start=first):
        path = directory / f"part-{i:04d}.txt"
        path.write_text(text)
        os.utime(path, (1_700_000_000 + i * 10, 1_700_000_000 + i * 10))
    return directory


def running_counts(epochs: Sequence[str]) -> tuple[dict[str, int], list[tuple[str, int]]]:
    """Final word counts, and the sink rows a word count emits (word, count after epoch)."""
    counts: Counter[str] = Counter()
    emitted: list[tuple[str, int]] = []
    for text in epochs:
        words = text.split()
        counts.update(words)
        emitted.extend((w, counts[w]) for w in dict.fromkeys(words))
    return dict(counts), emitted


EPOCHS = (
    "a b c a",
    "b d e",
    "a f a g h",
    "i b c j k",
)
"""Four epochs of words: keys are added, changed and left alone across epochs."""


def count_words_arrow(rows: pa.Table, state: pa.Table, ctx: ArrowContext) -> KeyGroupResult:
    """A running count per word in the Arrow form: its new counts are state and output."""
    seen: Any = rows.group_by("word").aggregate([("word", "count")])
    at: Any = pc.index_in(seen["word"], value_set=state["word"])
    taken: Any = pc.take(state["count"], at)
    held: Any = pc.fill_null(taken, 0)
    counts = pa.table({"word": seen["word"], "count": pc.add(seen["word_count"], held)})
    return KeyGroupResult(state=counts, output=counts)
