"""Chaos run: SIGKILL a word-count pipeline at random moments, restart it, check exactly once.

    python scripts/harnesses/chaos.py --kills N --seed S [--input DIR] [--root DIR] [--job]

The example word count (``pyspark_abs.examples.wordcount``, one text file per epoch) runs in
a child process in its own process group, so a kill takes the Python driver and Spark's JVM
down at once (Spark's Python workers exit with the JVM), as a lost machine would. Each run
is killed in one of three ways, chosen with the seeded random generator:

- ``timer``: after a random delay from the start (during Spark's start, recovery, a
  micro-batch, a commit, ...);
- ``at_step``: exactly at a protocol step of an upcoming epoch (after align, after PREPARED,
  between table commits, after COMMITTED), where the child stops itself with a PAUSE fault;
- ``after_step``: at such a step, resumed and killed a random fraction of a second later, so
  the kill lands inside the Delta commits that follow.

Runs alternate randomly between sync and async commit mode. After N kills a last run
finishes the input without faults. The sink table, the operator's state as of every
committed epoch and ``validate`` are then checked against a word count computed directly
from the input; an epoch's files are those up to the file-source offset its manifest entry
records (after some crashes Spark reads two files in one micro-batch). The last line of
standard output is one JSON object (kills, epochs, lost_rows, duplicated_rows,
state_mismatches, validate_problems, ...); the exit status is 0 only if nothing was lost,
duplicated, unread or wrong and validate found nothing.

Without ``--input``, input files are generated next to the root (``<root>-input``) and more
are added whenever the kills have used up most of them. Child logs go to ``<root>-logs``.

With ``--job`` the child is the medallion job instead (``pyspark_abs.examples.medallion``:
four stages joined by channels, generated JSON event files with duplicate events). A run
is killed by the timer, or exits on its own at a protocol step of a random stage
(``--crash STAGE:STEP:EPOCH``, which takes the whole application down). The check compares
every stage's state as of every job snapshot with a model computed from the files that
snapshot read, and validates every stage's root.
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
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pyarrow as pa

from pyspark_abs import EpochStatus, Snapshots
from pyspark_abs.errors import SnapshotNotFoundError
from pyspark_abs.examples import medallion
from pyspark_abs.examples.wordcount import input_files, words_in
from pyspark_abs.faults import EXIT_CODE, FaultStep
from pyspark_abs.job_ledger.listing import job_snapshots_at
from pyspark_abs.manifest.log import EpochLog
from pyspark_abs.manifest.table import manifest_owner, open_manifest
from pyspark_abs.sources.files.offsets import FileOffset
from pyspark_abs.storage.root import SnapshotRoot
from pyspark_abs.storage.store import DeltaStore
from pyspark_abs.upkeep.validation import validate

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from tests.support.jobs import model  # noqa: E402  (the job's model, shared with the tests)

DRIVER_STEPS = [s for s in FaultStep if s is not FaultStep.PRECOMMIT_TASK]
KINDS = ("timer", "at_step", "after_step")
FINAL_ATTEMPTS = 3


@dataclass(frozen=True)
class KillPlan:
    """How one run is killed.

    Attributes:
        kind: ``timer``, ``at_step`` or ``after_step``.
        pause: ``STEP:EPOCH`` where the child stops itself.
        timer_s: For ``timer``, seconds after the start to kill at (unless it pauses first).
        after_s: For ``after_step``, seconds to let the child go on after the pause.
        commit_mode: The run's commit mode.
    """

    kind: str
    pause: str
    timer_s: float | None
    after_s: float
    commit_mode: str


@dataclass(frozen=True)
class RunResult:
    """What happened to one child run.

    Attributes:
        killed: How this script killed it (``timer``, ``at_step``, ``after_step``), or None.
        returncode: Its exit status (negative: the signal that ended it).
        seconds: Wall time of the run.
        log: The file holding its output.
    """

    killed: str | None
    returncode: int
    seconds: float
    log: Path


def generate(directory: Path, first: int, count: int, rng: random.Random) -> None:
    """Write input files ``first`` .. ``first + count - 1`` with increasing mtimes."""
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(first, first + count):
        vocabulary = 10 + 2 * i
        lines = (
            " ".join(f"w{rng.randrange(vocabulary)}" for _ in range(rng.randint(1, 6)))
            for _ in range(rng.randint(5, 30))
        )
        path = directory / f"text-{i:05d}.txt"
        path.write_text("\n".join(lines) + "\n")
        os.utime(path, (1_700_000_000 + 10 * i, 1_700_000_000 + 10 * i))


def next_epoch(root: Path) -> int:
    """The first epoch the manifest has no decision for (0 before the first run)."""
    try:
        infos = Snapshots(str(root)).list(include_aborted=True)
    except SnapshotNotFoundError:
        return 0
    decided = [i.epoch for i in infos if i.status is not EpochStatus.ABORTED]
    return max(decided, default=-1) + 1


def pending_epochs(root: Path) -> list[int]:
    """Epochs left PREPARED: a kill that leaves one stopped the process mid-commit."""
    try:
        infos = Snapshots(str(root)).list(include_aborted=True)
    except SnapshotNotFoundError:
        return []
    return [i.epoch for i in infos if i.status is EpochStatus.PREPARED]


def plan_kill(rng: random.Random, root: Path, typical_s: float) -> KillPlan:
    """A random way to kill the next run of the pipeline at ``root``.

    The pause is at one of the next three epochs, or at an epoch left PREPARED, which the
    run's recovery commits: a kill there is a crash during recovery.
    """
    kind = rng.choice(KINDS)
    step = rng.choice(DRIVER_STEPS)
    epoch = next_epoch(root)
    target = rng.choice([*pending_epochs(root), epoch, epoch + 1, epoch + 2])
    return KillPlan(
        kind=kind,
        pause=f"{step.value}:{target}",
        timer_s=rng.uniform(0.0, 1.2 * typical_s) if kind == "timer" else None,
        after_s=rng.uniform(0.0, 0.6) if kind == "after_step" else 0.0,
        commit_mode=rng.choice(("sync", "async")),
    )


def signal_group(pid: int, sig: signal.Signals) -> None:
    """Send a signal to the child's process group: its Python driver and Spark's JVM."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        return


