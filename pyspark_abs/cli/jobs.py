"""The job commands of the ``pyspark-abs`` command line: list, roll back and restore jobs."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from pyspark_abs.cli.output import epoch_or_name, print_json, print_table
from pyspark_abs.job_actions.rollbacks import restore_job, rollback_job
from pyspark_abs.job_actions.tags import tag_job
from pyspark_abs.job_ledger.listing import job_origins, job_snapshots_at, job_stages
from pyspark_abs.job_ledger.manifest import open_job
from pyspark_abs.storage.root import SnapshotRoot
from pyspark_abs.storage.store import DeltaStore


def add_job_commands(command: Callable[..., Any]) -> None:
    """Add the job commands through ``command(name, help, run)``, which adds ROOT and --json."""
    command(
        "job-snapshots",
        "list the job snapshots of a job root (every stage's epoch, and what made it)",
        _job_snapshots,
    )
    command(
        "job-rollback",
        "roll every stage of the (stopped) job back to a job snapshot",
        _job_rollback,
    ).add_argument("epoch", metavar="EPOCH", type=epoch_or_name, help=JOB_EPOCH_HELP)
    copy_job = command(
        "job-restore", "copy a job snapshot into a new job root, to continue there", _job_restore
    )
    copy_job.add_argument("epoch", metavar="EPOCH", type=epoch_or_name, help=JOB_EPOCH_HELP)
    copy_job.add_argument(
        "--into",
        required=True,
        metavar="NEW_ROOT",
        type=SnapshotRoot,
        help="the new job root (stages go under it)",
    )
    name = command(
        "job-tag", "name a job snapshot: a job savepoint that every stage keeps", _job_tag
    )
    name.add_argument("epoch", metavar="EPOCH", type=epoch_or_name, help=JOB_EPOCH_HELP)
    name.add_argument("name", metavar="NAME", help="the savepoint's name (starts with a letter)")
    name.add_argument("--move", action="store_true", help="move NAME if it names another one")


JOB_EPOCH_HELP = "a job snapshot's epoch, or the name of a job savepoint"


def _job_tag(args: argparse.Namespace) -> int:
    snapshot = tag_job(args.root, args.epoch, args.name, move=args.move)
    if args.json:
        print_json({"epoch": snapshot.epoch, "stages": dict(snapshot.stages), "name": args.name})
    else:
        stages = " ".join(f"{stage}={epoch}" for stage, epoch in snapshot.stages.items())
        print(f"job snapshot {snapshot.epoch} ({stages}) is named {args.name!r}")
    return 0


def _job_snapshots(args: argparse.Namespace) -> int:
    found = job_snapshots_at(args.root)
    origins = job_origins(open_job(DeltaStore(), args.root, None).decisions)
    if args.json:
        print_json(
            [
                {"epoch": s.epoch, "stages": dict(s.stages), "origin": origins.get(s.epoch)}
                for s in found
            ]
        )
        return 0
    rows = [
        [
            str(s.epoch),
            " ".join(f"{name}={epoch}" for name, epoch in s.stages.items()),
            origins.get(s.epoch, "-"),
        ]
        for s in found
    ]
    print_table(["epoch", "stage epochs", "origin"], rows)
    return 0


def _job_rollback(args: argparse.Namespace) -> int:
    done = rollback_job(args.root, args.epoch)
    if args.json:
        print_json(
            {
                "epoch": done.epoch,
                "restore_epoch": done.restore_epoch,
                "stage_epochs": dict(done.stage_epochs),
            }
        )
    else:
        print(
            f"job rolled back to epoch {done.epoch}: every stage has restore epoch "
            f"{done.restore_epoch}; the next start continues from epoch {done.restore_epoch + 1}"
        )
    return 0


def _job_restore(args: argparse.Namespace) -> int:
    done = restore_job(args.root, args.epoch, args.into)
    stages = job_stages(args.into)
    if args.json:
        print_json({"epoch": done.epoch, "stages": stages})
    else:
        print(f"job snapshot {done.epoch} copied into {args.into}; its stages' roots are:")
        print_table(["stage", "root"], [[name, root] for name, root in stages.items()])
    return 0
