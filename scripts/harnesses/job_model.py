"""The job nemesis's reference model: what each stage of the medallion job must hold.

The job (bronze lands event files, silver drops event ids it has seen, gold totals each
user's amounts, audit counts per user the events bronze landed and silver kept) is checked
from the input files and the stages' manifests alone. This module imports deltalake and
pyarrow, never pyspark_abs.

A stage's epoch ``e`` is either a micro-batch, which read its upstream stages' epoch ``e``
(bronze: the input files between its predecessor's offset and its own), or a restore epoch,
which installs an earlier epoch (of the same root, or of the root it was copied from):
its *lineage*. The state and the sink of a stage at ``e`` follow from the upstream outputs
its lineage read, in order. What the schedule did outside the manifests is told to the
model: event ids ``write_state`` took out of silver's state, and rows a ``DELETE`` took out
of bronze's channel before a reader read them.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable

Event = tuple[str, str, int]
"""(event id, user, amount)"""

STAGES = ("bronze", "silver", "gold", "audit")
UPSTREAMS = {
    "bronze": (),
    "silver": ("bronze",),
    "gold": ("silver",),
    "audit": ("bronze", "silver"),
}
FILE_SOURCE = "pyspark_abs_files"
CHANNEL_SOURCE = "pyspark_abs_channel"
SNAPSHOTS = ("COMMITTED", "RESTORED")


@dataclass(frozen=True)
class Epoch:
    """What a stage's manifest says of one epoch."""

    epoch: int
    status: str
    prepared: Mapping[str, Any]
    versions: Mapping[str, int]

    @property
    def is_restore(self) -> bool:
        return self.prepared.get("origin") is not None

    @property
    def retained(self) -> bool:
        return self.status in SNAPSHOTS


def _order(row: Mapping[str, Any]) -> tuple[int, int, float]:
    version = row.get("manifest_version")
    if version is None:
        return (0, 0, row["recorded_at"].timestamp())
    return (1, int(version), 0.0)


def manifest_rows(root: Path) -> list[dict[str, Any]]:
    """The manifest's rows in the order its commits recorded them."""
    rows: list[dict[str, Any]] = DeltaTable(str(root / "_manifest")).to_pyarrow_table().to_pylist()
    return sorted(rows, key=_order)


def read_epochs(root: Path) -> dict[int, Epoch]:
    """Every epoch of a stage root with a PREPARED row: its last status and table versions."""
    prepared: dict[int, dict[str, Any]] = {}
    status: dict[int, str] = {}
    versions: dict[int, dict[str, int]] = {}
    for row in manifest_rows(root):
        kind, epoch = row["status"], int(row["epoch"])
        if kind in ("TAGGED", "UNTAGGED"):
            continue
        status[epoch] = kind
        if kind == "PREPARED":
            prepared[epoch] = row
        if kind in SNAPSHOTS:
            versions[epoch] = dict(row["table_versions"] or [])
    return {
        e: Epoch(e, status[e], prepared[e], versions.get(e, {}))
        for e in sorted(prepared)
        if status[e] != "ABORTED"
    }


def read_tags(root: Path) -> dict[str, int]:
    """The savepoint names of a stage root, folded in commit order."""
    tags: dict[str, int] = {}
    for row in manifest_rows(root):
        if row["status"] == "TAGGED":
            tags[row["tag"]] = int(row["epoch"])
        elif row["status"] == "UNTAGGED" and tags.get(row["tag"]) == int(row["epoch"]):
            del tags[row["tag"]]
    return tags


def _offsets(source_offsets: str | None, source: str) -> list[dict[str, Any]]:
    found = []
    for line in (source_offsets or "").splitlines():
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict) and value.get("source") == source:
            found.append(value)
    return found


def files_read(epoch: Epoch) -> int:
    """How many input files bronze had read after ``epoch`` (its file offset)."""
    found = _offsets(epoch.prepared.get("source_offsets"), FILE_SOURCE)
    return int(found[0]["files"]) if found else 0


def skipped(epoch: Epoch) -> set[str]:
    """The channels whose upstream epoch a reader's micro-batch skipped as taken back."""
    found = _offsets(epoch.prepared.get("source_offsets"), CHANNEL_SOURCE)
    return {name for offset in found for name in offset.get("taken_back", [])}


