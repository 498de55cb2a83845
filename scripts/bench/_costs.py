"""What a benchmark run costs: the peak memory and the CPU time of the driver, its JVM(s) and
every Python worker, read from ``/proc`` (Linux only: elsewhere every figure stays 0)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from statistics import median

KINDS = ("jvm", "python_workers", "driver")


@dataclass
class RunCosts:
    """What the runs of one variant cost: peak resident memory (MiB) and CPU time.

    Attributes:
        driver_python: Peak RSS of the driver's Python process.
        jvms: Peak RSS of a JVM (driver, or a standalone worker or executor).
        python_worker: Peak RSS of one Python worker.
        python_workers_total: Largest sum of the Python workers' RSS at one sample.
        cpu_seconds: CPU time (user + system) of every process of the application, one
            entry per run, warm-up included.
        cpu_by_process: The same per kind of process (``jvm``, ``python_workers``,
            ``driver``), one entry per run.
    """

    driver_python: float = 0.0
    jvms: float = 0.0
    python_worker: float = 0.0
    python_workers_total: float = 0.0
    cpu_seconds: list[float] = field(default_factory=list)
    cpu_by_process: list[dict[str, float]] = field(default_factory=list)

    def merge(self, other: RunCosts) -> None:
        """Keep the larger of each peak and add the other's CPU times."""
        self.driver_python = max(self.driver_python, other.driver_python)
        self.jvms = max(self.jvms, other.jvms)
        self.python_worker = max(self.python_worker, other.python_worker)
        self.python_workers_total = max(self.python_workers_total, other.python_workers_total)
        self.cpu_seconds.extend(other.cpu_seconds)
        self.cpu_by_process.extend(other.cpu_by_process)

    def memory(self) -> dict[str, float]:
        """The memory peaks, rounded."""
        return {
            "driver_python_mib": round(self.driver_python, 1),
            "jvm_mib": round(self.jvms, 1),
            "python_worker_mib": round(self.python_worker, 1),
            "python_workers_total_mib": round(self.python_workers_total, 1),
        }

    def measured_cpu(self, repeats: int) -> list[float]:
        """CPU seconds of the measured runs (the last ``repeats``), rounded."""
        return [round(c, 2) for c in self.cpu_seconds[-repeats:]]

    def measured_cpu_by_process(self, repeats: int) -> dict[str, float]:
        """Median CPU seconds per kind of process over the measured runs, rounded."""
        runs = self.cpu_by_process[-repeats:]
        return {kind: round(median([r[kind] for r in runs]), 2) for kind in runs[0]} if runs else {}


def cpu_kind(name: str, is_driver: bool) -> str:
    """The kind of process a process's CPU time is booked to: ``driver`` (this process),
    ``jvm`` (Java processes) or ``python_workers`` (every other one, pyspark's daemon and
    its workers)."""
    if is_driver:
        return "driver"
    return "jvm" if name == "java" else "python_workers"


@dataclass
class _Process:
    kind: str
    parent: int
    base: tuple[int, int]
    """Own and reaped children's CPU ticks when the ledger opened (0, 0 if born since)."""
    last: tuple[int, int]
    """The same when last seen."""


class CpuLedger:
    """The CPU time a process tree spends, by kind of process, followed process by process.

    A process's CPU time moves into its parent's (``cutime``, ``cstime``) when the parent
    reaps it, as Spark's JVM reaps Python workers that exit. So every process is booked its
    own time up to when it was last seen, and a parent its reaped children's time less what
    its children seen dying were already booked: that rest (children too short-lived to be
    seen, such as a JVM's shell commands, and the last moments of the others) is the
    parent's. A child that leaves the tree alive, when its parent dies first, is booked what
    it spent while in it.
    """

    def __init__(self, pids: Iterable[int]) -> None:
        """Open the ledger on the processes ``pids`` (their CPU time so far is not booked)."""
        self._seen: dict[tuple[int, int], _Process] = {}
        self._alive: set[tuple[int, int]] = set()
        self.observe(pids, opening=True)

    def observe(self, pids: Iterable[int], *, opening: bool = False) -> None:
        """Note the CPU time of the processes ``pids`` now.

        A process is known by its id and start time: ids are reused (there may be only
        32,768, and a JVM's threads take them too).
        """
        self._alive = set()
        for pid in pids:
            stat = _stat(pid)
            if stat is None:
                continue
            name, parent, started, ticks = stat
            self._alive.add((pid, started))
            known = self._seen.get((pid, started))
            if known is None:
                kind = cpu_kind(name, pid == os.getpid())
                base = ticks if opening else (0, 0)
                self._seen[(pid, started)] = _Process(kind, parent, base, ticks)
            else:
                known.last = ticks

    def spent(self) -> dict[str, float]:
        """CPU seconds by kind from the opening to the last :meth:`observe`."""
        ticks = dict.fromkeys(KINDS, 0)
        dead_children: dict[int, int] = {}
        for key, process in self._seen.items():
            if key not in self._alive:
                dead_children[process.parent] = dead_children.get(process.parent, 0) + sum(
                    process.last
                )
        for (pid, _), process in self._seen.items():
            own = process.last[0] - process.base[0]
            # A child that left the tree alive (its parent died first) was not reaped here.
            reaped = max(0, process.last[1] - process.base[1] - dead_children.get(pid, 0))
            ticks[process.kind] += own + reaped
        return {kind: n / os.sysconf("SC_CLK_TCK") for kind, n in ticks.items()}


