"""Nemesis: a random schedule of lifecycle operations, checked against a reference model.

    python scripts/harnesses/nemesis.py --ops N --seed S [--root DIR] [--kinds run,kill,...]

One keyed word count (a ``DeltaSource`` over a bronze Delta table of ``(word, reset)`` rows;
a ``reset`` row removes the word's key; the sink gets ``(word, count, batch)`` per changed
key, count 0 for a removed key, batch the Spark micro-batch id) goes through a seeded random
schedule of operations, each pipeline run in a child process in its own session so that a
kill is a real SIGKILL (each child is started while the operation before it runs, so that
its Spark start is out of the way):

- ``run``: an availableNow run (sync or async commit, sometimes compacting every epoch in
  the background); the first run after a rollback, restore or ``write_state`` picks another
  shuffle partition count and key-group count;
- ``kill``: a run SIGKILLed after a random delay, exactly at a protocol step (a PAUSE fault),
  or a moment after one;
- ``rollback``: to a random retained snapshot;
- ``restore``: a random retained snapshot into a new root; the schedule continues on the
  copy (fresh checkpoint, its own sink), the old roots are still checked;
- ``write_state``: a child reads the newest state with Spark, adds to one word's count and
  writes it back;
- ``maintenance``: a run with on-demand ``compact`` and ``vacuum`` (keep_last, min age 0)
  looping in two threads beside it, racing the pipeline and each other;
- ``race``: a second start while the first runs: one of them must be refused with a
  FencingError (or they ran one after the other);
- ``zombie``: a run paused at a protocol step, the lease broken, another run takes over and
  finishes, then the zombie is continued and must write nothing.

Before every operation new rows are appended to the bronze table. After every operation
each root is checked (every tenth, and the last; in between only the current root and those
whose tables changed): ``validate`` clean, and every retained snapshot (COMMITTED or RESTORED
and not EXPIRED) equal to the reference model: state (latest change per key as of the
epoch, read at the epoch's table version) and sink (every row the epoch's lineage emitted,
once). The model reads the manifest and the input table with deltalake and pyarrow only and
never imports pyspark_abs: a COMMITTED epoch consumed the input rows between its
predecessor's source offset and its own, a rollback epoch equals its target, a restored
copy's first epoch equals the original's, and a ``write_state`` epoch equals what this
script wrote.

The last line of standard output is one JSON object; the exit status is 0 only if lost,
duplicated, resurrected, mismatches, unreadable roots, validate problems and errors are all
zero.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake

from pyspark_abs.storage.root import SnapshotRoot

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve()
PIPELINE = "nemesis"
OPERATOR = "nemesis_count"
SOURCE_TAG = "pyspark_abs_delta"
STATE_TABLE = f"state/{OPERATOR}"
SINK_TABLE = "sink/output"
FENCED_EXIT = 3
CHILD_TIMEOUT_S = 240.0
DRIVER_STEPS = ("after_align", "after_prepared", "between_table_commits", "after_committed")
ROWS_PER_TRIGGER = 30
FULL_CHECK_EVERY = 10
"""Every this many steps every root is checked; in between, only the current root and the
roots whose tables changed."""
VOCABULARY = 12
WEIGHTS = {
    "run": 3,
    "kill": 4,
    "rollback": 2,
    "restore": 1,
    "write_state": 2,
    "maintenance": 2,
    "race": 1,
    "zombie": 1,
}
COUNTS = (
    "lost",
    "duplicated",
    "resurrected",
    "mismatches",
    "unreadable_roots",
    "unreadable_snapshots",
    "validate_problems",
    "errors",
)

# ---------------------------------------------------------------------------------------
# The reference model: deltalake and pyarrow only, never pyspark_abs.

Offset = tuple[int, int]
Row = tuple[str, bool]
SinkRow = tuple[str, int, int]


@dataclass(frozen=True)
class Edit:
    """A ``write_state`` this script made: ``word`` bumped by ``delta`` on ``base``'s state."""

    base: int
    word: str
    delta: int


@dataclass
class RootPlan:
    """What the script knows about one root: its sink, where it came from, its edits."""

    path: Path
    sink: Path
    parent: tuple[Path, int] | None = None
    edits: dict[int, Edit] = field(default_factory=dict)
    key_groups: int = 4
    partitions: int = 2
    fresh: bool = True


@dataclass
class Expected:
    """The model of one epoch: state, sink rows, source offset, keys removed in its lineage."""

    state: dict[str, int]
    sink: Counter[SinkRow]
    offset: Offset
    gone: frozenset[str]
    base: int = 0
    """The epoch of micro-batch 0 of the checkpoint that continues from this epoch."""


EMPTY = Expected({}, Counter(), (0, 0), frozenset())
"""Before the first epoch of a root: DeltaSource starts at version 0, row 0."""


def input_versions(bronze: Path, known: dict[int, list[Row]] | None = None) -> dict[int, list[Row]]:
    """Rows each version of the input table appends, in ``_delta_log`` order of its adds
    (versions in ``known`` are taken from it: a version's rows never change)."""
    versions: dict[int, list[Row]] = dict(known or {})
    for entry in sorted((bronze / "_delta_log").glob("*.json")):
        version = int(entry.stem)
        if version in versions:
            continue
        rows: list[Row] = []
        for line in entry.read_text().splitlines():
            add = json.loads(line).get("add") if line.strip() else None
            if add is None or not add.get("dataChange", True):
                continue
            table = pq.read_table(bronze / unquote(add["path"]))
            words = [str(w) for w in table["word"].to_pylist()]
            resets = [bool(r) for r in table["reset"].to_pylist()]
            rows += list(zip(words, resets, strict=True))
        versions[version] = rows
    return versions


