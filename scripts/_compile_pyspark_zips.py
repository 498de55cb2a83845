"""Add bytecode to the zips of the installed PySpark that Spark puts on every worker's path.

Spark puts ``pyspark/python/lib/pyspark.zip`` (and py4j's zip) ahead of site-packages on the
path of each Python process it starts, and Python never caches bytecode for a zip: every new
worker, Python data source runner and planner compiled PySpark from source again. This adds
hash-checked ``.pyc`` files beside the sources in each zip (zipimport reads them and checks
them against the source), which took about an eighth off a test file that runs pipelines
in the test session.

Run by scripts/_env.sh after it installs PySpark; running it again changes nothing.
"""

from __future__ import annotations

import compileall
import os
import tempfile
import warnings
import zipfile
from pathlib import Path
from py_compile import PycInvalidationMode

import pyspark


def compile_zip(archive: Path) -> bool:
    """Rewrite ``archive`` with a ``.pyc`` beside each ``.py``; False if it already has them."""
    with zipfile.ZipFile(archive) as zipped:
        if any(name.endswith(".pyc") for name in zipped.namelist()):
            return False
        with tempfile.TemporaryDirectory() as scratch:
            zipped.extractall(scratch)
            # ddir: tracebacks name the sources inside the zip, as without the bytecode
            with warnings.catch_warnings():  # PySpark's own tests have SyntaxWarnings
                warnings.simplefilter("ignore")
                compiled = compileall.compile_dir(
                    scratch,
                    ddir=str(archive),
                    legacy=True,
                    quiet=1,
                    invalidation_mode=PycInvalidationMode.CHECKED_HASH,
                )
            if not compiled:
                raise SystemExit(f"could not compile every module in {archive}")
            # a name of its own: two installs into one venv at once must not share it
            handle, name = tempfile.mkstemp(suffix=".zip.tmp", dir=archive.parent)
            os.close(handle)
            rebuilt = Path(name)
            try:
                with zipfile.ZipFile(rebuilt, "w", zipfile.ZIP_DEFLATED) as out:
                    for entry in zipped.infolist():
                        out.writestr(entry, zipped.read(entry))
                        if entry.filename.endswith(".py"):
                            out.write(Path(scratch, entry.filename + "c"), entry.filename + "c")
                rebuilt.chmod(archive.stat().st_mode)  # mkstemp's file is private
                os.replace(rebuilt, archive)
            except BaseException:
                rebuilt.unlink(missing_ok=True)
                raise
    return True


def main() -> None:
    lib = Path(pyspark.__file__).parent / "python" / "lib"
    for archive in sorted(lib.glob("*.zip")):
        if compile_zip(archive):
            print(f"added bytecode to {archive}")


if __name__ == "__main__":
    main()
