"""The bytecode added to PySpark's zips is what Python's zip importer loads, and is checked.

A small zip stands in for ``pyspark.zip``; a fresh interpreter imports from it; no Spark.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "scripts"))

from _compile_pyspark_zips import compile_zip


def _import_from(archive: Path, statement: str) -> str:
    code = f"import sys; sys.path.insert(0, {str(archive)!r}); {statement}"
    return subprocess.run(
        [sys.executable, "-B", "-c", code], check=True, capture_output=True, text=True
    ).stdout.strip()


def test_each_module_gets_bytecode_that_the_zip_importer_loads_and_checks(tmp_path: Path) -> None:
    archive = tmp_path / "lib.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("pkg/", "")
        zipped.writestr("pkg/__init__.py", "VALUE = 1\n")
        zipped.writestr("pkg/mod.py", "def where():\n    return where.__code__.co_filename\n")

    archive.chmod(0o644)
    assert compile_zip(archive)
    assert archive.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["lib.zip"]  # no temporary file left
    with zipfile.ZipFile(archive) as zipped:
        names = zipped.namelist()
    assert names == ["pkg/", "pkg/__init__.py", "pkg/__init__.pyc", "pkg/mod.py", "pkg/mod.pyc"]
    assert not compile_zip(archive)  # a second run changes nothing

    loader = _import_from(
        archive, "import pkg.mod; print(pkg.mod.__spec__.loader.get_filename('pkg.mod'))"
    )
    assert loader.endswith("pkg/mod.pyc")
    assert (
        _import_from(archive, "import pkg.mod; print(pkg.mod.where())") == f"{archive}/pkg/mod.py"
    )

    # bytecode that no longer matches its source is not used
    with zipfile.ZipFile(archive) as zipped:
        entries = {name: zipped.read(name) for name in zipped.namelist()}
    entries["pkg/__init__.py"] = b"VALUE = 2\n"
    with zipfile.ZipFile(archive, "w") as zipped:
        for name, data in entries.items():
            zipped.writestr(name, data)
    assert _import_from(archive, "import pkg; print(pkg.VALUE)") == "2"