def rows_between(versions: dict[int, list[Row]], start: Offset, end: Offset) -> list[Row]:
    """Rows after ``start`` up to ``end``: offset (v, i) means every row before row i of v."""
    if end < start:
        raise ValueError(f"end offset {end} is before start offset {start}")
    rows: list[Row] = []
    for version in range(start[0], end[0] + 1):
        appended = versions.get(version, [])
        low = start[1] if version == start[0] else 0
        high = end[1] if version == end[0] else len(appended)
        rows += appended[low:high]
    return rows


def parse_offset(source_offsets: str | None) -> Offset | None:
    """The input's DeltaSource offset among an epoch's source offsets (JSON lines).

    Spark writes one line per source in plan order: the input's first. The first run after a
    restore epoch also reads the installed state through a second, untagged stream over the
    state table; its line comes after the input's.
    """
    for line in (source_offsets or "").splitlines():
        value = json.loads(line) if line.strip().startswith("{") else None
        if isinstance(value, dict) and value.get("source") == SOURCE_TAG:
            return int(value["version"]), int(value["index"])
    return None


def manifest_epochs(root: Path) -> dict[int, dict[str, Any]]:
    """Every decided epoch (COMMITTED or RESTORED) with its fields and whether it is retained.

    Fields come from the decision row, or else from the epoch's last PREPARED row.
    """
    rows = DeltaTable(str(root / "_manifest")).to_pyarrow_table().to_pylist()
    # commit order: the manifest's version that appended each row (writers' clocks may differ)
    rows.sort(key=lambda r: (r.get("manifest_version") is not None, r.get("manifest_version") or 0))
    by_epoch: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        by_epoch.setdefault(int(row["epoch"]), []).append(row)
    decided: dict[int, dict[str, Any]] = {}
    for epoch, history in by_epoch.items():
        decision = next(
            (r for r in reversed(history) if r["status"] in ("COMMITTED", "RESTORED")), None
        )
        if decision is None:
            continue
        prepared: dict[str, Any] = next(
            (r for r in reversed(history) if r["status"] == "PREPARED"), {}
        )
        merged = {k: v if v is not None else prepared.get(k) for k, v in decision.items()}
        merged["retained"] = history[-1]["status"] in ("COMMITTED", "RESTORED")
        merged["table_versions"] = dict(merged.get("table_versions") or [])
        decided[epoch] = merged
    return decided


def apply_batch(before: Expected, rows: list[Row], epoch: int, offset: Offset) -> Expected:
    """The word count after one epoch's rows: a reset row removes its word (count 0 out)."""
    adds: Counter[str] = Counter(word for word, reset in rows if not reset)
    resets = {word for word, reset in rows if reset}
    state = dict(before.state)
    sink = Counter(before.sink)
    gone = set(before.gone)
    for word in dict.fromkeys(word for word, _ in rows):
        if word in resets:
            state.pop(word, None)
            gone.add(word)
            sink[(word, 0, epoch - before.base)] += 1
        else:
            state[word] = state.get(word, 0) + adds[word]
            gone.discard(word)
            sink[(word, state[word], epoch - before.base)] += 1
    return Expected(state, sink, offset, frozenset(gone), before.base)


class Model:
    """Expected state and sink of every decided epoch of every root."""

    def __init__(
        self, bronze: Path, plans: dict[Path, RootPlan], known: dict[int, list[Row]] | None = None
    ) -> None:
        self.versions = input_versions(bronze, known)
        self.plans = plans
        self.memo: dict[Path, dict[int, Expected]] = {}
        self.problems: list[str] = []

    def root(self, root: Path) -> tuple[dict[int, dict[str, Any]], dict[int, Expected]]:
        """The root's decided epochs and their models."""
        epochs = manifest_epochs(root)
        if root in self.memo:
            return epochs, self.memo[root]
        plan = self.plans[root]
        model: dict[int, Expected] = {}
        previous: int | None = None
        for epoch in sorted(epochs):
            entry = epochs[epoch]
            offset = parse_offset(entry.get("source_offsets"))
            origin = entry.get("origin") or ""
            if entry["status"] == "RESTORED":
                model[epoch] = self._restored(root, plan, epoch, entry, model)
                if offset is not None and offset != model[epoch].offset:
                    self.problems.append(
                        f"{root} epoch {epoch}: offset {offset}, model {model[epoch].offset}"
                    )
            else:
                before = (
                    model[previous]
                    if previous is not None
                    else Expected({}, Counter(), (0, 0), frozenset())
                )
                if offset is None:
                    self.problems.append(f"{root} epoch {epoch} ({origin}) has no source offset")
                    offset = before.offset
                rows = rows_between(self.versions, before.offset, offset)
                model[epoch] = apply_batch(before, rows, epoch, offset)
            previous = epoch
        self.memo[root] = model
        return epochs, model

    def _restored(
        self,
        root: Path,
        plan: RootPlan,
        epoch: int,
        entry: dict[str, Any],
        model: dict[int, Expected],
    ) -> Expected:
        origin = entry.get("origin") or ""
        source = entry.get("restored_from")
        if epoch in plan.edits:
            edit = plan.edits[epoch]
            base = model[edit.base]
            state = dict(base.state)
            if edit.word in state:  # the edit bumps a present word only
                state[edit.word] += edit.delta
            previous = model.get(int(source), base) if source is not None else base
            return Expected(state, previous.sink, previous.offset, base.gone, epoch + 1)
        if origin.startswith("rollback") and source in model:
            back = model[source]
            return Expected(back.state, back.sink, back.offset, back.gone, epoch + 1)
        if plan.parent is not None and epoch == plan.parent[1] and not model:
            parent_root, target = plan.parent
            _, parent_model = self.root(parent_root)
            copied = parent_model[target]
            return Expected(dict(copied.state), Counter(), copied.offset, copied.gone, epoch + 1)
        self.problems.append(f"{root} epoch {epoch}: unexplained RESTORED epoch ({origin})")
        return Expected({}, Counter(), (0, 0), frozenset())


