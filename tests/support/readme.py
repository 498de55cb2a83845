"""The README's code blocks, so a test can run the one it documents."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).parents[2] / "README.md"


def code_blocks(language: str = "python") -> list[str]:
    """Every fenced block of ``language`` in the README, in order."""
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), flags=re.DOTALL)


def block_with(line: str, language: str = "python") -> str:
    """The one README block of ``language`` that holds ``line``; a test fails if it is gone
    or twice."""
    found = [block for block in code_blocks(language) if line in block]
    assert len(found) == 1, f"{len(found)} README blocks hold {line!r}"
    return found[0]


def run_block(line: str, namespace: dict[str, object], places: dict[str, str]) -> None:
    """Run the README block holding ``line`` in ``namespace``, each example value in
    ``places`` (a path, an epoch, a call left as ``...``) replaced by this test's."""
    block = block_with(line)
    for example, here in places.items():
        assert example in block, f"the README block with {line!r} no longer holds {example!r}"
        block = block.replace(example, here)
    exec(compile(block, f"README.md ({line})", "exec"), namespace)