class CostSampler:
    """Samples the memory and CPU time of the driver, its JVM(s) and every Python worker.

    Memory peaks come from each process's ``VmHWM`` (the kernel's high-water mark, so short
    peaks between samples are not missed), which is reset when sampling starts, so the peaks
    are this run's own. The peak total over Python workers is the largest sum of their
    ``VmRSS`` at one sample; forked workers share pages with pyspark's daemon, which count
    in each. CPU time is user plus system time, booked by kind of process with a
    :class:`CpuLedger` that sees every process at each sample: on a shared machine it is
    steadier than wall time.
    """

    def __init__(self, roots: Sequence[int], interval_s: float = 0.5) -> None:
        """Watch the driver and the descendants of ``roots`` (e.g. the driver's JVM)."""
        self.roots = [os.getpid(), *roots]
        self.interval_s = interval_s
        self.costs = RunCosts()
        self._ledger: CpuLedger | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-costs", daemon=True)

    def __enter__(self) -> CostSampler:
        pids = descendants(self.roots)
        for pid in pids:
            _reset_peak(pid)
        self._ledger = CpuLedger(pids)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        assert self._ledger is not None
        by_kind = self._ledger.spent()
        self.costs.cpu_by_process.append(by_kind)
        self.costs.cpu_seconds.append(sum(by_kind.values()))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> None:
        costs = self.costs
        workers_now = 0.0
        pids = descendants(self.roots)
        if self._ledger is not None:
            self._ledger.observe(pids)
        for pid in pids:
            status = _status(pid)
            if status is None:
                continue
            name, high, now = status
            if pid == os.getpid():
                costs.driver_python = max(costs.driver_python, high)
            elif name == "java":
                costs.jvms = max(costs.jvms, high)
            elif name.startswith("python"):
                costs.python_worker = max(costs.python_worker, high)
                workers_now += now
        costs.python_workers_total = max(costs.python_workers_total, workers_now)


def cpu_seconds(roots: Sequence[int]) -> float:
    """CPU seconds spent so far by this process and the descendants of ``roots``, their
    reaped children's included."""
    stats = (_stat(pid) for pid in descendants([os.getpid(), *roots]))
    ticks = sum(sum(stat[3]) for stat in stats if stat is not None)
    return ticks / os.sysconf("SC_CLK_TCK")


def descendants(roots: Sequence[int]) -> set[int]:
    """``roots`` and every process below them."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        stat = _stat(int(entry))
        if stat is not None:
            children.setdefault(stat[1], []).append(int(entry))
    found: set[int] = set()
    stack = list(roots)
    while stack:
        pid = stack.pop()
        if pid in found:
            continue
        found.add(pid)
        stack.extend(children.get(pid, ()))
    return found


def _stat(pid: int) -> tuple[str, int, int, tuple[int, int]] | None:
    """A process's name, parent, start time, and CPU ticks: its own (user + system) and its
    reaped children's."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            head, tail = stat.read().rsplit(")", 1)
        fields = tail.split()
        utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
        name, parent, started = head.split("(", 1)[-1], int(fields[1]), int(fields[19])
        return name, parent, started, (utime + stime, cutime + cstime)
    except (OSError, IndexError, ValueError):
        return None


def _reset_peak(pid: int) -> None:
    """Reset a process's ``VmHWM`` to its current RSS (``clear_refs``; needs ownership)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w", encoding="ascii") as clear:
            clear.write("5")
    except OSError:
        pass


def _status(pid: int) -> tuple[str, float, float] | None:
    """A process's name, peak RSS and current RSS in MiB."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            fields = dict(line.split(":", 1) for line in status if ":" in line)
    except OSError:
        return None
    if "VmHWM" not in fields:
        return None
    return (
        fields["Name"].strip(),
        int(fields["VmHWM"].split()[0]) / 1024,
        int(fields["VmRSS"].split()[0]) / 1024,
    )
