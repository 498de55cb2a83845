"""The text of delta-rs's errors as pyspark-abs's messages quote it."""

from __future__ import annotations

import re

_BACKTRACE_LINE = re.compile(r"^\s*\d+: ")
_ANSI_CODE = re.compile(r"\x1b\[[0-9;]*m")


def brief_error(err: BaseException) -> str:
    """An error's message on one line, without the native backtrace delta-rs appends."""
    parts = []
    for line in _ANSI_CODE.sub("", str(err)).splitlines():
        if _BACKTRACE_LINE.match(line):
            break
        line = line.strip().lstrip("\u21b3").strip()
        if line:
            parts.append(line)
    return ": ".join(parts) or type(err).__name__