@dataclass(frozen=True)
class Delete:
    """A DELETE of ``user``'s rows from bronze's channel of a job, and who had read what."""

    channel: Path
    user: str
    upstream_newest: int
    readers_newest: Mapping[str, int]


@dataclass
class JobPlan:
    """One job root the schedule made: its stages' roots and what was done outside them."""

    root: Path
    inputs: Path
    parent: tuple[JobPlan, int] | None = None
    forgets: dict[tuple[str, int], frozenset[str]] = field(default_factory=dict)
    deletes: list[Delete] = field(default_factory=list)

    def stage_root(self, stage: str) -> Path:
        return self.root / "stages" / stage

    def table(self, stage: str) -> Path:
        return self.root / "tables" / stage


@dataclass
class Result:
    """The model's view of a stage after one of its epochs."""

    seen: dict[str, tuple[str, int]] = field(default_factory=dict)
    totals: dict[str, tuple[int, int]] = field(default_factory=dict)
    audit: dict[str, tuple[int, int]] = field(default_factory=dict)
    output: list[tuple[Any, ...]] = field(default_factory=list)
    sink: Counter[tuple[Any, ...]] = field(default_factory=Counter)
    own: tuple[int, ...] = ()
    """The stage's micro-batch epochs on its lineage."""
    read: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    """Each upstream stage's micro-batch epochs whose rows the lineage read, in order."""
    gone: frozenset[Any] = frozenset()
    """Users and event ids the lineage took out on purpose (a DELETE, written state)."""

    def state(self, stage: str) -> dict[Any, tuple[Any, ...]]:
        """The stage's live state: key to its state columns (none for bronze)."""
        if stage == "silver":
            return {e: (u,) for e, (u, _) in self.seen.items()}
        if stage == "gold":
            return dict(self.totals)
        if stage == "audit":
            return dict(self.audit)
        return {}

    def copy(self, *, sink: bool = True) -> Result:
        """The same state, with no output of its own (and the sink kept, or empty)."""
        return Result(
            dict(self.seen),
            dict(self.totals),
            dict(self.audit),
            [],
            Counter(self.sink) if sink else Counter(),
            self.own,
            dict(self.read),
            self.gone,
        )


