"""Servers the tests start on 127.0.0.1: a free port, and a process started and stopped
within bounded times."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

STOP_SECONDS = 30


def free_port() -> int:
    """A local port nobody listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextmanager
def serving(command: Sequence[str], port: int, log: Path, start_seconds: float) -> Iterator[None]:
    """Run ``command`` until the block ends; enter once it accepts connections on ``port``.

    Raises:
        RuntimeError: It exited, or did not listen within ``start_seconds`` (see ``log``).
    """
    with log.open("w") as output:
        server = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + start_seconds
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{command[0]} did not start; see {log}") from None
                time.sleep(0.2)
        yield
    finally:
        server.terminate()
        try:
            server.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(STOP_SECONDS)
