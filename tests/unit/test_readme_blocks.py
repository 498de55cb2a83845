"""Every Python block of the README is run by a test: a block that no test names is stale
the day the API changes under it."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.readme import code_blocks

TESTS = Path(__file__).parents[1]
RUNNERS = {"block_with", "run_block"}
SHORTEST = 15  # a shorter string (a path, a name) could be in any block


def _called(node: ast.Call) -> str:
    return node.func.id if isinstance(node.func, ast.Name) else ""


def _named_lines() -> set[str]:
    """The string arguments of calls in the test modules that run README blocks: the line
    each passes to ``block_with`` or ``run_block``, directly or through a helper."""
    lines: set[str] = set()
    for path in TESTS.rglob("*.py"):
        if path.parent.name == "support":
            continue
        calls = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)]
        if not any(_called(call) in RUNNERS for call in calls):
            continue
        for call in calls:
            lines.update(
                arg.value
                for arg in call.args
                if isinstance(arg, ast.Constant)
                and isinstance(arg.value, str)
                and len(arg.value) >= SHORTEST
            )
    return lines


def test_every_python_block_of_the_readme_is_run_by_a_test() -> None:
    blocks = code_blocks()
    named = [line for line in _named_lines() if sum(line in block for block in blocks) == 1]
    unrun = [block.splitlines()[0] for block in blocks if not any(n in block for n in named)]
    assert unrun == [], f"README blocks that no test runs (first lines): {unrun}"
