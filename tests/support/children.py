"""Programs the tests run as children of their own, and stop at a chosen step."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path


def paused_child(
    command: Sequence[str], env: Mapping[str, str], log: Path
) -> subprocess.Popen[bytes]:
    """Start ``command`` in a session of its own, its output in ``log``, and return once it
    has stopped itself (SIGSTOP, e.g. by a ``pause`` fault)."""
    with log.open("w") as out:
        child = subprocess.Popen(
            command, env=dict(env), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    _, status = os.waitpid(child.pid, os.WUNTRACED)
    assert os.WIFSTOPPED(status), f"the child did not stop: {log.read_text()[-2000:]}"
    return child
