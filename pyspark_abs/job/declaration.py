"""Jobs: pipelines joined by channels, with job-wide snapshots, reads and rollback.

A :class:`Job` is a graph of stages. Each stage is a :class:`~pyspark_abs.Pipeline` with its
own snapshot root; a stage whose source is a :class:`~pyspark_abs.sources.ChannelSource`
reads other stages' sinks one upstream epoch per micro-batch. Every stage therefore
numbers its epochs like the stages it reads, and epoch ``n`` of all stages is one
consistent cut of the job: the job snapshot ``n`` (see :mod:`~pyspark_abs.job_ledger.cut`).

The stages run as concurrent streaming queries in one Spark application. A downstream
stage plans its epoch ``n`` only once every upstream stage has committed ``n``; Spark plans
its next micro-batch only after the stage has PREPARED the current one, which is the
paper's input blocking.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pyspark_abs.config import AbsConfig
from pyspark_abs.errors import (
    ConfigError,
    OperatorDefinitionError,
    SnapshotNotFoundError,
    UncommittableEpochError,
)
from pyspark_abs.job.query import JobQuery
from pyspark_abs.job_actions.decisions import finish
from pyspark_abs.job_actions.rollbacks import restore_job, rollback_job
from pyspark_abs.job_actions.state import migrate_job
from pyspark_abs.job_actions.tags import tag_job
from pyspark_abs.job_ledger.cut import JobSnapshot
from pyspark_abs.job_ledger.links import link_stages
from pyspark_abs.job_ledger.listing import pick, snapshots_of
from pyspark_abs.job_ledger.manifest import JobDecision, JobManifest, JobRecord, open_job, record
from pyspark_abs.pipeline.declaration import Pipeline
from pyspark_abs.sources.channel.source import ChannelSource
from pyspark_abs.storage.root import SnapshotRoot
from pyspark_abs.storage.store import DeltaStore

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


class Job:
    """Several pipelines joined by channels, snapshotted as one consistent cut.

    Example::

        bronze = Pipeline("bronze", FileSource(...), parse, root=..., sinks=...)
        silver = Pipeline("silver", bronze.channel(), dedup, root=..., sinks=...)
        gold = Pipeline("gold", silver.channel(), totals, root=..., sinks=...)
        job = Job("medallion", root="/data/abs/medallion", stages=[bronze, silver, gold])
        job.run()
        job.sink("gold").show()           # as of the newest job snapshot
        job.rollback(3)                    # every stage, channel and sink back to epoch 3

    Args:
        name: The job's name; the job root is bound to it.
        root: The job's root, which holds the job manifest (the stages keep their own
            snapshot roots).
        stages: The pipelines, in any order. A stage may read channels only of stages of
            this job.

    Raises:
        OperatorDefinitionError: A stage is not a Pipeline, two stages share a name or a
            root, a stage reads a channel of a pipeline outside the job, or the channels
            form a cycle.
        ConfigError: A stage has snapshots turned off.
    """

    def __init__(self, name: str, root: str, stages: Sequence[Pipeline]) -> None:
        if not isinstance(name, str) or not name.replace("_", "").replace("-", "").isalnum():
            raise OperatorDefinitionError(
                f"job name {name!r} must be non-empty and use only letters, digits, '_' and '-'"
            )
        strangers = [s for s in stages if not isinstance(s, Pipeline)]
        if not stages or strangers:
            raise OperatorDefinitionError(
                f"job {name!r}: stages must be one or more Pipelines, got "
                f"{[type(s).__name__ for s in strangers] or 'none'}"
            )
        self.name = name
        self.root = SnapshotRoot(root)
        by_name: dict[str, Pipeline] = {}
        roots: dict[SnapshotRoot, str] = {}
        for stage in stages:
            if stage.name in by_name or stage.root in roots:
                raise OperatorDefinitionError(
                    f"job {name!r}: two stages share the name {stage.name!r} or the snapshot "
                    f"root {stage.root}; give every stage its own name and root"
                )
            if not stage.config.snapshots:
                raise ConfigError(
                    f"job {name!r}: stage {stage.name!r} has snapshots off; a job snapshot "
                    f"needs every stage's, so set snapshots=True"
                )
            by_name[stage.name] = stage
            roots[stage.root] = stage.name
        self.upstreams: dict[str, list[str]] = {}
        for stage in stages:
            source = stage.source
            channels = source.channels if isinstance(source, ChannelSource) else ()
            for channel in channels:
                if roots.get(channel.root) != channel.stage:
                    raise OperatorDefinitionError(
                        f"job {name!r}: stage {stage.name!r} reads channel {channel.name!r} "
                        f"of pipeline {channel.stage!r} at {channel.root}, which is not a "
                        f"stage of this job; add that pipeline to the job's stages"
                    )
            self.upstreams[stage.name] = sorted({c.stage for c in channels})
        self.stages = {n: by_name[n] for n in _topological(name, self.upstreams)}

    @property
    def heads(self) -> list[str]:
        """The stages that read no channel: they take their input from outside the job."""
        return [n for n, ups in self.upstreams.items() if not ups]

    def _manifest(self, store: DeltaStore) -> JobManifest:
        """The job manifest: stages recorded and linked, any unfinished decision finished."""
        manifest = open_job(store, self.root, self.name)
        stages = {n: s.root for n, s in self.stages.items()}
        if manifest.stages != stages:
            manifest = record(store, manifest, record=JobRecord.STAGES.value, stages=stages)
        link_stages(self.name, self.root, stages)
        return finish(store, manifest, configs={n: s.config for n, s in self.stages.items()})

    def start(self, *, available_now: bool = False, processing_time: str | None = None) -> JobQuery:
        """Start every stage as its own streaming query, upstream stages first.

        Args:
            available_now: The head stages process what is available now and stop; every
                other stage stops once it has read all that its upstream stages committed.
                :meth:`JobQuery.await_termination` waits for that.
            processing_time: Trigger interval of every stage (default: as fast as
                possible).

        A stage whose operator now declares another state schema has its state migrated
        first, in one job-wide decision: every stage goes back to the newest job snapshot
        as one restore epoch (the migrating stages with their state migrated), so that the
        stages keep one epoch numbering; epochs a stage ran past that snapshot are run again
        (see :func:`~pyspark_abs.check` for what a start will do).

        Raises:
            AbsError: A stage could not start (see :meth:`Pipeline.start`); the stages
                already started are stopped again. A stage whose upstream stages have not
                committed what it reads first starts as soon as they have.
            StateEvolutionError: A stage's evolution does not cover its state's change;
                nothing was changed.
        """
        store = DeltaStore()
        manifest = self._manifest(store)
        migrate_job(store, manifest, {n: s.deployed() for n, s in self.stages.items()})
        return JobQuery(self, available_now=available_now, processing_time=processing_time)

    def run(self) -> JobQuery:
        """Process everything available now through every stage, then stop.

        Returns:
            The finished run.

        Raises:
            AbsError: A stage failed; the others were stopped.
        """
        query = self.start(available_now=True)
        query.await_termination()
        return query

    def snapshots(self) -> list[JobSnapshot]:
        """The job snapshots, oldest first: epochs at which every stage can be read."""
        return snapshots_of({n: s.root for n, s in self.stages.items()})

    def snapshot(self, epoch: int | None = None) -> JobSnapshot:
        """Job snapshot ``epoch``, or the newest.

        Raises:
            SnapshotNotFoundError: It does not exist; the message lists those that do.
        """
        return pick(self.name, self.snapshots(), epoch)

    def _stage(self, stage: str) -> Pipeline:
        if stage not in self.stages:
            raise SnapshotNotFoundError(
                f"job {self.name!r} has no stage {stage!r}; its stages are {list(self.stages)}"
            )
        return self.stages[stage]

    def state(self, stage: str, epoch: int | None = None) -> DataFrame:
        """A stage's operator state as of job snapshot ``epoch`` (default: the newest).

        Raises:
            SnapshotNotFoundError: The stage or the job snapshot does not exist.
        """
        pipeline = self._stage(stage)
        at = self.snapshot(epoch).stages[stage]
        return pipeline.snapshots.state(pipeline.plan.name, at)

    def sink(self, stage: str, output: str | None = None, epoch: int | None = None) -> DataFrame:
        """A stage's sink (a channel, or a final output) as of job snapshot ``epoch``.

        Args:
            stage: The stage.
            output: The output; may be left out when the stage has one sink.
            epoch: The job snapshot (default: the newest).

        Raises:
            SnapshotNotFoundError: The stage or the job snapshot does not exist.
            OperatorDefinitionError: The stage has no sink for ``output``.
        """
        pipeline = self._stage(stage)
        output = pipeline.sink_output(output)
        at = self.snapshot(epoch).stages[stage]
        return pipeline.snapshots.sink(output, at)

    def create_views(self, epoch: int | None = None) -> dict[str, str]:
        """Temporary views of job snapshot ``epoch`` (default: the newest), for SQL.

        Each stage gets ``<stage>_state`` and one view per sink, ``<stage>_<output>``.

        Returns:
            Each view's name, and what it shows.
        """
        snapshot = self.snapshot(epoch)  # listed once for every view
        views: dict[str, str] = {}
        for name, pipeline in self.stages.items():
            at = snapshot.stages[name]
            pipeline.snapshots.state(pipeline.plan.name, at).createOrReplaceTempView(
                f"{name}_state"
            )
            views[f"{name}_state"] = f"state of stage {name!r}"
            for output in pipeline.sinks:
                view = f"{name}_{output}"
                pipeline.snapshots.sink(output, at).createOrReplaceTempView(view)
                views[view] = f"sink {output!r} of stage {name!r}"
        return views

    def tag(self, epoch: int | str, name: str, *, move: bool = False) -> JobSnapshot:
        """Name job snapshot ``epoch``: a job savepoint, kept by every stage's retention.

        ``rollback``, ``restore_from`` and the CLI's ``job-rollback`` and ``job-restore``
        accept the name wherever they take a job snapshot's number.

        Raises:
            ConfigError: ``name`` is not a valid name, or already names another snapshot
                (without ``move``).
            SnapshotNotFoundError: ``epoch`` is not a job snapshot.
        """
        self._manifest(DeltaStore())
        return tag_job(self.root, epoch, name, move=move)

    def rollback(self, epoch: int | str, *, config: AbsConfig | None = None) -> JobDecision:
        """Roll every stage, channel and sink back to job snapshot ``epoch`` (or a name).

        Every stage gets the same restore epoch ``R`` (after every epoch of every stage),
        which installs its snapshot of ``epoch``; the job then continues at ``R + 1``, the
        head stages from their sources' offsets of ``epoch`` and the others from their
        channels. The job manifest records the rollback PREPARED before any stage changes
        and COMMITTED after all have: a crash in between is finished by the next start of
        the job, or by rolling back again. The job must be stopped.

        Raises:
            SnapshotNotFoundError: ``epoch`` is not a job snapshot.
            FencingError: A stage is running.
            ConcurrentWriteError: Another process recorded a rollback at the same moment;
                nothing was changed by this one.
            CommitError: A table could not be restored; the next start or rollback
                finishes the rollback once that is fixed.

        An unfinished job-wide decision is finished first; one that never can be (files it
        needs are gone) is abandoned, and this rollback replaces it. Likewise a stage's
        decided epoch whose files are gone is replaced.
        """
        with contextlib.suppress(UncommittableEpochError):  # the rollback abandons it
            self._manifest(DeltaStore())
        return rollback_job(self.root, epoch, config=config)

    def restore_from(
        self, root: str, epoch: int | str, *, config: AbsConfig | None = None
    ) -> JobDecision:
        """Start this new job from job snapshot ``epoch`` (or a name) of the job at ``root``.

        Every stage's snapshot of ``epoch`` is copied into this job's stage roots (with any
        partition or key-group count), each as restore epoch ``epoch``; the next start
        continues at ``epoch + 1``. Give this job its own roots and sink tables. An
        interrupted restore is finished by running it again or by starting this job.

        Raises:
            SnapshotNotFoundError: ``root`` is not a job root, or ``epoch`` not one of its
                job snapshots.
            PipelineMismatchError: ``root`` holds another job, or this job's root does.
            ConfigError: This job's stages are not the other job's.
            SnapshotRootError: This job's root or a stage root already holds epochs.
        """
        stages = {n: s.root for n, s in self.stages.items()}
        return restore_job(root, epoch, self.root, stages, config=config)


def _topological(job: str, upstreams: dict[str, list[str]]) -> list[str]:
    """The stages with every stage after the stages it reads.

    Raises:
        OperatorDefinitionError: The channels form a cycle.
    """
    order: list[str] = []
    placed: set[str] = set()
    waiting = dict(upstreams)
    while waiting:
        ready = sorted(n for n, ups in waiting.items() if all(u in placed for u in ups))
        if not ready:
            raise OperatorDefinitionError(
                f"job {job!r}: the channels between stages {sorted(waiting)} form a cycle; a "
                f"feedback loop belongs inside one stage, as a BackEdge"
            )
        for name in ready:
            order.append(name)
            placed.add(name)
            del waiting[name]
    return order
