"""A snapshot root copied as a directory keeps the original's id: it must not write the
original's sinks, while a root that was moved (nothing left at the old place) may."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pyspark_abs.errors import PipelineMismatchError
from pyspark_abs.manifest.table import manifest_root_id
from pyspark_abs.protocol.lineage import require_own_sinks
from pyspark_abs.storage.store import DeltaStore
from tests.support.roots import PIPELINE, SINK, committed_root


def test_a_copy_may_not_write_the_originals_sink_but_a_moved_root_may(tmp_path: Path) -> None:
    root, sink, _ = committed_root(tmp_path / "a", 3)
    store = DeltaStore()
    root_id = manifest_root_id(store, root)
    copy = str(tmp_path / "copy")
    shutil.copytree(root, copy)
    assert manifest_root_id(store, copy) == root_id
    require_own_sinks(store, PIPELINE, root, root_id, {SINK: sink}, 2)
    with pytest.raises(PipelineMismatchError, match=r"is a copy of .*/a/root .* own sink"):
        require_own_sinks(store, PIPELINE, copy, root_id, {SINK: sink}, 2)
    require_own_sinks(store, PIPELINE, copy, root_id, {SINK: str(tmp_path / "new-sink")}, 2)
    own_copy = str(tmp_path / "copied-sink")  # the sink copied with the root is the copy's
    shutil.copytree(sink, own_copy)
    require_own_sinks(store, PIPELINE, copy, root_id, {SINK: own_copy}, 2)
    shutil.rmtree(root)  # a move: the copy is the root now
    require_own_sinks(store, PIPELINE, copy, root_id, {SINK: sink}, 2)
