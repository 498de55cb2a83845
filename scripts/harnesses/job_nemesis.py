"""Job nemesis: a random schedule against the medallion job, checked against a reference model.

    python scripts/harnesses/job_nemesis.py --ops N --seed S [--root DIR] [--kinds run,kill,...]

The medallion job (``pyspark_abs.examples.medallion``: bronze lands JSON event files, silver
drops event ids it has seen, gold totals each user's amounts, audit reads bronze and silver
together) goes through a seeded random schedule. Every run is a child process in its own
session, so that a kill is a real SIGKILL of the application (children are started while
the operation before runs, so their Spark start is out of the way):

- ``run``: the job with availableNow, or started as streaming queries, caught up and
  stopped (sync or async commit, other key-group and partition counts after a decision,
  sometimes compacting every epoch in the background);
- ``kill``: a run SIGKILLed after a random delay, or exactly at a protocol step of one
  random stage (a PAUSE fault), or a moment after it;
- ``fault``: one stage fails at a protocol step (the job stops every stage);
- ``rollback``: a job rollback to a random job snapshot (refused, as it must be, when it
  would bring back rows a ``delete`` took out of a channel);
- ``crashed_rollback``: a job rollback killed in a stage's install, after its decision;
- ``restore``: a random job snapshot into a new job root, where the schedule continues;
- ``migrate``: silver redeployed with another state schema (a column added), once;
- ``write_state``: silver forgets a few event ids (job-wide written state);
- ``tag``: a stage's savepoint name moved by a process whose clock is minutes off;
- ``maintenance``: a run with ``compact`` and ``vacuum(keep_last)`` looping beside it on
  random stage roots;
- ``delete``: a user's rows deleted from bronze's channel with delta-rs, as a GDPR erasure;
- ``copy``: the job root copied as a directory (``cp -r``), then the copy and the original
  run at once on this host, sharing ``local_state_dir``;
- ``cluster``: a run on ``local-cluster[2,1,1024]`` (two executor processes) that share one
  ``local_state_dir``.

Before every operation new event files land. After every operation each job root is
checked: every retained snapshot of every stage (state and sink) against the model
(``scripts/harnesses/job_model.py``, which reads the input and the manifests with deltalake and
pyarrow only), every job snapshot the job lists is a consistent cut, every stage's names
fold as the schedule gave them, and ``validate`` is clean for every stage root.

The last line of standard output is one JSON object; the exit status is 0 only if lost,
duplicated, resurrected, mismatches, broken cuts, unreadable roots, validate problems and
errors are all zero.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from unittest import mock

from deltalake import DeltaTable
from job_model import STAGES, Delete, Event, JobModel, JobPlan, read_table, read_tags, state_as_of
from nemesis import (
    Child,
    Harness,
    beside,
    kill,
    signal_group,
    wait_stop,
)

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve()
FENCED_EXIT = 3
CHILD_TIMEOUT_S = 300.0
DRIVER_STEPS = ("after_align", "after_prepared", "between_table_commits", "after_committed")
USERS = ("ann", "bob", "cy", "dee", "eve", "fay")
WEIGHTS = {
    "run": 3,
    "kill": 4,
    "fault": 1,
    "rollback": 2,
    "crashed_rollback": 1,
    "restore": 1,
    "migrate": 1,
    "write_state": 1,
    "tag": 2,
    "maintenance": 2,
    "delete": 1,
    "copy": 1,
    "cluster": 1,
}
NEED_SNAPSHOTS = {"rollback", "crashed_rollback", "restore", "write_state", "tag", "copy"}
"""Operations drawn before the job has a job snapshot follow a clean run."""
COUNTS = (
    "lost",
    "duplicated",
    "resurrected",
    "mismatches",
    "broken_cuts",
    "tag_mismatches",
    "unreadable_roots",
    "validate_problems",
    "errors",
)
STATE = {
    "silver": ("state/dedup", ["event_id"], ["user"]),
    "gold": ("state/totals", ["user"], ["total", "events"]),
    "audit": ("state/audit", ["user"], ["landed", "kept"]),
}
SINK = {
    "silver": ["event_id", "user", "amount"],
    "gold": ["user", "total", "events"],
    "audit": ["user", "landed", "kept"],
}

# ---------------------------------------------------------------------------------------
# Children: a job run, a job rollback or a written state, each in its own process.


def child_main(cluster: bool) -> int:
    """Start Spark, then run the operation read from standard input; print one JSON line."""
    from pyspark_abs.errors import FencingError

    spark = _session(cluster)
    with tempfile.TemporaryDirectory(prefix="pyspark-abs-job-nemesis-warm-up-") as scratch:
        _warm_up(spark, Path(scratch))
    argv = json.loads(sys.stdin.readline())
    print(f"operation: {' '.join(argv)}", flush=True)
    parser = argparse.ArgumentParser(prog="job_nemesis.py child")
    parser.add_argument("what", choices=["run", "rollback", "write_state"])
    parser.add_argument("--job", required=True)
    parser.add_argument("--inputs", required=True)
    parser.add_argument("--commit-mode", default="async")
    parser.add_argument("--key-groups", type=int, default=4)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--compact-every", type=int, default=0)
    parser.add_argument("--change-share", type=float, default=0.25)
    parser.add_argument("--silver", choices=["v1", "v2"], default="v1")
    parser.add_argument("--fault", help="STAGE:ACTION:STEP:EPOCH")
    parser.add_argument("--local", help="local_state_dir")
    parser.add_argument("--streaming", action="store_true", help="run: start, catch up, stop")
    parser.add_argument("--epoch", type=int, help="rollback: the job snapshot")
    parser.add_argument("--forget", help="write_state: event ids, comma-separated")
    args = parser.parse_args(argv)
    spark.conf.set("spark.sql.shuffle.partitions", str(args.partitions))
    try:
        result = {"run": _run, "rollback": _rollback, "write_state": _write_state}[args.what](
            spark, args
        )
    except FencingError as err:
        print(json.dumps({"fenced": str(err)}), flush=True)
        return FENCED_EXIT
    except Exception as err:
        traceback.print_exc()
        print(json.dumps({"error": repr(err), "type": type(err).__name__}), flush=True)
        return 1
    print(json.dumps(result), flush=True)
    return 0


def _session(cluster: bool) -> Any:
    from pyspark.sql import SparkSession

    from pyspark_abs import local_session

    if not cluster:
        return local_session("job-nemesis")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master("local-cluster[2,1,1024]")
        .appName("job-nemesis-cluster")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _warm_up(spark: Any, scratch: Path) -> None:
    """Run the job once over one small file, in a root of its own."""
    write_events(scratch / "in", [[("w1", "ann", 1), ("w2", "bob", 2)]], 0)
    _job(spark, str(scratch / "in"), str(scratch / "job"), argparse.Namespace(**_DEFAULTS)).run()


_DEFAULTS = {
    "commit_mode": "async",
    "key_groups": 4,
    "compact_every": 0,
    "change_share": 0.25,
    "silver": "v1",
    "fault": None,
    "local": None,
}


def _job(spark: Any, inputs: str, root: str, args: argparse.Namespace) -> Any:
    import pandas as pd

    from pyspark_abs import AbsConfig, KeyGroupResult, StateEvolution, vectorized_operator
    from pyspark_abs.examples import medallion
    from pyspark_abs.faults import Fault, FaultAction, FaultStep

    def dedup_v2(rows: pd.DataFrame, state: pd.DataFrame, ctx: Any) -> KeyGroupResult:
        fresh = rows.drop_duplicates("event_id")
        fresh = fresh[~fresh["event_id"].isin(state["event_id"])].copy()
        fresh["seen"] = 1
        return KeyGroupResult(
            state=fresh[["event_id", "user", "seen"]],
            output=fresh[["event_id", "user", "amount"]],
        )

    settings: dict[str, Any] = {
        "commit_mode": args.commit_mode,
        "key_groups": args.key_groups,
        "compaction_every_epochs": args.compact_every,
        "local_state_change_share": args.change_share,
    }
    if args.local:
        settings["local_state_dir"] = args.local
    stage_configs = {}
    if args.fault:
        stage, action, step, epoch = args.fault.split(":")
        fault = Fault(FaultStep(step), int(epoch), FaultAction(action))
        stage_configs[stage] = AbsConfig(**settings, faults=(fault,))
    operators = {}
    if args.silver == "v2":
        operators["silver"] = vectorized_operator(
            key="event_id",
            state_schema="user string, seen long",
            output_schema=medallion.EVENT_DDL,
            name="dedup",
            evolution=StateEvolution(added={"seen": 1}),
        )(dedup_v2)
    return medallion.build(
        spark,
        inputs,
        root,
        config=AbsConfig(**settings),
        stage_configs=stage_configs,
        operators=operators,
    )


def _run(spark: Any, args: argparse.Namespace) -> dict[str, Any]:
    job = _job(spark, args.inputs, args.job, args)
    if args.streaming:
        query = job.start()
        query.process_all_available()
        query.stop()
    else:
        job.run()
    return {"done": True}


def _rollback(spark: Any, args: argparse.Namespace) -> dict[str, Any]:
    from pyspark_abs import AbsConfig
    from pyspark_abs.examples.wordcount import parse_pause
    from pyspark_abs.job_actions.rollbacks import rollback_job

    faults = (parse_pause(args.fault.split(":", 2)[2]),) if args.fault else ()
    done = rollback_job(args.job, args.epoch, config=AbsConfig(faults=faults))
    return {"epoch": done.epoch, "restore_epoch": done.restore_epoch}


def _write_state(spark: Any, args: argparse.Namespace) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from pyspark_abs import AbsConfig, write_state

    job = _job(spark, args.inputs, args.job, args)
    silver = job.stages["silver"]
    forget = args.forget.split(",")
    kept = job.state("silver").filter(~F.col("event_id").isin(forget))
    operator = silver.operator
    info = write_state(kept, silver.root, operator, config=AbsConfig(key_groups=args.key_groups))
    return {"epoch": info.epoch}


# ---------------------------------------------------------------------------------------
# The input.


def write_events(directory: Path, files: Sequence[Sequence[Event]], first: int) -> None:
    """Land JSON-lines event files numbered from ``first``, in order of modification time."""
    directory.mkdir(parents=True, exist_ok=True)
    for number, events in enumerate(files, start=first):
        path = directory / f"events-{number:05d}.json"
        path.write_text(
            "".join(
                json.dumps({"event_id": e, "user": u, "amount": a}) + "\n" for e, u, a in events
            )
        )
        os.utime(path, (1_700_000_000 + number * 10, 1_700_000_000 + number * 10))


# ---------------------------------------------------------------------------------------
# The schedule.


class JobNemesis(Harness):
    """Runs the schedule and checks after every step."""

    script = SCRIPT
    count_names = COUNTS
    child_timeout_s = CHILD_TIMEOUT_S

    def __init__(self, workdir: Path, seed: int, kinds: Sequence[str]) -> None:
        super().__init__(workdir, seed, kinds)
        # a stream of its own, so that a seed's other draws stay as they were before it
        self.streaming = random.Random(seed + 2_000_003)
        self.inputs_dir = workdir / "in"
        self.local = workdir / "local"
        first = JobPlan(workdir / "job-0", self.inputs_dir)
        self.plans: list[JobPlan] = [first]
        self.current = first
        self.inputs: list[list[Event]] = []
        self.events: dict[str, tuple[str, int]] = {}
        self.tags: dict[Path, dict[str, int]] = {}
        self.silver = "v1"
        self.fresh = True
        self.key_groups, self.partitions = 4, 2

    # -- input and children

    def append_input(self) -> None:
        """Land one event file: new events, and events sent again (same id, user, amount)."""
        events: list[Event] = []
        for _ in range(self.rng.randint(2, 6)):
            if self.events and self.rng.random() < 0.3:
                event_id = self.rng.choice(sorted(self.events))
                events.append((event_id, *self.events[event_id]))
            else:
                event_id = f"e{len(self.events)}"
                self.events[event_id] = (self.rng.choice(USERS), self.rng.randint(1, 50))
                events.append((event_id, *self.events[event_id]))
        write_events(self.inputs_dir, [events], len(self.inputs))
        self.inputs.append(events)

    def spawn(self, what: str, plan: JobPlan, *extra: str, cluster: bool = False) -> Child:
        """Give an operation on a job root to the child started ahead (or a new one)."""
        command = [what, "--job", str(plan.root), "--inputs", str(self.inputs_dir)]
        command += ["--key-groups", str(self.key_groups), "--partitions", str(self.partitions)]
        command += ["--silver", self.silver, "--local", str(self.local), *extra]
        return self.give(command, *(["--cluster"] if cluster else []))

    def run_args(self) -> list[str]:
        """A random commit mode and change-file share (1000: every small key group goes on
        chains of change files); new partition and key-group counts after a decision."""
        if self.fresh:
            self.key_groups = self.rng.choice((2, 4, 8))
            self.partitions = self.rng.choice((1, 2, 3))
            self.fresh = False
        extra = ["--commit-mode", self.rng.choice(("sync", "async"))]
        extra += ["--change-share", self.rng.choice(("0", "0.25", "1000"))]
        if self.rng.random() < 0.3:
            extra += ["--compact-every", "1"]
        if self.streaming.random() < 0.5:
            extra += ["--streaming"]
        return extra

    def newest_epoch(self, plan: JobPlan, stage: str) -> int:
        try:
            table = DeltaTable(str(plan.stage_root(stage) / "_manifest"))
            epochs = table.to_pyarrow_table(columns=["epoch"])["epoch"].to_pylist()
        except Exception:
            return -1
        return max((int(e) for e in epochs if e is not None), default=-1)

    def job_snapshots(self, plan: JobPlan) -> list[Any]:
        from pyspark_abs.job_ledger.listing import job_snapshots_at

        try:
            return list(job_snapshots_at(str(plan.root)))
        except Exception:
            return []

    def stage_fault(self, action: str) -> str:
        """A fault at an epoch the next run reaches. Bronze lands one file per epoch, so it
        reaches its epoch after next only when it is two files behind; a downstream stage may
        read several upstream epochs in one, so only its next epoch is sure to come."""
        stage = self.rng.choice(STAGES)
        newest = self.newest_epoch(self.current, stage)
        behind = len(self.inputs) - 1 - newest
        ahead = self.rng.randint(1, 2) if behind > 1 else 1
        epoch = newest + (ahead if stage == "bronze" else 1)
        return f"{stage}:{action}:{self.rng.choice(DRIVER_STEPS)}:{epoch}"

    # -- operations

    def op_run(self) -> str:
        self.expect_ok(self.spawn("run", self.current, *self.run_args()), "run")
        return "finished"

    def op_kill(self) -> str:
        kind = self.rng.choice(("timer", "at_step", "after_step"))
        extra = self.run_args()
        if kind != "timer":
            extra += ["--fault", self.stage_fault("pause")]
        child = self.spawn("run", self.current, *extra)
        limit = self.rng.uniform(2.0, 15.0) if kind == "timer" else CHILD_TIMEOUT_S
        return kill(child, kind, limit, self.rng, self.error)

    def op_fault(self) -> str:
        child = self.spawn(
            "run", self.current, *self.run_args(), "--fault", self.stage_fault("raise")
        )
        code, result = child.wait(CHILD_TIMEOUT_S)
        if code == 0:
            return "finished_first"
        if result.get("type") != "InjectedFault":
            self.error(f"fault run failed otherwise: {result}, see {child.log}")
            return "failed"
        return "failed_as_injected"

    def op_rollback(self) -> str:
        from pyspark_abs.job_actions.rollbacks import rollback_job

        found = self.job_snapshots(self.current)
        if not found:
            return "skipped"
        target = self.rng.choice(found).epoch
        try:
            rollback_job(str(self.current.root), target)
        except Exception as err:
            if type(err).__name__ == "ExternalChangeError":
                return "refused_after_delete"
            self.error(f"job rollback to {target} failed: {err!r}")
            return "failed"
        self.fresh = True
        return "done"

    def op_crashed_rollback(self) -> str:
        found = self.job_snapshots(self.current)
        if not found:
            return "skipped"
        target = self.rng.choice(found).epoch
        restore = 1 + max(self.newest_epoch(self.current, s) for s in STAGES)
        step = self.rng.choice(("after_prepared", "between_table_commits", "after_committed"))
        extra = ["--epoch", str(target), "--fault", f"any:pause:{step}:{restore}"]
        child = self.spawn("rollback", self.current, *extra)
        how = wait_stop(child, CHILD_TIMEOUT_S)
        if how == "exited":
            code, result = child.wait()
            if code != 0 and "ExternalChangeError" not in str(result):
                self.error(f"crashed rollback exited {code}: {result}, see {child.log}")
            return "finished_first"
        signal_group(child.process.pid, signal.SIGKILL)
        child.wait()
        self.fresh = True
        return "killed"

    def op_restore(self) -> str:
        from pyspark_abs.job_actions.rollbacks import restore_job

        found = self.job_snapshots(self.current)
        if not found:
            return "skipped"
        target = self.rng.choice(found).epoch
        plan = JobPlan(self.workdir / f"job-{len(self.plans)}", self.inputs_dir)
        plan.parent = (self.current, target)
        try:
            restore_job(str(self.current.root), target, str(plan.root))
        except Exception as err:
            self.error(f"job restore of {target} failed: {err!r}")
            return "failed"
        self.plans.append(plan)
        self.current = plan
        self.fresh = True
        return "done"

    def op_migrate(self) -> str:
        if self.silver == "v2":
            return self.op_run()
        self.silver = "v2"
        # a job decision, after which the counts may change, only if there is a job
        # snapshot to migrate from; otherwise a plain run on the checkpoints as they are
        self.fresh = self.fresh or bool(self.job_snapshots(self.current))
        self.expect_ok(self.spawn("run", self.current, *self.run_args()), "migrating run")
        return "migrated"

    def op_write_state(self) -> str:
        if not self.job_snapshots(self.current):
            return "skipped"
        self.expect_ok(self.spawn("run", self.current, *self.run_args()), "run before")
        forget = self.rng.sample(sorted(self.events), k=min(2, len(self.events)))
        child = self.spawn("write_state", self.current, "--forget", ",".join(forget))
        result = self.expect_ok(child, "write_state")
        if "epoch" not in result:
            return "failed"
        self.current.forgets[("silver", int(result["epoch"]))] = frozenset(forget)
        self.fresh = True
        return "done"

    def op_tag(self) -> str:
        from pyspark_abs.upkeep.tags import tag

        stage = self.rng.choice(STAGES)
        root = self.current.stage_root(stage)
        retained = [
            e
            for e, entry in JobModel([self.current], self.inputs)
            .stage_epochs(self.current, stage)
            .items()
            if entry.retained
        ]
        if not retained:
            return "skipped"
        epoch, name = self.rng.choice(retained), self.rng.choice(("prod", "qa"))
        skew = dt.timedelta(minutes=self.rng.uniform(-30, 30))
        # a process whose clock is minutes off (a fixed instant: a name takes one reading)
        skewed = mock.patch(
            "pyspark_abs.upkeep.tags.now", return_value=dt.datetime.now(dt.timezone.utc) + skew
        )
        try:
            with skewed:
                tag(str(root), epoch, name, move=True)
        except Exception as err:
            self.error(f"tag {name} of {stage} at {epoch} failed: {err!r}")
            return "failed"
        self.tags.setdefault(root, {})[name] = epoch
        return "moved"

    def op_maintenance(self) -> str:
        from pyspark_abs.upkeep.compaction import compact
        from pyspark_abs.upkeep.retention import vacuum

        child = self.spawn("run", self.current, *self.run_args())

        def stage_root(rng: random.Random) -> Path | None:
            root = self.current.stage_root(rng.choice(STAGES))
            return root if (root / "_manifest").exists() else None

        def compacting(rng: random.Random) -> None:
            if (root := stage_root(rng)) is not None:
                compact(str(root))

        def vacuuming(rng: random.Random) -> None:
            if (root := stage_root(rng)) is not None:
                vacuum(str(root), keep_last=rng.randint(1, 3), min_age_seconds=0)

        loops = {"compact": compacting, "vacuum": vacuuming}
        wait = lambda: self.expect_ok(child, "run beside maintenance")  # noqa: E731
        done = beside(wait, loops, self.rng, self.error)
        return f"compact x{done['compact']} vacuum x{done['vacuum']}"

    def op_delete(self) -> str:
        plan = self.current
        user = self.rng.choice(USERS)
        readers = {s: self.newest_epoch(plan, s) for s in ("silver", "audit")}
        channel = plan.table("bronze")
        if not (channel / "_delta_log").exists():
            return "skipped"
        newest = self.newest_epoch(plan, "bronze")
        DeltaTable(str(channel)).delete(f"user = '{user}'")
        plan.deletes.append(Delete(channel, user, newest, readers))
        return "deleted"

    def op_copy(self) -> str:
        original = self.current
        copy = JobPlan(self.workdir / f"job-{len(self.plans)}", self.inputs_dir)
        shutil.copytree(original.root, copy.root)
        copy.parent = original.parent  # a copy's first epochs are the original's
        copy.forgets = dict(original.forgets)
        copy.deletes = list(original.deletes)
        for stage in STAGES:
            if original.stage_root(stage) in self.tags:
                self.tags[copy.stage_root(stage)] = dict(self.tags[original.stage_root(stage)])
        self.plans.append(copy)
        extra = self.run_args()
        first = self.spawn("run", original, *extra)
        second = self.spawn("run", copy, *extra)
        self.expect_ok(first, "original beside its copy")
        self.expect_ok(second, "copy beside its original")
        self.current = copy
        return "both ran"

    def op_cluster(self) -> str:
        child = self.spawn("run", self.current, *self.run_args(), cluster=True)
        self.expect_ok(child, "cluster run")
        return "finished"

    # -- checks

    def check(self, step: int, kind: str) -> None:
        from pyspark_abs.upkeep.validation import validate

        counts: Counter[str] = Counter()
        notes: list[str] = []
        model = JobModel(self.plans, self.inputs)
        for plan in self.plans:
            try:
                more = self.check_plan(model, plan, counts)
            except Exception as err:
                counts["unreadable_roots"] += 1
                more = [f"{plan.root.name}: {err!r}"]
            notes += more
            for stage in STAGES:
                root = plan.stage_root(stage)
                if not (root / "_manifest").exists():
                    continue
                try:
                    problems = [str(p) for p in validate(str(root))]
                except Exception as err:
                    problems = [f"validate raised {err!r}"]
                counts["validate_problems"] += len(problems)
                notes += [f"{plan.root.name}/{stage}: validate: {p}" for p in problems]
        for name in COUNTS:
            self.counts[name] = max(self.counts[name], counts[name])
        if notes:
            self.failures.append({"step": step, "op": kind, "notes": notes[:10]})
            for note in notes[:10]:
                print(f"  CHECK {note}", file=sys.stderr)

    def check_plan(self, model: JobModel, plan: JobPlan, counts: Counter[str]) -> list[str]:
        notes: list[str] = []
        for stage in STAGES:
            root = plan.stage_root(stage)
            for epoch, entry in model.stage_epochs(plan, stage).items():
                if entry.retained:
                    notes += self.check_snapshot(model, plan, stage, epoch, entry, counts)
            if root in self.tags:
                got = read_tags(root)
                if got != self.tags[root]:
                    counts["tag_mismatches"] += 1
                    notes.append(f"{root}: names {got}, given {self.tags[root]}")
        for snapshot in self.job_snapshots(plan):
            problems = model.cut_problems(plan, dict(snapshot.stages))
            counts["broken_cuts"] += bool(problems)
            notes += [f"{plan.root.name} job snapshot {snapshot.epoch}: {p}" for p in problems]
        return notes

    def check_snapshot(
        self,
        model: JobModel,
        plan: JobPlan,
        stage: str,
        epoch: int,
        entry: Any,
        counts: Counter[str],
    ) -> list[str]:
        if stage == "bronze":
            return []
        want = model.result(plan, stage, epoch)
        where = f"{plan.root.name}/{stage} epoch {epoch}"
        notes = []
        table, keys, values = STATE[stage]
        if table in entry.versions:
            got, twice = state_as_of(
                plan.stage_root(stage) / table, entry.versions[table], keys, values, epoch
            )
            counts["duplicated"] += twice
            expected = want.state(stage)
            for key in sorted(set(got) | set(expected), key=str):
                if got.get(key) == expected.get(key):
                    continue
                kind = "resurrected" if key in want.gone and key not in expected else "mismatches"
                counts[kind] += 1
                notes.append(
                    f"{where}: {kind} {key}: state {got.get(key)}, model {expected.get(key)}"
                )
        if "sink/output" in entry.versions:
            rows = read_table(plan.table(stage), entry.versions["sink/output"], SINK[stage])
            actual = Counter(zip(*(rows[c].to_pylist() for c in SINK[stage]), strict=True))
            lost, extra = want.sink - actual, actual - want.sink
            counts["lost"] += lost.total()
            counts["duplicated"] += sum(n for r, n in extra.items() if want.sink[r])
            counts["mismatches"] += sum(n for r, n in extra.items() if not want.sink[r])
            if lost or extra:
                notes.append(f"{where}: sink lost {sorted(lost)[:4]} extra {sorted(extra)[:4]}")
        return notes

    # -- the loop

    def run(self, ops: int) -> None:
        weights = [WEIGHTS[k] for k in self.kinds]
        for step in range(1, ops + 1):
            kind = self.schedule.choices(self.kinds, weights)[0]
            self.append_input()
            started = time.monotonic()
            if kind in NEED_SNAPSHOTS and not self.job_snapshots(self.current):
                self.op_run()  # nothing to go back to, copy or edit yet: a clean run first
            try:
                outcome = getattr(self, f"op_{kind}")()
            except Exception as err:
                self.error(f"{kind} raised {err!r}: {traceback.format_exc()[-1500:]}")
                outcome = "raised"
            self.ops[kind] += 1
            self.outcomes[f"{kind}:{outcome}"] += 1
            self.check(step, kind)
            print(
                f"step {step}: {kind} on {self.current.root.name}: {outcome} "
                f"({time.monotonic() - started:.1f} s)",
                file=sys.stderr,
            )
        if self.ops:  # a last clean run finishes what a kill or a fault cut short
            self.expect_ok(self.spawn("run", self.current, *self.run_args()), "final run")
            self.check(ops + 1, "final")

    def report(self, seed: int, wall_s: float) -> dict[str, Any]:
        return self.tallies(seed, wall_s, jobs=len(self.plans), input_files=len(self.inputs))


run_schedule = JobNemesis.run_schedule
sound = JobNemesis.sound


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run a schedule (see :meth:`Harness.main`)."""
    return JobNemesis.main(argv, __doc__, WEIGHTS, "pyspark-abs-job-nemesis-")


if __name__ == "__main__":
    if sys.argv[1:2] == ["child"]:
        sys.exit(child_main(cluster=sys.argv[2:] == ["--cluster"]))
    sys.exit(0 if sound(main()) else 1)
