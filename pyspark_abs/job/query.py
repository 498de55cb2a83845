"""The run handle of a started job: one pipeline query per stage.

A stage on a fresh checkpoint whose upstream stages have not committed the epoch it reads
first cannot start yet (see :class:`~pyspark_abs.errors.UpstreamNotReadyError`). The run
starts it as soon as they have: the handle's starter thread looks every quarter of a
second, so a downstream stage runs alongside its upstream stages instead of after them. A
look is a probe for the next commit of the manifests the waiting stages depend on; only
when one has moved does the starter read them and try the stages again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

from pyspark_abs.errors import AbsError, ConfigError, UpstreamNotReadyError
from pyspark_abs.job_actions.tags import stages_named
from pyspark_abs.job_ledger.cut import JobSnapshot
from pyspark_abs.logs import logger
from pyspark_abs.manifest.log import EpochLog
from pyspark_abs.manifest.table import load_epoch_log
from pyspark_abs.pipeline.declaration import Pipeline
from pyspark_abs.pipeline.launch import first_upstream_epoch
from pyspark_abs.pipeline.query import PipelineQuery
from pyspark_abs.protocol.lineage import read_lineage
from pyspark_abs.protocol.spark_checkpoint import CheckpointReader
from pyspark_abs.sources.channel.log import ManifestFollower
from pyspark_abs.sources.channel.source import ChannelSource
from pyspark_abs.storage.store import DeltaStore
from pyspark_abs.upkeep.tags import check_name


class RunningJob(Protocol):
    """What a job's run reads of its declaration (a :class:`~.declaration.Job`)."""

    name: str
    stages: dict[str, Pipeline]
    upstreams: dict[str, list[str]]

    @property
    def heads(self) -> list[str]:
        """The stages that read no channel."""

    def snapshot(self, epoch: int | None = None) -> JobSnapshot:
        """The job snapshot as of ``epoch`` (None: the newest)."""

    def tag(self, epoch: int | str, name: str, *, move: bool = False) -> JobSnapshot:
        """Name the job snapshot as of ``epoch``."""


log = logger(__name__)

_POLL_SECONDS = 0.25


def _may_start(stage: Pipeline, *, streaming: bool) -> bool:
    """Whether ``stage`` can start now: whether it has an upstream epoch to read, or may wait.

    A look at the manifest and the checkpoint without side effects (the start itself, which
    acquires the stage's lease and recovers its root, checks the same again). A stage with
    epochs left PREPARED after a decided one may start: its start commits them. A stage on a
    fresh checkpoint cannot wait for its first epoch (see
    :class:`~pyspark_abs.errors.UpstreamNotReadyError`). A streaming run starts at once a
    stage that continues its checkpoint: its query waits for the next upstream epoch, so that
    epoch does not wait for the stage's start-up. A run with ``available_now`` starts such a
    stage only once it has an epoch to read, or it would read nothing and end.
    """
    source = stage.source
    if not isinstance(source, ChannelSource):
        return True
    store = DeltaStore()
    uri = stage.root.manifest_uri
    epochs = load_epoch_log(store, uri) if store.exists(uri) else EpochLog()
    decided = epochs.latest_decided()
    if epochs.pending():
        return decided is not None or not source.waiting_for(source.starting_epoch)
    checkpoint = CheckpointReader.for_session(stage.spark, stage.checkpoint)
    try:
        lineage = read_lineage(epochs, checkpoint, stage.root)
    except AbsError:
        return True  # the start raises it, saying what to do
    if lineage.fresh:
        return not source.waiting_for(first_upstream_epoch(source, lineage))
    assert decided is not None  # a checkpoint continues only the root's decided epochs
    return streaming or not source.waiting_for(decided.epoch + 1)


