"""Tables on an S3 API (moto's server on 127.0.0.1): what delta-rs lists, pyarrow reads."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from pyspark_abs import ConcurrentWriteError
from pyspark_abs.storage.store import DeltaStore, TableSpec
from tests.support.inputs import arrow_schema
from tests.support.s3 import s3_environment, s3_server

BUCKET = "abs-roots"
SCHEMA = arrow_schema(("epoch", pa.int64()), ("word", pa.string()))


@pytest.fixture(scope="module")
def bucket(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A bucket on a local S3 server, with the environment pointing delta-rs and pyarrow at it."""
    with s3_server(tmp_path_factory.mktemp("s3")) as endpoint, pytest.MonkeyPatch.context() as env:
        for name, value in s3_environment(endpoint).items():
            env.setenv(name, value)
        pafs.S3FileSystem(endpoint_override=endpoint, allow_bucket_creation=True).create_dir(BUCKET)
        yield f"s3://{BUCKET}"


@pytest.mark.parametrize("conditional_put", ["etag", None])
def test_a_table_on_s3_is_read_back_and_its_compare_and_swap_holds(
    bucket: str, conditional_put: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With delta-rs's conditional put set, and without it (S3's own If-None-Match)."""
    if conditional_put is None:
        monkeypatch.delenv("AWS_CONDITIONAL_PUT")
    store, uri = DeltaStore(), f"{bucket}/{conditional_put}/_manifest"
    store.ensure_table(TableSpec("_manifest", uri, SCHEMA))
    first = pa.table({"epoch": [0, 0], "word": ["a", "b"]}, schema=SCHEMA)
    second = pa.table({"epoch": [1], "word": ["c"]}, schema=SCHEMA)
    store.append(uri, first)
    rows, version = store.read_versioned(uri)
    assert rows.sort_by("word").equals(first)
    assert store.append(uri, second, expected_version=version) == version + 1
    with pytest.raises(ConcurrentWriteError):
        store.append(uri, second, expected_version=version)
    assert store.read(uri).sort_by("word").equals(pa.concat_tables([first, second]))
    assert store.read(uri, version=version, columns=["word"]).column("word").to_pylist() in (
        ["a", "b"],
        ["b", "a"],
    )