def read_table(path: Path, version: int) -> pa.Table:
    """A Delta table as of a version."""
    return DeltaTable(str(path), version=version).to_pyarrow_table()


def state_as_of(changes: pa.Table, epoch: int) -> tuple[dict[str, int], int]:
    """Latest change per word with ``_epoch <= epoch``, without tombstones; and how many
    keys changed twice in their latest epoch."""
    latest: dict[str, tuple[int, bool, int]] = {}
    twice = 0
    for row in changes.select(["word", "count", "_epoch", "_deleted"]).to_pylist():
        if row["_epoch"] > epoch:
            continue
        seen = latest.get(row["word"])
        if seen is not None and seen[0] == row["_epoch"]:
            twice += 1
        if seen is None or row["_epoch"] >= seen[0]:
            latest[row["word"]] = (row["_epoch"], bool(row["_deleted"]), row["count"])
    return {w: c for w, (_, deleted, c) in latest.items() if not deleted}, twice


def check_root(model: Model, root: Path) -> tuple[Counter[str], list[str]]:
    """Compare every retained snapshot of ``root`` with the model."""
    counts: Counter[str] = Counter()
    notes: list[str] = []
    try:
        epochs, expected = model.root(root)
    except Exception as err:
        counts["unreadable_roots"] += 1
        return counts, [f"{root}: unreadable: {err!r}"]
    plan = model.plans[root]
    for epoch, entry in sorted(epochs.items()):
        if not entry["retained"]:
            continue
        try:
            more = check_snapshot(expected[epoch], root, epoch, entry, plan, counts)
        except Exception as err:
            counts["unreadable_snapshots"] += 1
            more = [f"{root.name} epoch {epoch}: unreadable: {err!r}"]
        notes += more
    return counts, notes


def check_snapshot(
    want: Expected,
    root: Path,
    epoch: int,
    entry: dict[str, Any],
    plan: RootPlan,
    counts: Counter[str],
) -> list[str]:
    """Compare one retained snapshot's state and sink with the model."""
    notes: list[str] = []
    versions = entry["table_versions"]
    if STATE_TABLE in versions:
        got, twice = state_as_of(read_table(root / STATE_TABLE, versions[STATE_TABLE]), epoch)
        counts["mismatches"] += twice
        if twice:
            notes.append(f"{root.name} epoch {epoch}: {twice} keys changed twice in one epoch")
        for word in sorted(set(got) | set(want.state)):
            if got.get(word) == want.state.get(word):
                continue
            kind = "resurrected" if word in want.gone and word not in want.state else "mismatches"
            counts[kind] += 1
            notes.append(
                f"{root.name} epoch {epoch}: {kind} {word}: state {got.get(word)}, "
                f"model {want.state.get(word)}"
            )
    if SINK_TABLE in versions:
        table = read_table(plan.sink, versions[SINK_TABLE])
        rows = zip(*(table[c].to_pylist() for c in ("word", "count", "batch")), strict=True)
        actual: Counter[SinkRow] = Counter(rows)
        lost, extra = want.sink - actual, actual - want.sink
        counts["lost"] += lost.total()
        counts["duplicated"] += sum(n for r, n in extra.items() if want.sink[r])
        counts["mismatches"] += sum(n for r, n in extra.items() if not want.sink[r])
        if lost or extra:
            notes.append(
                f"{root.name} epoch {epoch}: sink lost {sorted(lost)[:5]} extra {sorted(extra)[:5]}"
            )
    return notes


# ---------------------------------------------------------------------------------------
# Children: one pipeline run or one write_state, in their own process (pyspark_abs here).


