"""The README's Python code blocks, so a test can run the one it documents."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).parents[2] / "README.md"


def python_blocks() -> list[str]:
    """Every fenced ``python`` block of the README, in order."""
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def block_with(line: str) -> str:
    """The one README Python block that holds ``line``; a test fails if it is gone or twice."""
    found = [block for block in python_blocks() if line in block]
    assert len(found) == 1, f"{len(found)} README blocks hold {line!r}"
    return found[0]
