"""Empty the zips of the installed PySpark that Spark puts on every Python process's path.

Spark puts ``pyspark/python/lib/pyspark.zip`` (and py4j's zip) ahead of site-packages on the
path of each Python process it starts. Python caches no bytecode for a zip, and Spark clears
the import caches as a process starts, which makes Python read the zip's directory again:
a data source runner, planner or worker spent about 0.65 s starting against 0.33 s from
site-packages (a job test starts some twenty). The venv holds the same PySpark and py4j in
site-packages, so each zip is replaced by an empty one and the imports fall through to them.

Run by scripts/_env.sh after it installs PySpark; running it again changes nothing.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
import zipfile
from pathlib import Path

import pyspark


def empty_zip(archive: Path) -> bool:
    """Replace ``archive`` by an empty zip; False if it is empty already.

    Raises:
        SystemExit: A package in the zip is not importable without it.
    """
    with zipfile.ZipFile(archive) as zipped:
        names = zipped.namelist()
    if not names:
        return False
    for package in sorted({n.split("/")[0] for n in names if "/" in n}):
        if importlib.util.find_spec(package) is None:
            raise SystemExit(f"{archive} holds {package}, which is not installed beside it")
    # a name of its own: two installs into one venv at once must not share it
    handle, name = tempfile.mkstemp(suffix=".zip.tmp", dir=archive.parent)
    os.close(handle)
    emptied = Path(name)
    try:
        with zipfile.ZipFile(emptied, "w"):
            pass
        emptied.chmod(archive.stat().st_mode)  # mkstemp's file is private
        os.replace(emptied, archive)
    except BaseException:
        emptied.unlink(missing_ok=True)
        raise
    return True


def main() -> None:
    lib = Path(pyspark.__file__).parent / "python" / "lib"
    for archive in sorted(lib.glob("*.zip")):
        if empty_zip(archive):
            print(f"emptied {archive}: Spark's Python processes import from site-packages")


if __name__ == "__main__":
    main()
