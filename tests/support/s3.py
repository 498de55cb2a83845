"""A local S3 API (moto's server on 127.0.0.1), started and stopped within bounded times."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.servers import free_port, serving

START_SECONDS = 30


@contextmanager
def s3_server(workdir: Path) -> Iterator[str]:
    """Run moto's S3 server on a free local port; yield its endpoint URL."""
    port = free_port()
    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    with serving(command, port, workdir / "moto.log", START_SECONDS):
        yield f"http://127.0.0.1:{port}"


def s3_environment(endpoint: str) -> dict[str, str]:
    """What delta-rs and pyarrow need in the environment to use the local server."""
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ALLOW_HTTP": "true",
        "AWS_CONDITIONAL_PUT": "etag",
    }
