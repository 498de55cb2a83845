"""The documentation site builds strictly: no broken link or anchor, no page left out of the
navigation, no missing example; and the README stays a front door."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pyspark_abs
from pyspark_abs.config import CODE_ONLY, AbsConfig, spark_conf_key
from pyspark_abs.errors import error_classes
from tests.support.docs import nav_pages, page_path

REPO = Path(__file__).parents[2]
README_LINES = 200


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)]
    built = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-5000:]
    assert "WARNING" not in built.stderr, built.stderr[-5000:]
    pages = nav_pages()
    on_disk = sorted(str(p.relative_to(REPO / "docs")) for p in (REPO / "docs").rglob("*.md"))
    assert sorted(pages) == on_disk, "every page is in the navigation, and only pages"
    for page in pages:
        assert (tmp_path / page_path(page) / "index.html").exists(), f"{page} was not built"
    api = (tmp_path / "reference/api/index.html").read_text()
    undocumented = [n for n in pyspark_abs.__all__ if f'id="pyspark_abs.{n}"' not in api]
    # AbsConfig is on the configuration page, as the table generated from its fields
    assert undocumented == ["AbsConfig"], "the API page documents every public name"
    errors = (tmp_path / "reference/errors/index.html").read_text()
    missing = [
        c.__name__ for c in error_classes() if f'id="pyspark_abs.errors.{c.__name__}"' not in errors
    ]
    assert missing == [], "the errors page documents every error class"
    configuration = (tmp_path / "operations/configuration/index.html").read_text()
    for field in dataclasses.fields(AbsConfig):
        conf = "(code only)" if field.name in CODE_ONLY else spark_conf_key(field.name)
        row = rf"<td><code>{field.name}</code></td>\s*<td>(<code>)?{re.escape(conf)}"
        assert re.search(row, configuration), f"the configuration page has no row {field.name}"


def test_every_page_has_one_title() -> None:
    for page in nav_pages():
        fenced, titles = False, 0
        for line in (REPO / "docs" / page).read_text().splitlines():
            fenced = fenced != line.startswith("```")
            titles += not fenced and line.startswith("# ")
        assert titles == 1, f"{page} has {titles} level-1 headings"


def test_the_readme_fits_on_two_screens_and_links_only_to_pages_that_exist() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= README_LINES
    targets = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert targets, "the README links into the documentation"
    missing = [t for t in targets if not (REPO / t).exists()]
    assert missing == []