def run_child(
    input_dir: Path, root: Path, log: Path, commit_mode: str, plan: KillPlan | None
) -> RunResult:
    """Run the word count once; with a plan, kill it as the plan says."""
    command = [sys.executable, "-m", "pyspark_abs.examples.wordcount"]
    command += ["--input", str(input_dir), "--root", str(root), "--key-groups", "8"]
    command += ["--commit-mode", commit_mode]
    if plan is not None:
        command += ["--pause", plan.pause]
    return run_command(command, log, plan)


def run_command(command: list[str], log: Path, plan: KillPlan | None) -> RunResult:
    """Run a child program once; with a plan, kill it as the plan says."""
    log_config = REPO / "conf" / "log4j2.properties"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "JDK_JAVA_OPTIONS": f"-Dlog4j2.configurationFile={log_config}",
    }
    started = time.perf_counter()
    with log.open("w") as out:
        child = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        fired = threading.Event()

        def kill_on_time() -> None:
            fired.set()
            signal_group(child.pid, signal.SIGKILL)

        timer = None
        if plan is not None and plan.timer_s is not None:
            timer = threading.Timer(plan.timer_s, kill_on_time)
            timer.start()
        _, status = os.waitpid(child.pid, os.WUNTRACED)
        if timer is not None:
            timer.cancel()
        how = "timer" if fired.is_set() else None
        if os.WIFSTOPPED(status) and not fired.is_set():
            how = "at_step"
            if plan is not None and plan.after_s:
                how = "after_step"
                signal_group(child.pid, signal.SIGCONT)
                time.sleep(plan.after_s)
            signal_group(child.pid, signal.SIGKILL)
        if os.WIFSTOPPED(status):
            _, status = os.waitpid(child.pid, 0)
        signal_group(child.pid, signal.SIGKILL)  # whatever a finished driver left behind
        child.returncode = os.waitstatus_to_exitcode(status)
    return RunResult(how, child.returncode, time.perf_counter() - started, log)


