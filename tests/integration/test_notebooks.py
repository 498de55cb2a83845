"""The notebooks in notebooks/ run top to bottom against local Spark; a failing cell fails.

Each notebook runs in its own ipykernel (this interpreter, so this virtualenv), started in a
temporary directory with ``MPLBACKEND=Agg`` and ``TMPDIR`` inside pytest's temporary
directory, so nothing is written into the repository. The kernel is shut down afterwards,
also when a cell fails.
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

NOTEBOOK_DIR = Path(__file__).parents[2] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))

KERNEL_CHECK = "import os, sys\nprint(sys.executable, os.getpid(), os.getcwd(), sep='\\n')"
"""Appended to each notebook: which interpreter, process and directory the kernel ran in."""


def test_there_are_five_notebooks() -> None:
    assert [p.name for p in NOTEBOOKS] == [
        "01_quickstart.ipynb",
        "02_inspect_snapshots.ipynb",
        "03_crash_restore_rollback.ipynb",
        "04_cycles.ipynb",
        "05_medallion_job.ipynb",
    ]


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(p, marks=pytest.mark.compat) if p.stem == "01_quickstart" else p
        for p in NOTEBOOKS
    ],
    ids=lambda p: p.stem,
)
def test_notebook_runs_top_to_bottom(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    notebook = nbformat.read(path, as_version=4)  # type: ignore[no-untyped-call]
    assert notebook.metadata["kernelspec"]["name"] == "python3"
    assert all(not c.get("outputs") for c in notebook.cells if c.cell_type == "code"), (
        f"{path.name} is saved with outputs; clear them"
    )
    work, temp = tmp_path / "cwd", tmp_path / "tmp"
    work.mkdir()
    temp.mkdir()
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.delenv("DATABRICKS_RUNTIME_VERSION", raising=False)
    notebook.cells.append(nbformat.v4.new_code_cell(KERNEL_CHECK))  # type: ignore[no-untyped-call]
    before = sorted(p.name for p in NOTEBOOK_DIR.iterdir())
    client = NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(work)}}
    )
    try:
        client.execute()
    except CellExecutionError as err:
        error = re.sub(r"\x1b\[[0-9;]*m", "", str(err))  # without the traceback's colours
        pytest.fail(f"{path.name}: a cell failed\n{error}", pytrace=False)

    executable, pid, cwd = notebook.cells[-1].outputs[0]["text"].splitlines()
    assert executable == sys.executable, "the kernel ran another interpreter"
    assert Path(cwd).resolve() == work.resolve()
    assert client.km is None, "the kernel was not shut down"
    assert _gone(int(pid)), f"kernel process {pid} still runs"
    assert sorted(p.name for p in NOTEBOOK_DIR.iterdir()) == before, (
        "a notebook wrote into notebooks/"
    )


def _gone(pid: int, timeout: float = 30) -> bool:
    """Whether process ``pid`` has ended, waiting up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False