class JobModel:
    """Every stage's expected state and sink at each of its epochs, for every job root."""

    def __init__(self, plans: Iterable[JobPlan], inputs: list[list[Event]]) -> None:
        self.inputs = inputs
        self.plans = {p.root: p for p in plans}
        self.epochs: dict[tuple[Path, str], dict[int, Epoch]] = {}
        self._results: dict[tuple[Path, str, int], Result] = {}

    def stage_epochs(self, plan: JobPlan, stage: str) -> dict[int, Epoch]:
        """The stage's epochs (read once per model)."""
        key = (plan.root, stage)
        if key not in self.epochs:
            root = plan.stage_root(stage)
            self.epochs[key] = read_epochs(root) if (root / "_manifest").exists() else {}
        return self.epochs[key]

    def result(self, plan: JobPlan, stage: str, epoch: int) -> Result:
        """The stage's state, output and sink after ``epoch`` (memoized)."""
        key = (plan.root, stage, epoch)
        if key not in self._results:
            self._results[key] = self._compute(plan, stage, epoch)
        return self._results[key]

    def _predecessor(self, plan: JobPlan, stage: str, epoch: int) -> int | None:
        earlier = [e for e in self.stage_epochs(plan, stage) if e < epoch]
        return max(earlier) if earlier else None

    def _compute(self, plan: JobPlan, stage: str, epoch: int) -> Result:
        epochs = self.stage_epochs(plan, stage)
        entry = epochs[epoch]
        if entry.is_restore:
            origin = int(entry.prepared["restored_from"])
            copied = plan.parent is not None and epoch == min(epochs)
            source = plan.parent[0] if copied and plan.parent is not None else plan
            # a copy into a new root starts its sinks empty; a rollback restores them
            installed = self.result(source, stage, origin).copy(sink=not copied)
            forgotten = plan.forgets.get((stage, epoch), frozenset())
            installed.seen = {e: v for e, v in installed.seen.items() if e not in forgotten}
            installed.gone = installed.gone | forgotten
            return installed
        before_epoch = self._predecessor(plan, stage, epoch)
        before = Result() if before_epoch is None else self.result(plan, stage, before_epoch)
        after = before.copy()
        after.own = (*before.own, epoch)
        if stage == "bronze":
            first = 0 if before_epoch is None else files_read(epochs[before_epoch])
            after.output = [e for f in self.inputs[first : files_read(entry)] for e in f]
        else:
            rows = {u: self._upstream_rows(plan, stage, u, entry, after) for u in UPSTREAMS[stage]}
            self._apply(stage, after, rows)
        after.sink.update(after.output)
        return after

    def _upstream_rows(
        self, plan: JobPlan, stage: str, upstream: str, entry: Epoch, after: Result
    ) -> list[tuple[Any, ...]]:
        """The rows a reader's micro-batch read from one upstream stage (noted in ``after``)."""
        source = self.stage_epochs(plan, upstream).get(entry.epoch)
        if upstream in skipped(entry) or source is None or source.is_restore:
            return []
        after.read = {**after.read, upstream: (*after.read.get(upstream, ()), entry.epoch)}
        rows = list(self.result(plan, upstream, entry.epoch).output)
        if upstream == "bronze":
            for delete in plan.deletes:
                if delete.readers_newest.get(stage, -1) < entry.epoch <= delete.upstream_newest:
                    rows = [r for r in rows if r[1] != delete.user]
                    after.gone = after.gone | {delete.user}
        return rows

    @staticmethod
    def _apply(stage: str, after: Result, rows: Mapping[str, list[tuple[Any, ...]]]) -> None:
        if stage == "silver":
            for event_id, user, amount in rows["bronze"]:
                if event_id not in after.seen:
                    after.seen[event_id] = (user, amount)
                    after.output.append((event_id, user, amount))
        elif stage == "gold":
            touched: dict[str, None] = {}
            for _, user, amount in rows["silver"]:
                total, events = after.totals.get(user, (0, 0))
                after.totals[user] = (total + amount, events + 1)
                touched[user] = None
            after.output = [(u, *after.totals[u]) for u in touched]
        elif stage == "audit":
            landed = Counter(u for _, u, _ in rows["bronze"])
            kept = Counter(u for _, u, _ in rows["silver"])
            users = list(dict.fromkeys([*landed, *kept]))
            for user in users:
                old = after.audit.get(user, (0, 0))
                after.audit[user] = (old[0] + landed[user], old[1] + kept[user])
            after.output = [(u, *after.audit[u]) for u in users]

    def cut_problems(self, plan: JobPlan, stages: Mapping[str, int]) -> list[str]:
        """Why a job snapshot (each stage's epoch) is no consistent cut; empty if it is."""
        problems = []
        for stage, epoch in stages.items():
            for upstream in UPSTREAMS[stage]:
                read = self.result(plan, stage, epoch).read.get(upstream, ())
                own = self.result(plan, upstream, stages[upstream]).own
                if tuple(read) != tuple(own):
                    problems.append(
                        f"{stage} at {epoch} read {upstream} epochs {list(read)[-5:]}, but "
                        f"{upstream} at {stages[upstream]} ran {list(own)[-5:]}"
                    )
        return problems


def read_table(path: Path, version: int, columns: list[str]) -> pa.Table:
    """A Delta table at ``version``: its files read with pyarrow."""
    table = DeltaTable(str(path), version=version)
    return table.to_pyarrow_table(columns=columns)


def state_as_of(
    path: Path, version: int, keys: list[str], values: list[str], epoch: int
) -> tuple[dict[Any, tuple[Any, ...]], int]:
    """A stage's live state at ``epoch``: the latest change per key up to it, without
    tombstones; and how many keys changed twice in one epoch (a double commit)."""
    table = read_table(path, version, [*keys, *values, "_epoch", "_deleted"])
    latest: dict[Any, tuple[int, bool, tuple[Any, ...]]] = {}
    twice = 0
    for row in table.to_pylist():
        if row["_epoch"] > epoch:
            continue
        key = tuple(row[k] for k in keys) if len(keys) > 1 else row[keys[0]]
        seen = latest.get(key)
        if seen is not None and seen[0] == row["_epoch"]:
            twice += 1
        if seen is None or row["_epoch"] >= seen[0]:
            latest[key] = (row["_epoch"], bool(row["_deleted"]), tuple(row[v] for v in values))
    return {k: v for k, (_, deleted, v) in latest.items() if not deleted}, twice
