"""Where a test run's time goes: the slowest test files, and those over the budget of one."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

FILE_BUDGET_S = 120.0
"""A test file slower than this in one run is named as a warning: make it cheaper."""


def file_seconds(durations: Iterable[tuple[str, float]]) -> dict[str, float]:
    """Seconds per test file, from (node id, seconds) of each setup, call and teardown.

    With ``--dist loadfile`` a file runs on one worker, so its sum is its wall time there
    (the first file on a worker also carries that worker's session start).
    """
    totals: dict[str, float] = defaultdict(float)
    for node_id, seconds in durations:
        totals[node_id.split("::", 1)[0]] += seconds
    return dict(totals)


def report(per_file: Mapping[str, float], wall_s: float, top: int = 10) -> list[str]:
    """The lines printed at the end of a run: the slowest files, warnings, the wall time."""
    ranked = sorted(per_file.items(), key=lambda item: (-item[1], item[0]))
    lines = [f"the {min(top, len(ranked))} slowest test files:"]
    lines += [f"  {seconds:7.1f} s  {path}" for path, seconds in ranked[:top]]
    lines += [
        f"WARNING: {path} took {seconds:.0f} s, over the {FILE_BUDGET_S:.0f} s a test file may "
        f"take: make its tests cheaper (share a child program, a root or a session between them)"
        for path, seconds in ranked
        if seconds > FILE_BUDGET_S
    ]
    lines.append(f"wall time of the run: {wall_s:.0f} s")
    return lines
