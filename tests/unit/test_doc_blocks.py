"""Every Python block of the documentation is run by a test: a block that no test names is
stale the day the API changes under it. Examples are files of their own under
``docs/examples``, run by a test that names them; the README shows them as they are."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.support.docs import EXAMPLES, README, code_blocks, pages

TESTS = Path(__file__).parents[1]
RUNNERS = {"block_with", "run_block"}
SHORTEST = 15  # a shorter string (a path, a name) could be in any block


def _called(node: ast.Call) -> str:
    return node.func.id if isinstance(node.func, ast.Name) else ""


def _test_modules() -> list[Path]:
    return [p for p in TESTS.rglob("*.py") if p.parent.name != "support"]


def _named_lines() -> set[str]:
    """The string arguments of calls in the test modules that run documentation blocks: the
    line each passes to ``block_with`` or ``run_block``, directly or through a helper."""
    lines: set[str] = set()
    for path in _test_modules():
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


def _examples() -> dict[str, str]:
    return {path.name: path.read_text() for path in sorted(EXAMPLES.glob("*.py"))}


def test_every_python_block_of_the_documentation_is_run_by_a_test() -> None:
    examples = set(_examples().values())
    blocks = [block for block in code_blocks() if block not in examples]
    named = [line for line in _named_lines() if sum(line in block for block in blocks) == 1]
    unrun = [block.splitlines()[0] for block in blocks if not any(n in block for n in named)]
    assert unrun == [], f"documentation blocks that no test runs (first lines): {unrun}"


def test_every_example_is_run_by_a_test_and_included_where_it_is_shown() -> None:
    examples = _examples()
    assert examples, f"no examples under {EXAMPLES}"
    tests = "\n".join(path.read_text() for path in (TESTS / "integration").glob("test_*.py"))
    unrun = [name for name in examples if f'"{name}"' not in tests]
    assert unrun == [], f"examples no test runs: {unrun}"
    included = {
        name
        for page in pages()
        for name in re.findall(r'^--8<-- "([^"]+)"$', page.read_text(), flags=re.MULTILINE)
    }
    assert included <= set(examples), f"pages include missing examples: {included - set(examples)}"


def test_the_readme_shows_its_examples_exactly_as_the_files_are() -> None:
    readme = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    examples = _examples()
    shown = [name for name, text in examples.items() if text in readme]
    assert shown == ["crash_and_recover.py", "first_pipeline.py"], shown
    assert len(readme) == len(shown), "the README shows a Python block that is no example file"
