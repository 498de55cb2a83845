"""The ``pyspark-abs`` command: inspect, validate and maintain snapshot roots.

Every command but ``write-state`` and ``check`` works on the Delta tables directly (delta-rs)
and starts no Spark; ``write-state`` starts a local Spark session to read and check the state
it writes, and ``check`` imports a pipeline definition, which builds its own.
Commands that print data take ``--json``. Progress of long operations goes to standard error.
Wherever an EPOCH is asked for, the name of a savepoint (``tag``) works too.

Exit status: 0 on success, 1 when ``validate`` finds problems or ``check`` finds a change a
start would refuse, 3 when ``check`` finds state a start would migrate, 2 on bad input
(unknown root, epoch or operator, invalid arguments) with one line saying what is wrong.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from pyspark_abs.cli.definitions import add_definition_commands
from pyspark_abs.cli.jobs import add_job_commands
from pyspark_abs.cli.output import (
    cell,
    epoch_or_name,
    merged,
    ms,
    or_dash,
    print_json,
    print_table,
    progress,
    rounded,
    size,
)
from pyspark_abs.errors import AbsError
from pyspark_abs.manifest.entries import SNAPSHOT_STATUSES
from pyspark_abs.pipeline.savepoints import restore, rollback
from pyspark_abs.snapshots.reading import Snapshots
from pyspark_abs.storage.root import BACKEDGE_PREFIX, SnapshotRoot
from pyspark_abs.upkeep.compaction import compact
from pyspark_abs.upkeep.retention import vacuum
from pyspark_abs.upkeep.tags import tag, untag
from pyspark_abs.upkeep.validation import validate

EXIT_PROBLEMS = 1
EXIT_USAGE = 2


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        status: int = args.run(args)
        return status
    except AbsError as err:
        print(f"pyspark-abs: error: {err}", file=sys.stderr)
        return EXIT_USAGE


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pyspark-abs", description="Inspect, validate and maintain pyspark-abs snapshot roots."
    )
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    def command(name: str, help_text: str, run: Any, *, json_output: bool = True) -> Any:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("root", metavar="ROOT", type=SnapshotRoot, help="the snapshot root")
        if json_output:
            sub.add_argument("--json", action="store_true", help="print JSON")
        sub.set_defaults(run=run)
        return sub

    command("snapshots", "list the epochs of a snapshot root", _snapshots).add_argument(
        "--all", action="store_true", help="also list aborted epochs"
    )
    command(
        "describe", "show everything the manifest records for an epoch", _describe
    ).add_argument("epoch", metavar="EPOCH", type=epoch_or_name, help=EPOCH_HELP)
    state = command("state", "print an operator's state as of an epoch", _state)
    state.add_argument("operator", metavar="OPERATOR")
    state.add_argument("--epoch", type=epoch_or_name, help=f"{EPOCH_HELP} (default: the newest)")
    state.add_argument("--limit", type=_positive, default=20, help="rows to print (default 20)")
    command("metrics", "print per-epoch snapshot metrics as a table", _metrics).add_argument(
        "--last", type=_positive, help="only the newest N epochs"
    )
    command("validate", "check every retained snapshot; exit 1 if something is broken", _validate)
    command("rollback", "roll the (stopped) pipeline back to an epoch", _rollback).add_argument(
        "epoch", metavar="EPOCH", type=epoch_or_name, help=EPOCH_HELP
    )
    copy = command("restore", "copy a snapshot into a new root, to continue there", _restore)
    copy.add_argument("epoch", metavar="EPOCH", type=epoch_or_name, help=EPOCH_HELP)
    copy.add_argument(
        "--into", required=True, metavar="NEW_ROOT", type=SnapshotRoot, help="the new snapshot root"
    )
    name = command("tag", "name a snapshot: a savepoint that retention keeps", _tag)
    name.add_argument("epoch", metavar="EPOCH", type=epoch_or_name, help=EPOCH_HELP)
    name.add_argument("name", metavar="NAME", help="the savepoint's name (starts with a letter)")
    name.add_argument("--move", action="store_true", help="move NAME if it names another epoch")
    command("untag", "take a savepoint's name away", _untag).add_argument(
        "name", metavar="NAME", help="the savepoint's name"
    )
    add_definition_commands(command)
    add_job_commands(command)
    command("compact", "rewrite each state table's latest row per key", _compact)
    clean = command("vacuum", "apply retention and delete unreferenced files", _vacuum)
    clean.add_argument("--keep-last", type=_positive, help="keep only the newest N snapshots")
    clean.add_argument(
        "--min-age",
        type=float,
        default=3600.0,
        help="seconds a replaced compaction output must be old to go (default 3600)",
    )
    clean.add_argument(
        "--removed-file-retention",
        type=float,
        default=None,
        help="seconds a sink keeps a file after a commit removed it (default: the sink's "
        "delta.deletedFileRetentionDuration, 7 days unless set)",
    )
    clean.add_argument("--dry-run", action="store_true", help="list, do not delete")
    return parser


EPOCH_HELP = "a committed epoch, or the name of a savepoint"


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _snapshots(args: argparse.Namespace) -> int:
    infos = Snapshots(args.root).list(include_aborted=args.all)
    if args.json:
        print_json([i.to_dict() for i in infos])
        return 0
    rows = [
        [
            str(i.epoch),
            i.status.value,
            i.recorded_at.strftime("%Y-%m-%d %H:%M:%S"),
            str(sum(i.rows.values())),
            or_dash(i.state_keys),
            ms(i.batch_ms),
            ms(i.commit_ms),
            ", ".join(x for x in (*(f"savepoint {t!r}" for t in i.tags), i.origin or i.error) if x)
            or merged(i.status, i.snapshot_epoch),
        ]
        for i in infos
    ]
    print_table(["epoch", "status", "recorded", "rows", "keys", "batch", "commit", "note"], rows)
    return 0


def _describe(args: argparse.Namespace) -> int:
    snapshots = Snapshots(args.root)
    info = snapshots.get(args.epoch)
    data = rounded(info.to_dict())
    tables = [t for t in info.table_versions if t.startswith(BACKEDGE_PREFIX)]
    edges = [t.removeprefix(BACKEDGE_PREFIX) for t in tables]
    if info.status in SNAPSHOT_STATUSES and edges:
        data["in_flight"] = {e: snapshots.in_flight_count(e, info.epoch) for e in edges}
    if args.json:
        print_json(data)
        return 0
    for name, value in data.items():
        if value in (None, {}, "", []):
            continue
        if isinstance(value, dict):
            print(f"{name}:")
            for key, item in value.items():
                print(f"  {key}: {item}")
        else:
            print(f"{name}: {value}")
    return 0


def _metrics(args: argparse.Namespace) -> int:
    table = Snapshots(args.root).metrics_table(include_aborted=True)
    if args.last:
        table = table.slice(max(table.num_rows - args.last, 0))
    rows = table.to_pylist()
    if args.json:
        print_json(rounded(rows))
        return 0
    timings = ("batch_ms", "precommit_ms", "align_wait_ms", "align_ms", "prepare_ms", "commit_ms")
    header = ["epoch", "status", "rows", "bytes", "keys", "batch", "pre-commit", "align wait"]
    print_table(
        [*header, "align", "prepare", "commit", "pending"],
        [
            [
                str(r["epoch"]),
                r["status"],
                str(r["rows"]),
                size(r["bytes"]),
                or_dash(r["state_keys"]),
                *(ms(r[t]) for t in timings),
                or_dash(r["pending_epochs"]),
            ]
            for r in rows
        ],
    )
    return 0


def _state(args: argparse.Namespace) -> int:
    table = Snapshots(args.root).state_table(args.operator, args.epoch)
    rows = table.slice(0, args.limit).to_pylist()
    if args.json:
        print_json(rows)
        return 0
    print_table(table.column_names, [[cell(r[c]) for c in table.column_names] for r in rows])
    if table.num_rows > args.limit:
        print(f"({table.num_rows} keys, {args.limit} shown)")
    return 0


def _tag(args: argparse.Namespace) -> int:
    info = tag(args.root, args.epoch, args.name, move=args.move)
    if args.json:
        print_json(info.to_dict())
    else:
        print(f"epoch {info.epoch} is savepoint {args.name!r}; retention keeps it while named")
    return 0


def _untag(args: argparse.Namespace) -> int:
    epoch = untag(args.root, args.name)
    if args.json:
        print_json({"epoch": epoch, "untagged": args.name})
    else:
        print(f"epoch {epoch} is no longer savepoint {args.name!r}")
    return 0


def _validate(args: argparse.Namespace) -> int:
    problems = validate(args.root, progress=progress)
    if args.json:
        print_json({"ok": not problems, "problems": [asdict(p) for p in problems]})
    elif problems:
        print(f"{len(problems)} problem(s) in {args.root}:")
        for problem in problems:
            print(f"  {problem}")
    else:
        print(f"{args.root}: every retained snapshot is intact")
    return EXIT_PROBLEMS if problems else 0


def _rollback(args: argparse.Namespace) -> int:
    info = rollback(args.root, args.epoch)
    if args.json:
        print_json(info.to_dict())
    else:
        print(
            f"epoch {info.epoch} RESTORED from epoch {info.restored_from}; the next start "
            f"reprocesses from epoch {info.restored_from}'s source offsets"
        )
    return 0


def _restore(args: argparse.Namespace) -> int:
    info = restore(args.root, args.epoch, args.into)
    if args.json:
        print_json(info.to_dict())
    else:
        print(
            f"epoch {info.epoch} of {args.into} RESTORED from epoch {info.restored_from} of "
            f"{args.root}; start the pipeline on {args.into} with its own sinks: it continues "
            f"from that snapshot's state and source offsets"
        )
    return 0


def _compact(args: argparse.Namespace) -> int:
    results = compact(args.root, progress=progress)
    if args.json:
        print_json([asdict(r) for r in results])
        return 0
    for r in results:
        if r.skipped is not None:
            print(f"{r.table}: nothing committed as of epoch {r.as_of_epoch}: {r.skipped}")
        elif r.table.startswith(BACKEDGE_PREFIX):
            print(
                f"{r.table}: removed {r.rows_before} consumed records in {r.files_before} files "
                f"as of epoch {r.as_of_epoch}"
                + (f" (version {r.version})" if r.version is not None else "")
            )
        elif r.version is None:
            print(f"{r.table}: already compact ({r.rows_after} keys)")
        else:
            print(
                f"{r.table}: {r.rows_before} rows in {r.files_before} files -> {r.rows_after} "
                f"keys as of epoch {r.as_of_epoch} (version {r.version})"
            )
    return 0


def _vacuum(args: argparse.Namespace) -> int:
    report = vacuum(
        args.root,
        keep_last=args.keep_last,
        min_age_seconds=args.min_age,
        removed_file_retention_seconds=args.removed_file_retention,
        dry_run=args.dry_run,
        progress=progress,
    )
    if args.json:
        print_json(asdict(report))
        return 0
    expire, delete = ("would expire", "would delete") if report.dry_run else ("expired", "deleted")
    if report.expired:
        print(f"{expire} epochs {report.expired[0]}..{report.expired[-1]}")
    for table, files in report.deleted.items():
        print(f"{table}: {delete} {len(files)} file(s)")
    if not report.deleted:
        print("nothing to delete")
    for table, entries in report.log_removed.items():
        print(f"{table}: removed {len(entries)} Delta log entries before the oldest snapshot")
    if report.kept_in_flight:
        print(f"kept {report.kept_in_flight} unreferenced file(s) that may still be committed")
    return 0
