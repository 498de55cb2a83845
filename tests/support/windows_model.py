"""A plain model of tumbling and session windows: each key's open windows as dicts.

It applies the rules the user guide states and reuses nothing of the project. Each window
counts its rows (``n``) and amounts (``seen``), and sums (``spent``) and maxes (``top``)
the amounts.
"""

from __future__ import annotations

from typing import Any

Window = dict[str, Any]


def new_window(start: int, end: int, amount: float | None) -> Window:
    present = amount is not None
    return {
        "start": start,
        "end": end,
        "n": 1,
        "seen": int(present),
        "spent": amount,
        "top": amount,
    }


def combine(a: Window, b: Window) -> Window:
    def pick(x: float | None, y: float | None, how: Any) -> float | None:
        values = [v for v in (x, y) if v is not None]
        return how(values) if values else None

    return {
        "start": min(a["start"], b["start"]),
        "end": max(a["end"], b["end"]),
        "n": a["n"] + b["n"],
        "seen": a["seen"] + b["seen"],
        "spent": pick(a["spent"], b["spent"], sum),
        "top": pick(a["top"], b["top"], max),
    }


class Model:
    """Each key's open windows; ``length_ms`` is a tumbling window's size or a session's gap."""

    def __init__(self, session: bool, length_ms: int) -> None:
        self.session = session
        self.length_ms = length_ms
        self.open: dict[str | None, list[Window]] = {}

    def epoch(
        self, events: list[tuple[str | None, int, float | None]], watermark: int | None
    ) -> list[tuple[Any, ...]]:
        """Add an epoch's events (rows older than the watermark are late) and return the
        windows the watermark closes, sorted."""
        for user, t, amount in events:
            if watermark is not None and t < watermark:
                continue  # late
            windows = self.open.setdefault(user, [])
            if self.session:
                windows.append(new_window(t, t + self.length_ms, amount))
                windows.sort(key=lambda w: w["start"])
                merged: list[Window] = []
                for w in windows:
                    if merged and w["start"] < merged[-1]["end"]:
                        merged[-1] = combine(merged[-1], w)
                    else:
                        merged.append(w)
                self.open[user] = merged
            else:
                start = t - t % self.length_ms
                same = [w for w in windows if w["start"] == start]
                fresh = new_window(start, start + self.length_ms, amount)
                if same:
                    windows[windows.index(same[0])] = combine(same[0], fresh)
                else:
                    windows.append(fresh)
        closed = []
        for user in list(self.open):
            for w in self.open[user]:
                if watermark is not None and w["end"] <= watermark:
                    closed.append(
                        (user, w["start"], w["end"], w["n"], w["seen"], w["spent"], w["top"])
                    )
            self.open[user] = [
                w for w in self.open[user] if watermark is None or w["end"] > watermark
            ]
            if not self.open[user]:
                del self.open[user]
        return sorted(closed, key=str)

    def state(self) -> list[tuple[Any, ...]]:
        rows = []
        for user, windows in self.open.items():
            ordered = sorted(windows, key=lambda w: w["start"])
            columns = [
                [w[c] for w in ordered] for c in ("start", "end", "n", "seen", "spent", "top")
            ]
            rows.append((user, *columns, min(w["end"] for w in ordered) - 1))
        return sorted(rows, key=str)