def expected_counts(
    files: list[Path], read_up_to: list[int]
) -> tuple[list[Counter[str]], Counter[tuple[str, int]]]:
    """Word counts after each epoch, and the sink rows a failure-free run emits.

    Epoch ``e`` reads the files after the previous epoch's up to ``files[read_up_to[e]]``.
    """
    counts: Counter[str] = Counter()
    history = []
    emitted: Counter[tuple[str, int]] = Counter()
    first = 0
    for last in read_up_to:
        words = [w for path in files[first : last + 1] for w in words_in(path)]
        counts.update(words)
        history.append(Counter(counts))
        emitted.update((w, counts[w]) for w in dict.fromkeys(words))
        first = last + 1
    return history, emitted


def last_file_read(root: Path, epochs: list[int]) -> list[int]:
    """For each epoch, the index of the last input file it read.

    Spark's file source logs one file per source batch (``maxFilesPerTrigger=1``, oldest
    first) and records the source batch a micro-batch read up to as its ``logOffset``. That
    is usually the epoch itself, but a crash after the source logged a file and before Spark
    logged the micro-batch's offsets makes the next micro-batch read both files.
    """
    store = DeltaStore()
    location = SnapshotRoot(root)
    manifest = open_manifest(store, location, manifest_owner(store, location) or "")
    read = []
    for epoch in epochs:
        prepared = manifest.prepared(epoch)
        offsets = (prepared.source_offsets if prepared else None) or "{}"
        read.append(int(json.loads(offsets.splitlines()[0]).get("logOffset", -1)))
    return read


def word_counts(table: pa.Table) -> list[tuple[str, int]]:
    """The (word, count) rows of a sink or state table."""
    rows = zip(table["word"].to_pylist(), table["count"].to_pylist(), strict=True)
    return cast(list[tuple[str, int]], list(rows))


def check(root: Path, files: list[Path]) -> dict[str, Any]:
    """Compare the root's sink and state with a direct count of ``files``."""
    snapshots = Snapshots(str(root))
    committed = [i.epoch for i in snapshots.list() if i.status is EpochStatus.COMMITTED]
    read_up_to = last_file_read(root, committed)
    history, emitted = expected_counts(files, read_up_to)
    sink = DeltaStore().read(str(root / "sinks" / "word_counts"))
    actual = Counter(word_counts(sink))
    mismatches = 0
    for epoch, want in zip(committed, history, strict=True):
        got = dict(word_counts(snapshots.state_table("word_count", epoch)))
        mismatches += len([w for w in set(got) | set(want) if got.get(w) != want.get(w)])
    return {
        "files": len(files),
        "epochs": len(committed),
        "missing_epochs": sorted(set(range(max(committed, default=-1) + 1)) - set(committed)),
        "unread_files": len(files) - 1 - max(read_up_to, default=-1),
        "epochs_reading_several_files": sum(
            1 for a, b in zip([-1, *read_up_to], read_up_to, strict=False) if b - a > 1
        ),
        "lost_rows": (emitted - actual).total(),
        "duplicated_rows": (actual - emitted).total(),
        "state_mismatches": mismatches,
        "validate_problems": [str(p) for p in validate(str(root))],
    }


def finish(run: Callable[[Path], RunResult], logs: Path, runs: int, errors: list[str]) -> int:
    """The last runs, without faults, until one finishes; returns the runs counted so far."""
    for attempt in range(FINAL_ATTEMPTS):
        runs += 1
        final = run(logs / f"run-{runs:04d}.log")
        if final.returncode == 0:
            break
        errors.append(f"final run {attempt + 1} exited {final.returncode}, see {final.log}")
    return runs


