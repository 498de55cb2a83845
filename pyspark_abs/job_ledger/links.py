"""Which job a stage belongs to: a link file in the stage's snapshot root.

A stage's own start must finish its part of its job's unfinished decision before it runs,
and refuse what only the whole job may do (a state migration); the link tells it its job.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import pyarrow.fs as pafs

from pyspark_abs.errors import SnapshotNotFoundError
from pyspark_abs.job_ledger.manifest import JobManifest, open_job
from pyspark_abs.storage.root import SnapshotRoot
from pyspark_abs.storage.store import DeltaStore

LINK_FILE = "_job.json"
"""The file in a stage's snapshot root that names the job the stage belongs to."""


def link_stages(job: str, root: SnapshotRoot, stages: Mapping[str, SnapshotRoot]) -> None:
    """Write each stage root's link to the job (only where it is missing or names another).

    Raises:
        SnapshotRootError: A link cannot be written.
    """
    wanted = json.dumps({"job": job, "root": root}).encode()
    for stage_root in stages.values():
        fs, path = pafs.FileSystem.from_uri(stage_root)
        link = f"{path}/{LINK_FILE}"
        if _read(fs, link) == wanted:
            continue
        fs.create_dir(path, recursive=True)
        with fs.open_output_stream(link) as out:
            out.write(wanted)


def linked_job(store: DeltaStore, root: SnapshotRoot) -> JobManifest | None:
    """The manifest of the job whose stage ``root`` is, or None if it is no job's stage."""
    fs, path = pafs.FileSystem.from_uri(root)
    data = _read(fs, f"{path}/{LINK_FILE}")
    if data is None:
        return None
    job_root = SnapshotRoot(json.loads(data)["root"])
    try:
        manifest = open_job(store, job_root, None)
    except SnapshotNotFoundError:
        return None  # the job root was removed: the stage is on its own again
    return manifest if manifest.stage_of(root) is not None else None


def _read(fs: pafs.FileSystem, path: str) -> bytes | None:
    try:
        with fs.open_input_stream(path) as stream:
            return bytes(stream.read())
    except FileNotFoundError:
        return None