class JobQuery:
    """A running job: every started stage's :class:`~pyspark_abs.PipelineQuery`.

    Attributes:
        job: The job.
        stages: Each started stage's run, upstream stages first.
    """

    def __init__(
        self, job: RunningJob, *, available_now: bool, processing_time: str | None
    ) -> None:
        """Start every stage that can start now; start the others when they can.

        Raises:
            AbsError: A stage could not start; the stages already started are stopped.
        """
        self.job = job
        self.stages: dict[str, PipelineQuery] = {}
        self._available_now = available_now
        self._processing_time = processing_time
        self._pending = list(job.stages)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._failure: BaseException | None = None
        self._starter: threading.Thread | None = None
        self._waiter_lock = threading.Lock()
        self._waiter: threading.Thread | None = None
        self._end_failure: BaseException | None = None
        self._manifests: dict[str, ManifestFollower] = {}
        self._guarded(self._start_ready)
        if self._pending:
            self._starter = threading.Thread(
                target=self._start_later, name=f"pyspark-abs-job-{job.name}", daemon=True
            )
            self._starter.start()

    @property
    def waiting(self) -> list[str]:
        """The stages not started yet: their upstream stages have not committed enough."""
        with self._lock:
            return list(self._pending)

    def _start_ready(self) -> None:
        """Start, upstream stages first, every pending stage that can start now."""
        with self._lock:
            for name in list(self._pending):
                if self._stopping.is_set():
                    return
                head = not self.job.upstreams[name]
                if not head and not _may_start(
                    self.job.stages[name], streaming=not self._available_now
                ):
                    continue
                try:
                    query = self.job.stages[name].start(
                        available_now=self._available_now and head,
                        processing_time=self._processing_time,
                    )
                except UpstreamNotReadyError:
                    continue
                self.stages[name] = query
                self._pending.remove(name)

    def _start_later(self) -> None:
        tried: tuple[int | None, ...] | None = None
        while self.waiting and not self._stopping.wait(_POLL_SECONDS):
            try:
                versions = self._manifest_versions()
                if versions != tried:
                    self._start_ready()
                    tried = versions
            except BaseException as err:
                log.error("job %s: a stage failed to start: %s", self.job.name, err)
                self._failure = err
                return

    def _manifest_versions(self) -> tuple[int | None, ...]:
        """The versions of the manifests the waiting stages' start depends on.

        Their own and their upstream stages' (None for one not written yet), each a look for
        the manifest's next commit file once it has been read.
        """
        stages = self.job.stages
        names = self.waiting
        roots = sorted({stages[u].root for n in names for u in [n, *self.job.upstreams[n]]})
        store = DeltaStore()
        versions: list[int | None] = []
        for root in roots:
            follower = self._manifests.get(root)
            if follower is None:
                follower = self._manifests[root] = ManifestFollower(root)
            epochs = follower.read(store)
            versions.append(None if epochs is None else epochs.version)
        return tuple(versions)

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise self._failure

    def process_all_available(self) -> None:
        """Block until every stage has processed and committed all its input so far.

        Upstream stages first: each is drained (its open group committed) before the
        stages that read it are waited for, so they see all of its epochs. A stage whose
        upstream stages have committed nothing it can read is left waiting.

        Raises:
            AbsError: A stage failed; every stage is stopped.
        """

        def catch_up(name: str) -> None:
            query = self._started(name)
            if query is not None:
                query.process_all_available()
                query.drain()

        self._guarded(lambda: self._each(catch_up))

    @property
    def is_active(self) -> bool:
        """Whether the run goes on: a stage runs, or waits to start and the run is not stopped."""
        if self._failure is not None:
            return False
        if any(query.is_active for query in list(self.stages.values())):
            return True
        return bool(self.waiting) and not self._stopping.is_set()

    def await_termination(self, timeout: float | None = None) -> bool:
        """Wait until the run ends; with ``available_now``, until every stage has read all.

        With ``available_now`` the head stages end on their own, and every other stage is
        stopped once it has read everything its upstream stages committed. Otherwise this
        waits until every stage has ended (one failing stops the others). The waiting goes
        on in a thread of its own, so a call that times out can be repeated.

        Args:
            timeout: Seconds to wait; None waits until the run ends.

        Returns:
            Whether the run has ended.

        Raises:
            AbsError: A stage failed; every stage is stopped.
        """
        with self._waiter_lock:
            if self._waiter is None:
                self._waiter = threading.Thread(
                    target=self._wait_for_end, name=f"pyspark-abs-job-{self.job.name}-end"
                )
                self._waiter.daemon = True
                self._waiter.start()
        try:
            self._waiter.join(timeout)
        except KeyboardInterrupt:
            self.stop()
            raise
        if self._waiter.is_alive():
            return False
        if self._end_failure is not None:
            raise self._end_failure
        return True

    def _wait_for_end(self) -> None:
        try:
            self._run_to_end()
        except BaseException as err:
            self._end_failure = err

    def _run_to_end(self) -> None:
        if self._available_now:

            def finish(name: str) -> None:
                query = self._started(name)
                if query is None:
                    return
                if name in self.job.heads:
                    query.await_termination()
                else:
                    query.process_all_available()
                    query.stop()

            self._guarded(lambda: self._each(finish))
            self._stop_starter()
            return

        def ended() -> None:
            while True:
                self._raise_if_failed()
                running = [q for q in list(self.stages.values()) if q.is_active]
                for query in list(self.stages.values()):
                    if not query.is_active:
                        query.await_termination()  # raises the stage's failure
                if not running and (self._stopping.is_set() or not self.waiting):
                    return  # stopped stages never start the ones still waiting
                for query in running:
                    query.await_termination(1)
                if not running:  # only stages waiting for their upstream stages
                    self._stopping.wait(_POLL_SECONDS)

        self._guarded(ended)

    def stop(self, *, savepoint: str | None = None) -> JobSnapshot | None:
        """Stop every stage, upstream stages first, committing what each has PREPARED.

        Args:
            savepoint: Name the newest job snapshot once every stage has stopped: a job
                savepoint, which every stage's retention keeps and ``Job.rollback``,
                ``Job.restore_from`` and the CLI accept (see :meth:`Job.tag`).

        Returns:
            The named job snapshot, with ``savepoint``; else None.

        Raises:
            ConfigError: ``savepoint`` is not a valid name, or already names another job
                snapshot; checked before anything stops.
            AbsError: A stage failed to stop; the others are stopped first, nothing named.
        """
        if savepoint is not None:
            check_name(savepoint)
            taken = stages_named({n: s.root for n, s in self.job.stages.items()}, savepoint)
            if taken:
                raise ConfigError(
                    f"savepoint {savepoint!r} already names snapshots of stage(s) {taken} of "
                    f"job {self.job.name!r}; untag it there, or give another name"
                )
        self._stop_starter()
        failure: BaseException | None = None
        for query in list(self.stages.values()):
            try:
                query.stop()
            except BaseException as err:  # stop the others before raising
                failure = failure or err
        if failure is not None:
            raise failure
        if savepoint is None:
            return None
        return self.job.tag(self.job.snapshot().epoch, savepoint)

    def _stop_starter(self) -> None:
        self._stopping.set()
        if self._starter is not None:
            self._starter.join()

    def _started(self, name: str) -> PipelineQuery | None:
        """The stage's run, started now if it can; None if it has nothing to read."""
        self._raise_if_failed()
        if name in self.waiting:
            self._start_ready()
        return self.stages.get(name)

    def _each(self, step: Callable[[str], None]) -> None:
        for name in self.job.stages:
            step(name)

    def _guarded(self, step: Callable[[], None]) -> None:
        """Run ``step``; if it fails, stop every stage and raise."""
        try:
            step()
        except BaseException:
            self._stop_starter()
            for query in list(self.stages.values()):
                try:
                    query.stop()
                except BaseException as err:
                    log.warning(
                        "job %s: stopping stage %s: %s", self.job.name, query.pipeline.name, err
                    )
            raise
