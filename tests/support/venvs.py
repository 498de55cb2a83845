"""Virtual environments built offline from the test environment, as users' installs are."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import pyspark


def runtime_venv(tmp_path: Path, left_out: tuple[str, ...]) -> tuple[Path, Path]:
    """A virtual environment seeing this one's libraries but those named ``left_out``.

    PySpark is seen as a runtime copy, without pip metadata. Returns its Python and its
    site-packages folder.
    """
    runtime, libraries = tmp_path / "runtime", tmp_path / "libraries"
    runtime.mkdir(parents=True)
    libraries.mkdir()
    (runtime / "pyspark").symlink_to(Path(pyspark.__file__).parent)
    site = Path(sysconfig.get_paths()["purelib"])
    for entry in site.iterdir():
        if not entry.name.startswith(("pyspark", "__editable__", "_distutils_hack", *left_out)):
            (libraries / entry.name).symlink_to(entry)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    venv_site = Path(
        subprocess.check_output(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            text=True,
        ).strip()
    )
    (venv_site / "runtime.pth").write_text(f"{runtime}\n{libraries}\n")
    return python, venv_site