def chaos(args: argparse.Namespace) -> dict[str, Any]:
    """Kill and restart the pipeline ``args.kills`` times, finish it, and check it."""
    rng = random.Random(args.seed)
    root: Path = args.root
    logs = root.with_name(root.name + "-logs")
    logs.mkdir(parents=True, exist_ok=True)
    input_dir: Path = args.input or root.with_name(root.name + "-input")
    generated = args.input is None
    if generated:
        generate(input_dir, 0, 4, rng)
    started = time.perf_counter()
    kills: Counter[str] = Counter()
    mid_commit = 0
    typical_s = 20.0
    errors: list[str] = []
    runs = 0
    while sum(kills.values()) < args.kills and not errors:
        epoch = next_epoch(root)
        available = len(input_files(str(input_dir)))
        if generated and available < epoch + 4:
            generate(input_dir, available, epoch + 4 - available, rng)
        elif epoch >= available:
            break  # a given input is used up
        plan = plan_kill(rng, root, typical_s)
        runs += 1
        result = run_child(input_dir, root, logs / f"run-{runs:04d}.log", plan.commit_mode, plan)
        if result.killed:
            kills[result.killed] += 1
            mid_commit += bool(pending_epochs(root))
            if result.killed != "timer":
                typical_s = result.seconds
        elif result.returncode != 0:
            errors.append(f"run {runs} exited {result.returncode}, see {result.log}")
        print(
            f"run {runs}: {plan.kind} {plan.pause} {plan.commit_mode} "
            f"{result.killed or f'exit {result.returncode}'} after "
            f"{result.seconds:.1f} s; next epoch {next_epoch(root)}",
            file=sys.stderr,
        )
    runs = finish(lambda log: run_child(input_dir, root, log, "async", None), logs, runs, errors)
    report: dict[str, Any] = {
        "seed": args.seed,
        "kills": sum(kills.values()),
        "kills_by_kind": dict(sorted(kills.items())),
        "kills_leaving_epoch_prepared": mid_commit,
        "runs": runs,
        **check(root, input_files(str(input_dir))),
        "errors": errors,
    }
    report["wall_s"] = round(time.perf_counter() - started, 1)
    return report


def job_chaos(args: argparse.Namespace) -> dict[str, Any]:
    """Kill and restart the medallion job ``args.kills`` times, finish it, and check it."""
    rng = random.Random(args.seed)
    root: Path = args.root
    logs = root.with_name(root.name + "-logs")
    logs.mkdir(parents=True, exist_ok=True)
    input_dir = root.with_name(root.name + "-input")
    landed = 0
    started = time.perf_counter()
    kills: Counter[str] = Counter()
    errors: list[str] = []
    runs = 0
    typical_s = 30.0
    bronze = root / "stages" / "bronze"
    while sum(kills.values()) < args.kills and not errors:
        if landed < next_epoch(bronze) + 3:
            # an id is one event (a retry repeats it whole), so which copy silver keeps in
            # an epoch does not matter
            ids = [
                [rng.randrange(8 * (landed + 1)) for _ in range(rng.randint(0, 6))]
                for _ in range(3)
            ]
            events = [[(f"e{i}", f"u{i % 5}", 1 + i % 9) for i in batch] for batch in ids]
            medallion.write_events(input_dir, events)
            landed += len(events)
        stage = rng.choice(medallion.STAGES)
        plan = plan_kill(rng, root / "stages" / stage, typical_s)
        command = [sys.executable, "-m", "pyspark_abs.examples.medallion", "--input"]
        command += [str(input_dir), "--root", str(root), "--commit-mode", plan.commit_mode]
        if plan.kind != "timer":
            command += ["--crash", f"{stage}:{plan.pause}"]
        runs += 1
        result = run_command(command, logs / f"run-{runs:04d}.log", plan)
        if result.killed or result.returncode == EXIT_CODE:
            kills[result.killed or f"exit_in_{stage}"] += 1
            if not result.killed:
                typical_s = result.seconds
        elif result.returncode != 0:
            errors.append(f"run {runs} exited {result.returncode}, see {result.log}")
        print(
            f"run {runs}: {plan.kind} {stage}:{plan.pause} {plan.commit_mode} "
            f"{result.killed or f'exit {result.returncode}'} after {result.seconds:.1f} s",
            file=sys.stderr,
        )
    command = [sys.executable, "-m", "pyspark_abs.examples.medallion", "--input"]
    command += [str(input_dir), "--root", str(root)]
    runs = finish(lambda log: run_command(command, log, None), logs, runs, errors)
    report: dict[str, Any] = {
        "seed": args.seed,
        "kills": sum(kills.values()),
        "kills_by_kind": dict(sorted(kills.items())),
        "runs": runs,
        **check_job(root, input_dir),
        "errors": errors,
    }
    report["wall_s"] = round(time.perf_counter() - started, 1)
    return report