def child_main() -> int:
    """Start Spark, then run the operation read from standard input (its argument list as
    one JSON line); print one JSON line; exit FENCED_EXIT on a FencingError.

    The schedule starts each child before it needs it, so that the Spark start, and a first
    pipeline run on a scratch root (Spark's first query in a session plans, compiles and
    starts Python workers: 15 s of a 25 s run), overlap the operation before.
    """
    from pyspark_abs import local_session
    from pyspark_abs.errors import FencingError

    local_session("nemesis")
    with tempfile.TemporaryDirectory(prefix="pyspark-abs-nemesis-warm-up-") as scratch:
        _warm_up(Path(scratch))
    argv = json.loads(sys.stdin.readline())
    print(f"operation: {' '.join(argv)}", flush=True)
    parser = argparse.ArgumentParser(prog="nemesis.py child")
    parser.add_argument("what", choices=["run", "write_state"])
    parser.add_argument("--bronze", required=True)
    parser.add_argument("--root", required=True)
    parser.add_argument("--sink", required=True)
    parser.add_argument("--commit-mode", default="async")
    parser.add_argument("--key-groups", type=int, default=4)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--compact-every", type=int, default=0)
    parser.add_argument("--change-share", type=float, default=0.25)
    parser.add_argument("--pause", help="STEP:EPOCH to stop (SIGSTOP) at")
    parser.add_argument("--word", help="write_state: the word to bump")
    parser.add_argument("--delta", type=int, default=0)
    args = parser.parse_args(argv)
    spark = local_session("nemesis", shuffle_partitions=args.partitions)
    if spark.conf.get("spark.sql.shuffle.partitions") != str(args.partitions):
        raise RuntimeError(f"the session did not take {args.partitions} shuffle partitions")
    try:
        result = _child_run(args) if args.what == "run" else _child_write_state(args, spark)
    except FencingError as err:
        print(json.dumps({"fenced": str(err)}), flush=True)
        return FENCED_EXIT
    except Exception as err:
        traceback.print_exc()
        print(json.dumps({"error": repr(err)}), flush=True)
        return 1
    print(json.dumps(result), flush=True)
    return 0


def _operator() -> Any:
    import pandas as pd

    from pyspark_abs import KeyGroupResult, vectorized_operator

    def nemesis_count(rows: pd.DataFrame, state: pd.DataFrame, ctx: Any) -> KeyGroupResult:
        flags = rows.assign(add=~rows["reset"].astype(bool), reset=rows["reset"].astype(bool))
        seen = flags.groupby("word", sort=False).agg(seen=("add", "sum"), reset=("reset", "max"))
        merged = seen.reset_index().merge(state[["word", "count"]], on="word", how="left")
        merged["count"] = merged["count"].fillna(0).astype("int64") + merged["seen"].astype("int64")
        merged.loc[merged["reset"], "count"] = 0
        kept = merged.loc[~merged["reset"], ["word", "count"]]
        removed = merged.loc[merged["reset"], ["word"]]
        # ctx.epoch is Spark's micro-batch id: the epoch minus the epoch of micro-batch 0 of
        # the checkpoint (not 0 after a rollback, restore or write_state).
        output = merged[["word", "count"]].assign(batch=int(ctx.epoch))
        return KeyGroupResult(state=kept, removed=removed, output=output)

    return vectorized_operator(
        key="word",
        state_schema="count long",
        output_schema="word string, count long, batch long",
    )(nemesis_count)


def _warm_up(scratch: Path) -> None:
    """Run the pipeline once over a few rows, on a root of its own."""
    from pyspark_abs import DeltaSink, DeltaSource, Pipeline

    bronze = scratch / "bronze"
    write_deltalake(
        str(bronze), pa.table({"word": ["w0", "w1", "w0"], "reset": [False, False, True]})
    )
    Pipeline(
        PIPELINE,
        DeltaSource(str(bronze)),
        _operator(),
        root=str(scratch / "root"),
        sinks={"output": DeltaSink(str(scratch / "sink"))},
    ).run()


def _child_run(args: argparse.Namespace) -> dict[str, Any]:
    from pyspark_abs import AbsConfig, DeltaSink, DeltaSource, Pipeline
    from pyspark_abs.examples.wordcount import parse_pause

    faults = (parse_pause(args.pause),) if args.pause else ()
    config = AbsConfig(
        commit_mode=args.commit_mode,
        key_groups=args.key_groups,
        compaction_every_epochs=args.compact_every,
        local_state_change_share=args.change_share,
        faults=faults,
    )
    query = Pipeline(
        PIPELINE,
        DeltaSource(args.bronze, max_rows_per_trigger=ROWS_PER_TRIGGER),
        _operator(),
        root=args.root,
        sinks={"output": DeltaSink(args.sink)},
        config=config,
    ).run()
    return {"recovered": list(query.recovered_epochs)}


def _child_write_state(args: argparse.Namespace, spark: Any) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from pyspark_abs import AbsConfig, EpochStatus, Snapshots, write_state

    snapshots = Snapshots(args.root, spark)
    statuses = (EpochStatus.COMMITTED, EpochStatus.RESTORED)
    base = [i for i in snapshots.list() if i.status in statuses][-1].epoch
    state = snapshots.state(OPERATOR, base)
    bump = F.when(F.col("word") == args.word, F.col("count") + args.delta).otherwise(F.col("count"))
    edited = state.select("word", bump.cast("long").alias("count"))
    info = write_state(edited, args.root, _operator(), config=AbsConfig(key_groups=args.key_groups))
    return {"base": base, "epoch": info.epoch}


# ---------------------------------------------------------------------------------------
# The schedule.


