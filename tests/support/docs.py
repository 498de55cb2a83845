"""The documentation's code blocks (the README and the pages under ``docs/``), so a test can
run the one it documents."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).parents[2]
README = REPO / "README.md"
EXAMPLES = REPO / "docs" / "examples"


def pages() -> list[Path]:
    """The README and every page of the documentation site."""
    return [README, *sorted((REPO / "docs").rglob("*.md"))]


def nav_entries(entries: list[object] | None = None) -> list[tuple[str, str]]:
    """The site's navigation (``nav`` of mkdocs.yml) in order: each page's title and file."""
    if entries is None:
        entries = yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]
    found: list[tuple[str, str]] = []
    for entry in entries:
        assert isinstance(entry, dict), f"a nav entry without a title: {entry!r}"
        for title, value in entry.items():
            found += nav_entries(value) if isinstance(value, list) else [(title, str(value))]
    return found


def nav_pages() -> list[str]:
    """The page files the site's navigation lists, in order."""
    return [page for _, page in nav_entries()]


def page_path(page: str) -> str:
    """Where the site serves a page, under its root (``guide/jobs.md``: ``guide/jobs/``)."""
    stem = page.removesuffix(".md")
    return "" if stem == "index" else f"{stem}/"


def docs_text() -> str:
    """Every page's text, one after the other."""
    return "\n".join(page.read_text() for page in pages())


def code_blocks(language: str = "python") -> list[str]:
    """Every fenced block of ``language`` in the documentation, in order (the pages include
    the example files with ``--8<--`` in blocks of their own, which this leaves out)."""
    return re.findall(rf"```{language}\n(.*?)```", docs_text(), flags=re.DOTALL)


def block_with(line: str, language: str = "python") -> str:
    """The one documentation block of ``language`` that holds ``line``; a test fails if it
    is gone or twice."""
    found = [block for block in code_blocks(language) if line in block]
    assert len(found) == 1, f"{len(found)} documentation blocks hold {line!r}"
    return found[0]


def run_block(line: str, namespace: dict[str, object], places: dict[str, str]) -> None:
    """Run the documentation block holding ``line`` in ``namespace``, each example value in
    ``places`` (a path, an epoch, a call left as ``...``) replaced by this test's."""
    block = block_with(line)
    for example, here in places.items():
        assert example in block, f"the block with {line!r} no longer holds {example!r}"
        block = block.replace(example, here)
    exec(compile(block, f"docs ({line})", "exec"), namespace)