def check_job(root: Path, input_dir: Path) -> dict[str, Any]:
    """Compare every job snapshot with a model of the files it read; validate every stage."""
    files = sorted(input_dir.glob("events-*.json"))
    events = [
        [
            (e["event_id"], e["user"], e["amount"])
            for e in map(json.loads, f.read_text().splitlines())
        ]
        for f in files
    ]
    stages = {name: root / "stages" / name for name in medallion.STAGES}
    bronze = open_manifest(DeltaStore(), SnapshotRoot(stages["bronze"]), "bronze")
    snapshots = job_snapshots_at(str(root))
    mismatches = 0
    for snapshot in snapshots:
        want = model(events, _files_read(bronze, snapshot.stages["bronze"]) - 1)
        for stage, columns in _STATE_COLUMNS.items():
            table = Snapshots(str(stages[stage])).state_table(
                _OPERATORS[stage], snapshot.stages[stage]
            )
            got = sorted(zip(*(table[c].to_pylist() for c in columns), strict=True))
            mismatches += got != want[stage]
    last_read = _files_read(bronze, snapshots[-1].stages["bronze"]) if snapshots else 0
    return {
        "files": len(files),
        "job_snapshots": len(snapshots),
        "unread_files": len(files) - last_read,
        "state_mismatches": mismatches,
        "validate_problems": [str(p) for s in stages.values() for p in validate(str(s))],
    }


_STATE_COLUMNS = {
    "silver": ("event_id", "user"),
    "gold": ("user", "total", "events"),
    "audit": ("user", "landed", "kept"),
}
_OPERATORS = {"silver": "dedup", "gold": "totals", "audit": "audit"}


def _files_read(bronze: EpochLog, epoch: int) -> int:
    """How many input files the bronze stage had read after ``epoch``."""
    prepared = bronze.prepared(epoch)
    lines = ((prepared.source_offsets if prepared else None) or "").splitlines()
    return FileOffset.parse(json.loads(lines[0])).files if lines else 0


def main() -> int:
    """Run the chaos loop; exit 0 only if the result is exactly once and valid."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, required=True, help="how many runs to kill")
    parser.add_argument("--seed", type=int, required=True, help="random seed")
    parser.add_argument("--input", type=Path, help="text files, one per epoch (default: generated)")
    parser.add_argument("--root", type=Path, help="a new snapshot root (default: a temp dir)")
    parser.add_argument("--job", action="store_true", help="kill the medallion job instead")
    args = parser.parse_args()
    if args.kills < 0:
        parser.error("--kills must be at least 0")
    args.root = (
        args.root or Path(tempfile.mkdtemp(prefix="pyspark-abs-chaos-")) / "root"
    ).resolve()
    if args.root.exists() and any(args.root.iterdir()):
        parser.error(f"--root {args.root} is not empty; give the chaos run a new directory")
    if args.job and args.input:
        parser.error("--job generates its own input; leave out --input")
    report = job_chaos(args) if args.job else chaos(args)
    print(f"root: {args.root}", file=sys.stderr)
    print(json.dumps(report))
    sound = not (
        report.get("lost_rows")
        or report.get("duplicated_rows")
        or report["state_mismatches"]
        or report["validate_problems"]
        or report.get("missing_epochs")
        or report["unread_files"]
        or report["errors"]
    )
    return 0 if sound else 1


if __name__ == "__main__":
    sys.exit(main())