@dataclass
class Child:
    """A child process and its log."""

    process: subprocess.Popen[bytes]
    log: Path
    started: float = 0.0

    def order(self, command: Sequence[str]) -> None:
        """Give the child its operation; its time limit starts now."""
        assert self.process.stdin is not None
        self.process.stdin.write((json.dumps(list(command)) + "\n").encode())
        self.process.stdin.close()
        self.started = time.monotonic()

    def wait(self, timeout: float = CHILD_TIMEOUT_S) -> tuple[int, dict[str, Any]]:
        """Wait for it (killing it after ``timeout``); its exit status and last JSON line."""
        try:
            self.process.wait(timeout=max(1.0, timeout - (time.monotonic() - self.started)))
        except subprocess.TimeoutExpired:
            signal_group(self.process.pid, signal.SIGKILL)
            self.process.wait()
        signal_group(self.process.pid, signal.SIGKILL)  # what a finished driver left behind
        return self.process.returncode, last_json(self.log)


def start_child(script: Path, log: Path, *args: str) -> Child:
    """A child process of ``script`` (``script child ARGS``), in a session of its own."""
    log_config = REPO / "conf" / "log4j2.properties"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "JDK_JAVA_OPTIONS": f"-Dlog4j2.configurationFile={log_config}",
    }
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, str(script), "child", *args],
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    return Child(process, log)


def beside(
    wait: Callable[[], object],
    loops: Mapping[str, Callable[[random.Random], None]],
    rng: random.Random,
    error: Callable[[str], None],
) -> Counter[str]:
    """Call ``wait`` while each loop repeats in a thread of its own (0.2 to 2 s apart).

    Returns how often each loop ran without an error; ``error`` gets each failure.
    """
    stop = threading.Event()
    done: Counter[str] = Counter()

    def repeat(name: str, own: random.Random) -> None:
        while not stop.is_set():
            time.sleep(own.uniform(0.2, 2.0))
            try:
                loops[name](own)
                done[name] += 1
            except Exception as err:
                error(f"{name} beside a run failed: {err!r}")

    threads = [
        threading.Thread(target=repeat, args=(name, random.Random(rng.random()))) for name in loops
    ]
    for thread in threads:
        thread.start()
    try:
        wait()
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    return done


def schedule_arguments(
    argv: Sequence[str] | None, description: str, weights: Mapping[str, int], prefix: str
) -> tuple[argparse.Namespace, list[str], Path]:
    """A schedule's command line: the arguments, the kinds to draw and a new working dir."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--ops", type=int, required=True, help="operations in the schedule")
    parser.add_argument("--seed", type=int, required=True, help="random seed")
    parser.add_argument("--root", type=Path, help="a new working directory (default: temp)")
    parser.add_argument(
        "--kinds", default=",".join(weights), help=f"operations to draw from ({', '.join(weights)})"
    )
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = set(kinds) - set(weights)
    if unknown or not kinds:
        parser.error(f"--kinds: unknown {sorted(unknown)}; choose from {', '.join(weights)}")
    workdir = (args.root or Path(tempfile.mkdtemp(prefix=prefix))).resolve()
    if workdir.exists() and any(workdir.iterdir()):
        parser.error(f"--root {workdir} is not empty; give the nemesis a new directory")
    return args, kinds, workdir


def last_json(log: Path) -> dict[str, Any]:
    """The last JSON object a child printed, or {}."""
    for line in reversed(log.read_text(errors="replace").splitlines()):
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
    return {}


def wait_stop(child: Child, limit: float) -> str:
    """Wait up to ``limit`` seconds for the child to stop itself (``stopped``) or to end
    (``exited``, reaped: its ``returncode`` is set); else ``timeout``."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        pid, status = os.waitpid(child.process.pid, os.WUNTRACED | os.WNOHANG)
        if pid == 0:
            time.sleep(0.05)
        elif os.WIFSTOPPED(status):
            return "stopped"
        else:
            child.process.returncode = os.waitstatus_to_exitcode(status)
            return "exited"
    return "timeout"


def kill(
    child: Child, kind: str, limit: float, rng: random.Random, error: Callable[[str], None]
) -> str:
    """SIGKILL a run: after ``limit`` s (``timer``), exactly at the protocol step it paused
    at (``at_step``), or a moment after it (``after_step``). Returns the outcome: killed, or
    finished before the kill (an exit status other than 0 goes to ``error``)."""
    how = wait_stop(child, limit)
    if how == "exited":
        code, result = child.wait()
        if code != 0:
            error(f"kill run exited {code} before its kill: {result}, see {child.log}")
        return f"{kind}:finished_first"
    if how == "stopped" and kind == "after_step":
        signal_group(child.process.pid, signal.SIGCONT)
        time.sleep(rng.uniform(0.0, 0.6))
    signal_group(child.process.pid, signal.SIGKILL)
    child.wait()
    return f"{kind}:killed"


