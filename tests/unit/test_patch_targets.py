"""Every dotted path a test patches still names something: a module move cannot leave a
``monkeypatch.setattr("pyspark_abs....", ...)`` pointing at a name that is gone (an import
scan does not see such strings, and the test would fail only when it runs)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PATCHERS = {"setattr", "patch", "delattr"}


def patched_paths() -> list[tuple[str, str]]:
    """``(file, dotted path)`` for each string naming a ``pyspark_abs`` attribute that a
    test or script patches."""
    found: list[tuple[str, str]] = []
    for path in sorted([*REPO.glob("tests/**/*.py"), *REPO.glob("scripts/**/*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else ""
            first = node.args[0]
            if (
                name in PATCHERS
                and isinstance(first, ast.Constant)
                and isinstance(first.value, str)
                and first.value.startswith("pyspark_abs.")
            ):
                found.append((str(path.relative_to(REPO)), first.value))
    return found


def resolve(dotted: str) -> object:
    """The object a dotted path names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            value = getattr(value, attribute)
        return value
    raise ModuleNotFoundError(dotted)


def test_the_suite_patches_some_dotted_path() -> None:
    assert patched_paths(), "the scan found no patched path: it no longer sees the calls"


@pytest.mark.parametrize(("where", "dotted"), patched_paths(), ids=lambda v: str(v))
def test_each_patched_path_names_an_attribute(where: str, dotted: str) -> None:
    try:
        resolve(dotted)
    except (AttributeError, ModuleNotFoundError) as err:
        pytest.fail(f"{where} patches {dotted}, which names nothing: {err}")


def test_a_path_that_names_nothing_is_caught() -> None:
    with pytest.raises(AttributeError):
        resolve("pyspark_abs.pipeline.declaration.settle_stage")
    assert resolve("pyspark_abs.pipeline.start.settle_stage") is not None
