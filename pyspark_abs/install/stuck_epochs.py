"""Pending epochs that can never be committed, which a rollback replaces.

A PREPARED epoch is committed at the latest by recovery. Recovery cannot commit it when
files it needs are gone for good: a file it pre-committed was deleted, or, for a restore
epoch, a VACUUM deleted files of a sink version it goes back to after the decision (say a
rollback crashed, and the nightly maintenance ran before the next start). Such an epoch
fails every start and every recovery.

A rollback replaces those epochs: it records them ABORTED in the same manifest append as
its own PREPARED restore epoch. Nothing of them can have been read as a snapshot, and the
restore epoch rewrites every table they could have touched: it overwrites each state table
and back-edge log, and restores each sink to its version as of the rollback's target
(their commits, being this root's, are rolled back with the rest). A table that already
holds the restore epoch's transaction refuses theirs.

On a job's stage only a job rollback replaces them: a downstream stage may have read a
PREPARED upstream epoch through its channel, and the job rollback takes it back too. When
the stuck epoch is the stage's part of the job's unfinished decision (say a job rollback
crashed, then a VACUUM ran), the job rollback records that decision ABANDONED with its own.
"""

from __future__ import annotations

from pyspark_abs.errors import CommitError, UncommittableEpochError
from pyspark_abs.job_ledger.links import linked_job
from pyspark_abs.job_ledger.listing import snapshots_of
from pyspark_abs.manifest.entries import ManifestEntry
from pyspark_abs.protocol.epoch_writer import EpochWriter
from pyspark_abs.upkeep.validation import missing_for_commit


def unfinishable(writer: EpochWriter) -> str | None:
    """Why the root's pending epochs can never be committed, or None if they can be.

    None also for a root with no pending epoch.
    """
    stuck = _stuck(writer)
    return None if stuck is None else stuck[1]


def recover(writer: EpochWriter) -> list[int]:
    """Commit the root's pending epochs (see :meth:`EpochWriter.recover`); return them.

    Raises:
        UncommittableEpochError: They can never be committed: the message names what is
            gone, and the rollback that replaces them.
        CommitError: A commit failed otherwise; the next start retries it.
    """
    try:
        return writer.recover()
    except CommitError as err:
        stuck = _stuck(writer)
        if stuck is None:
            raise
        entry, reason = stuck
        raise UncommittableEpochError(
            f"{reason}, so no start at snapshot root {writer.root} can commit it ({err}). "
            f"Put the files back from a backup and start again{_way_out(writer, entry)}"
        ) from err


def _stuck(writer: EpochWriter) -> tuple[ManifestEntry, str] | None:
    """The first pending epoch that can never be committed, and why."""
    for entry in writer.epochs.pending():
        reason = missing_for_commit(writer.store, entry, writer.app_id)
        if reason is not None:
            return entry, f"epoch {entry.epoch} can never be committed: {reason}"
    return None


def _way_out(writer: EpochWriter, entry: ManifestEntry) -> str:
    """The rollback that replaces stuck ``entry``, as the end of a message (", or ...")."""
    job = linked_job(writer.store, writer.root)
    if job is None:
        snapshots = writer.epochs.snapshots()
        if not snapshots:
            return ", or start over with a new snapshot root and checkpoint (it has no snapshot)"
        newest = snapshots[-1].epoch
        return (
            f", or roll back to a snapshot, which replaces it: "
            f"pyspark_abs.rollback({writer.root!r}, {newest}) or an earlier epoch"
        )
    decision = job.unfinished
    part = (
        f" (it is this stage's part of the unfinished "
        f"{decision.kind.value.lower().replace('_', ' ')} of job {job.job!r}, which the job "
        f"rollback abandons)"
        if decision is not None and entry.is_restore and entry.epoch == decision.restore_epoch
        else ""
    )
    cuts = snapshots_of(job.stages)
    if not cuts:
        return f", or start job {job.job!r} over with a new job root (it has no job snapshot)"
    newest = cuts[-1].epoch
    return (
        f", or roll job {job.job!r} back to a job snapshot, which replaces it{part}: "
        f"Job.rollback({newest}) or an earlier one (pyspark-abs job-rollback {job.root} "
        f"{newest})"
    )