def signal_group(pid: int, sig: signal.Signals) -> None:
    """Signal a child's process group (its Python driver and Spark's JVM)."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        return


class Harness:
    """What both nemeses share: the schedule's random streams, children started one ahead
    (each a Spark driver given its operation later), and the tallies of the report."""

    script: Path
    """The harness's own script, which its children run."""
    count_names: tuple[str, ...]
    """The counts of the report, each zero in a sound run."""
    child_timeout_s: float
    """How long a child's operation may take before it is killed."""

    def __init__(self, workdir: Path, seed: int, kinds: Sequence[str]) -> None:
        self.workdir = workdir
        self.schedule = random.Random(seed)  # the kinds alone: a seed's schedule is its own
        self.rng = random.Random(seed + 1_000_003)
        self.kinds = list(kinds)
        self.logs = workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.ops: Counter[str] = Counter()
        self.outcomes: Counter[str] = Counter()
        self.counts: Counter[str] = Counter()
        self.failures: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.children = 0
        self.ahead: Child | None = None

    def start_child(self, *args: str) -> Child:
        """A child process starting Spark, to be given its operation later."""
        self.children += 1
        return start_child(self.script, self.logs / f"{self.children:04d}.log", *args)

    def give(self, command: Sequence[str], *args: str) -> Child:
        """Give ``command`` to the child started ahead and start the next one; a child that
        needs other ``args`` is started for the command alone."""
        if args:
            child = self.start_child(*args)
        else:
            child = self.ahead or self.start_child()
            self.ahead = self.start_child()
        child.order(command)
        return child

    def close(self) -> None:
        """Stop the child started ahead."""
        if self.ahead is not None:
            signal_group(self.ahead.process.pid, signal.SIGKILL)
            self.ahead.process.wait()
            self.ahead = None

    def expect_ok(self, child: Child, what: str) -> dict[str, Any]:
        """The child's result; an error of the run if it did not exit 0."""
        code, result = child.wait(self.child_timeout_s)
        if code != 0:
            self.error(f"{what} exited {code}: {result or 'no result'}, see {child.log}")
        return result

    def error(self, message: str) -> None:
        """Record an error of the run, and show it at once."""
        self.errors.append(message)
        print(f"  ERROR {message}", file=sys.stderr)

    @classmethod
    def run_schedule(cls, workdir: Path, seed: int, kinds: Sequence[str], ops: int) -> Self:
        """Run ``ops`` operations of a seed's schedule in ``workdir``; the harness, for its
        report."""
        harness = cls(workdir, seed, kinds)
        try:
            harness.run(ops)
        finally:
            harness.close()
        return harness

    def run(self, ops: int) -> None:
        """Run ``ops`` operations of the schedule, checking after each."""
        raise NotImplementedError

    def report(self, seed: int, wall_s: float) -> dict[str, Any]:
        """The JSON report of a run (see :meth:`tallies`)."""
        raise NotImplementedError

    @classmethod
    def main(
        cls, argv: Sequence[str] | None, doc: str | None, weights: Mapping[str, int], prefix: str
    ) -> dict[str, Any]:
        """Run a schedule; print progress to stderr and the JSON report as the last stdout
        line."""
        description = (doc or "").splitlines()[0]
        args, kinds, workdir = schedule_arguments(argv, description, weights, prefix)
        started = time.monotonic()
        harness = cls.run_schedule(workdir, args.seed, kinds, args.ops)
        report = harness.report(args.seed, time.monotonic() - started)
        print(f"workdir: {workdir}", file=sys.stderr)
        print(json.dumps(report), flush=True)
        return report

    @classmethod
    def sound(cls, report: Mapping[str, Any]) -> bool:
        """Whether every count of the report is zero."""
        return not any(report[name] for name in cls.count_names)

    def tallies(self, seed: int, wall_s: float, **figures: Any) -> dict[str, Any]:
        """The report: the seed, the operations and their outcomes, ``figures``, the counts
        of :attr:`count_names` (errors among them), the first failures and the wall time."""
        counts = dict(self.counts)
        counts["errors"] = len(self.errors)
        return {
            "seed": seed,
            "ops": dict(sorted(self.ops.items())),
            "outcomes": dict(sorted(self.outcomes.items())),
            **figures,
            **{name: counts.get(name, 0) for name in self.count_names},
            "failures": self.failures[:20],
            "error_messages": self.errors[:20],
            "wall_s": round(wall_s, 1),
        }


