"""Installing the wheel where a Spark runtime already provides PySpark keeps that PySpark.

Databricks puts its PySpark on the path without pip metadata; a package that required
``pyspark`` would make pip install another one over it. This builds the wheel and installs
it, offline, into a new virtual environment whose only PySpark is such a runtime copy.
"""

from __future__ import annotations

import email
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pyspark

REPO = Path(__file__).parents[2]


def test_the_wheel_leaves_the_runtime_pyspark_in_place(tmp_path: Path) -> None:
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run([*build, "-w", str(tmp_path / "dist"), str(REPO)], check=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("pyspark_abs-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = email.message_from_bytes(archive.read(name))
    requirements = metadata.get_all("Requires-Dist") or []
    needs_pyspark = [r for r in requirements if re.match(r"pyspark\b(?!-)", r)]
    assert needs_pyspark == ['pyspark<5,>=4.2; extra == "spark"'], needs_pyspark

    # The runtime: PySpark importable without pip metadata; the other dependencies installed.
    runtime, libraries = tmp_path / "runtime", tmp_path / "libraries"
    runtime.mkdir()
    libraries.mkdir()
    (runtime / "pyspark").symlink_to(Path(pyspark.__file__).parent)
    site = Path(sysconfig.get_paths()["purelib"])
    for entry in site.iterdir():
        if not entry.name.startswith(("pyspark", "__editable__", "_distutils_hack")):
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

    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-2000:]
    assert "Successfully installed pyspark-abs-" in install.stdout
    assert "pyspark-4" not in install.stdout
    where = subprocess.check_output(
        [
            str(python),
            "-c",
            "import pyspark, pyspark_abs; print(pyspark.__file__, pyspark_abs.__file__)",
        ],
        text=True,
        cwd=tmp_path,
    ).split()
    assert where[0] == str(runtime / "pyspark" / "__init__.py")
    assert where[1].startswith(str(venv_site))
