"""The reminders logic of the timer tests, shared by the unit and the Spark operator."""

from __future__ import annotations

from collections.abc import Sequence

from pyspark_abs import KeyState


def remind(
    state: KeyState, times_ms: Sequence[int], first: int, second: int, every: int
) -> list[int]:
    """Register timers ``first`` and ``second`` ms after each event; an event at a multiple
    of ``every`` ms keeps its first timer and earlier ones and deletes every later one. The
    key counts its events, and goes when it has neither rows nor timers. Returns the timers
    that fired for this call."""
    for ms in times_ms:
        state.register_timer(ms + first)
        state.register_timer(ms + second)
        if ms % every == 0:
            for t in state.list_timers():
                if t > ms + first:
                    state.delete_timer(t)
    if not times_ms and not state.list_timers():
        state.remove()
    else:
        state.update({"count": state.get({"count": 0})["count"] + len(times_ms)})
    return list(state.expired_timers)