class Nemesis(Harness):
    """Runs the schedule and checks after every step."""

    script = SCRIPT
    count_names = COUNTS
    child_timeout_s = CHILD_TIMEOUT_S

    def __init__(self, workdir: Path, seed: int, kinds: Sequence[str]) -> None:
        super().__init__(workdir, seed, kinds)
        self.bronze = workdir / "bronze"
        first = workdir / "root-0"
        self.plans: dict[Path, RootPlan] = {first: RootPlan(first, first / "sinks" / "counts")}
        self.current = first
        self.inputs: dict[int, list[Row]] = {}
        self.appended = 0
        self.checked: dict[Path, tuple[dict[str, int | str], Counter[str], list[str]]] = {}

    # -- input and children

    def append_input(self) -> None:
        """Append one batch of words (some of them resets) to the bronze table."""
        rows = self.rng.randint(8, 40)
        words = [f"w{self.rng.randrange(VOCABULARY)}" for _ in range(rows)]
        resets = [self.rng.random() < 0.06 for _ in range(rows)]
        table = pa.table({"word": pa.array(words, pa.string()), "reset": pa.array(resets)})
        write_deltalake(str(self.bronze), table, mode="append")
        self.appended += rows

    def spawn(self, what: str, root: Path, *extra: str) -> Child:
        """Start a child operation on ``root`` (in the child started ahead), and start the
        next child."""
        plan = self.plans[root]
        command = [what, "--bronze", str(self.bronze), "--root", str(root)]
        command += ["--sink", str(plan.sink), "--key-groups", str(plan.key_groups)]
        command += ["--partitions", str(plan.partitions), *extra]
        return self.give(command)

    def run_args(self, root: Path) -> list[str]:
        """A random commit mode and change-file share (1000: every small key group goes on
        chains of change files); a new partition and key-group count on a fresh checkpoint."""
        plan = self.plans[root]
        if plan.fresh:
            plan.key_groups = self.rng.choice((2, 3, 4, 8))
            plan.partitions = self.rng.choice((1, 2, 3))
            plan.fresh = False
        extra = ["--commit-mode", self.rng.choice(("sync", "async"))]
        extra += ["--change-share", self.rng.choice(("0", "0.25", "1000"))]
        if self.rng.random() < 0.3:
            extra += ["--compact-every", "1"]
        return extra

    def next_epoch(self, root: Path) -> int:
        """One more than the newest epoch in the manifest (0 for a new root)."""
        try:
            epochs = DeltaTable(str(root / "_manifest")).to_pyarrow_table(columns=["epoch"])
        except Exception:
            return 0
        numbers = [int(e) for e in epochs["epoch"].to_pylist() if e is not None]
        return max(numbers, default=-1) + 1

    def retained(self, root: Path) -> list[int]:
        """The root's retained snapshots."""
        try:
            return sorted(e for e, entry in manifest_epochs(root).items() if entry["retained"])
        except Exception:
            return []

    def pause_at(self, root: Path) -> str:
        return f"{self.rng.choice(DRIVER_STEPS)}:{self.next_epoch(root) + self.rng.randint(0, 1)}"

    # -- operations

    def op_run(self) -> str:
        self.expect_ok(self.spawn("run", self.current, *self.run_args(self.current)), "run")
        return "finished"

    def op_kill(self) -> str:
        kind = self.rng.choice(("timer", "at_step", "after_step"))
        extra = self.run_args(self.current)
        if kind != "timer":
            extra += ["--pause", self.pause_at(self.current)]
        child = self.spawn("run", self.current, *extra)
        limit = self.rng.uniform(1.0, 10.0) if kind == "timer" else CHILD_TIMEOUT_S
        return kill(child, kind, limit, self.rng, self.error)

    def op_rollback(self) -> str:
        from pyspark_abs import rollback

        retained = self.retained(self.current)
        if not retained:
            return "skipped"
        target = self.rng.choice(retained)
        try:
            info = rollback(str(self.current), target)
        except Exception as err:
            self.error(f"rollback to {target} failed: {err!r}")
            return "failed"
        self.plans[self.current].fresh = True
        print(f"  rollback to {target}: epoch {info.epoch}", file=sys.stderr)
        return "done"

    def op_restore(self) -> str:
        from pyspark_abs import restore

        retained = self.retained(self.current)
        if not retained:
            return "skipped"
        target = self.rng.choice(retained)
        into = self.workdir / f"root-{len(self.plans)}"
        plan = RootPlan(into, into / "sinks" / "counts", parent=(self.current, target))
        try:
            restore(str(self.current), target, into=str(into))
        except Exception as err:
            self.error(f"restore of {target} into {into.name} failed: {err!r}")
            return "failed"
        self.plans[into] = plan
        print(f"  restore {self.current.name} epoch {target} into {into.name}", file=sys.stderr)
        self.current = into
        return "done"

    def op_write_state(self) -> str:
        retained = self.retained(self.current)
        if not retained:
            return "skipped"
        plan = self.plans[self.current]
        word, delta = f"w{self.rng.randrange(VOCABULARY)}", self.rng.randint(1, 100)
        child = self.spawn("write_state", self.current, "--word", word, "--delta", str(delta))
        result = self.expect_ok(child, "write_state")
        if "epoch" not in result:
            return "failed"
        # A word absent from the state is not added: the edit then changes nothing.
        plan.edits[int(result["epoch"])] = Edit(int(result["base"]), word, delta)
        plan.fresh = True
        return "done"

    def op_maintenance(self) -> str:
        from pyspark_abs.upkeep.compaction import compact
        from pyspark_abs.upkeep.retention import vacuum

        root = self.current
        child = self.spawn("run", root, *self.run_args(root))

        def compacting(rng: random.Random) -> None:
            if (root / "_manifest").exists():
                compact(str(root))

        def vacuuming(rng: random.Random) -> None:
            if (root / "_manifest").exists():
                vacuum(str(root), keep_last=rng.randint(2, 4), min_age_seconds=0)

        loops = {"compact": compacting, "vacuum": vacuuming}
        wait = lambda: self.expect_ok(child, "run beside maintenance")  # noqa: E731
        done = beside(wait, loops, self.rng, self.error)
        return f"compact x{done['compact']} vacuum x{done['vacuum']}"

    def op_race(self) -> str:
        root = self.current
        first = self.spawn("run", root, *self.run_args(root))
        time.sleep(self.rng.uniform(0.0, 6.0))
        second = self.spawn("run", root, *self.run_args(root))
        codes = sorted([first.wait()[0], second.wait()[0]])
        if codes == [0, FENCED_EXIT]:
            return "refused"
        if codes == [0, 0]:
            return "sequential"
        self.error(f"race: exit statuses {codes}, see {first.log} and {second.log}")
        return "failed"

    def op_zombie(self) -> str:
        from pyspark_abs.protocol.lease import break_lease

        root = self.current
        extra = [*self.run_args(root), "--pause", self.pause_at(root)]
        zombie = self.spawn("run", root, *extra)
        if wait_stop(zombie, CHILD_TIMEOUT_S) != "stopped":
            code, result = zombie.wait(0.0)
            if code != 0:
                self.error(f"zombie run exited {code} before pausing: {result}")
            return "finished_first"
        signal_group(zombie.process.pid, signal.SIGSTOP)  # its JVM too: a paused driver host
        try:
            break_lease(SnapshotRoot(root))
            self.expect_ok(self.spawn("run", root, *self.run_args(root)), "takeover run")
            before = self.footprint(root)
            signal_group(zombie.process.pid, signal.SIGCONT)
            code, result = zombie.wait(120.0)
        finally:
            signal_group(zombie.process.pid, signal.SIGKILL)
        after = self.footprint(root)
        if after != before:
            self.error(f"zombie (exit {code}) wrote after the takeover: {before} -> {after}")
            return "wrote"
        return "fenced" if code == FENCED_EXIT else f"exit {code}"

    def footprint(self, root: Path) -> dict[str, int | str]:
        """Latest versions of the root's manifest, state table and sink."""
        plan = self.plans[root]
        tables = {"manifest": root / "_manifest", "state": root / STATE_TABLE, "sink": plan.sink}
        versions: dict[str, int | str] = {}
        for name, path in tables.items():
            try:
                versions[name] = DeltaTable(str(path)).version()
            except Exception as err:
                versions[name] = repr(err)
        return versions

    # -- the loop

    def check_one(self, model: Model, root: Path) -> tuple[Counter[str], list[str]]:
        """Check one root against the model, and validate it."""
        from pyspark_abs.upkeep.validation import validate

        try:
            counts, notes = check_root(model, root)
        except Exception as err:
            counts, notes = Counter({"unreadable_roots": 1}), [f"{root.name}: {err!r}"]
        try:
            problems = [str(p) for p in validate(str(root))]
        except Exception as err:
            problems = [f"validate raised {err!r}"]
        counts["validate_problems"] += len(problems)
        return counts, notes + [f"{root.name}: validate: {p}" for p in problems]

    def check(self, step: int, kind: str, full: bool) -> None:
        """Check the roots: every one if ``full``, else the current one and the changed."""
        try:
            model = Model(self.bronze, self.plans, self.inputs)
            self.inputs = model.versions
        except Exception as err:
            self.error(f"the input table cannot be read: {err!r}")
            return
        step_counts: Counter[str] = Counter()
        notes: list[str] = []
        for root in self.plans:
            if not (root / "_manifest").exists():
                continue
            footprint = self.footprint(root)
            known = self.checked.get(root)
            if full or root == self.current or known is None or known[0] != footprint:
                counts, more = self.check_one(model, root)
                self.checked[root] = (footprint, counts, more)
            else:  # a root no operation touched since its last check
                _, counts, more = known
            step_counts.update(counts)
            notes += more
        step_counts["mismatches"] += len(model.problems)
        notes += model.problems
        for name in COUNTS:
            self.counts[name] = max(self.counts[name], step_counts[name])
        if notes:
            self.failures.append({"step": step, "op": kind, "notes": notes[:10]})
            for note in notes[:10]:
                print(f"  CHECK {note}", file=sys.stderr)

    def run(self, ops: int) -> None:
        weights = [WEIGHTS[k] for k in self.kinds]
        last = ""
        for step in range(1, ops + 1):
            kind = self.schedule.choices(self.kinds, weights)[0]
            if kind in ("rollback", "restore", "write_state") and not self.retained(self.current):
                kind = "run"  # no snapshot to go back to or edit yet
            for _ in range(self.rng.randint(1, 2)):
                self.append_input()
            started = time.monotonic()
            outcome = getattr(self, f"op_{kind}")()
            self.ops[kind] += 1
            self.outcomes[f"{kind}:{outcome}"] += 1
            self.check(step, kind, full=step % FULL_CHECK_EVERY == 0 or step == ops)
            print(
                f"step {step}: {kind} on {self.current.name}: {outcome} "
                f"({time.monotonic() - started:.1f} s)",
                file=sys.stderr,
            )
            last = outcome
        if last.endswith("killed"):  # a last clean run recovers the killed one, then a check
            self.expect_ok(self.spawn("run", self.current, *self.run_args(self.current)), "final")
            self.check(ops + 1, "final", full=True)

    def report(self, seed: int, wall_s: float) -> dict[str, Any]:
        epochs = 0
        for root in self.plans:
            try:
                epochs += len(manifest_epochs(root))
            except Exception:
                continue
        return self.tallies(
            seed, wall_s, roots=len(self.plans), epochs=epochs, input_rows=self.appended
        )


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run a schedule (see :meth:`Harness.main`)."""
    return Nemesis.main(argv, __doc__, WEIGHTS, "pyspark-abs-nemesis-")


sound = Nemesis.sound


if __name__ == "__main__":
    if sys.argv[1:] == ["child"]:
        sys.exit(child_main())
    sys.exit(0 if sound(main()) else 1)
