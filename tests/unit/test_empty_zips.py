"""PySpark's zips are emptied, and Python then imports the packages installed beside them.

A small zip stands in for ``pyspark.zip`` ahead of a folder standing in for site-packages;
a fresh interpreter imports with both on its path, as Spark's Python processes do; no Spark.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "scripts"))

from _empty_pyspark_zips import empty_zip


def _zip(archive: Path, package: str) -> None:
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr(f"{package}/", "")
        zipped.writestr(f"{package}/__init__.py", "WHERE = 'zip'\n")
    archive.chmod(0o644)


def _import_from(path: list[Path], statement: str) -> str:
    code = f"import sys; sys.path[:0] = {[str(p) for p in path]!r}; {statement}"
    return subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout.strip()


def test_an_emptied_zip_lets_python_import_the_installed_package(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "pkg").mkdir(parents=True)
    (site / "pkg" / "__init__.py").write_text("WHERE = 'site'\n")
    archive = tmp_path / "lib" / "pkg.zip"
    archive.parent.mkdir()
    _zip(archive, "pkg")
    statement = "import pkg; print(pkg.WHERE)"
    assert _import_from([archive, site], statement) == "zip"

    sys.path.insert(0, str(site))
    try:
        assert empty_zip(archive)
        assert not empty_zip(archive)  # a second run changes nothing
    finally:
        sys.path.remove(str(site))
    assert archive.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in archive.parent.iterdir()] == ["pkg.zip"]  # no temporary file left
    with zipfile.ZipFile(archive) as zipped:
        assert zipped.namelist() == []
    assert _import_from([archive, site], statement) == "site"


def test_a_zip_whose_package_is_not_installed_is_left_as_it_is(tmp_path: Path) -> None:
    archive = tmp_path / "absent.zip"
    _zip(archive, "pyspark_abs_no_such_package")
    before = archive.read_bytes()
    with pytest.raises(SystemExit, match="pyspark_abs_no_such_package, which is not installed"):
        empty_zip(archive)
    assert archive.read_bytes() == before
