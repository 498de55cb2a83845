"""The benchmarks' CPU accounting books each process's CPU time to its kind of process, also
once Spark's JVM has reaped it; real processes, no Spark."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "scripts" / "bench"))

import _costs
from _costs import cpu_kind

SCRIPTS = Path(_costs.__file__).parent

# A parent that calls itself "java" (as Spark's JVM is named), then on a line of input runs
# the Python child the line names, reaps it and says so. "burn" burns 0.4 s of CPU time, then
# idles 0.3 s so that a sampler slowed by a loaded machine still sees all of it; "orphan"
# forks a grandchild that burns 0.15 s and idles 0.3 s (so that a slowed sampler sees it), and
# exits then, which leaves the grandchild's further burn to init.
FAKE_JVM = """
import ctypes, subprocess, sys
ctypes.CDLL(None).prctl(15, b"java", 0, 0, 0)
print("ready", flush=True)
burn = "import time\\nwhile time.process_time() < 0.4: pass\\ntime.sleep(0.3)"
orphan = (
    "import os, time\\nr, w = os.pipe()\\nif os.fork():\\n    os.read(r, 1)\\nelse:\\n"
    "    while time.process_time() < 0.15: pass\\n    time.sleep(0.3)\\n    os.write(w, b'x')\\n"
) + "".join("    " + line + "\\n" for line in burn.splitlines())
for line in sys.stdin:
    subprocess.run([sys.executable, "-c", {"burn": burn, "orphan": orphan}[line.strip()]])
    print("reaped", flush=True)
"""

# Runs FAKE_JVM (argv[2]) under a CostSampler every argv[3] seconds, has it run child argv[4],
# and prints the CPU time by kind.
SAMPLED = """
import json, subprocess, sys
sys.path.insert(0, sys.argv[1])
from _costs import CostSampler
fake, interval, child = sys.argv[2], float(sys.argv[3]), sys.argv[4]
jvm = subprocess.Popen(
    [sys.executable, "-c", fake], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
)
assert jvm.stdout.readline() == "ready\\n"
with CostSampler([jvm.pid], interval_s=interval) as sampler:
    jvm.stdin.write(child + "\\n")
    jvm.stdin.flush()
    assert jvm.stdout.readline() == "reaped\\n"
jvm.stdin.close()
jvm.wait(timeout=30)
print(json.dumps(sampler.costs.cpu_by_process[0]))
"""


@pytest.mark.parametrize(
    ("name", "is_driver", "kind"),
    [("java", False, "jvm"), ("python3.11", False, "python_workers"), ("python3", True, "driver")],
)
def test_a_process_is_booked_to_its_kind(name: str, is_driver: bool, kind: str) -> None:
    assert cpu_kind(name, is_driver) == kind


def spent_around_a_reaped_child(interval_s: float, child: str = "burn") -> dict[str, float]:
    """The CPU time by kind of a fake JVM's run of one ``child``, sampled every
    ``interval_s``.

    The sampler runs in a fresh process: it books the driver's whole process tree, and in
    this one a Spark session's real JVM and workers may be running.
    """
    found = subprocess.run(
        [sys.executable, "-c", SAMPLED, str(SCRIPTS), FAKE_JVM, str(interval_s), child],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    spent: dict[str, float] = json.loads(found.stdout)
    return spent


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_worker_the_jvm_reaps_stays_booked_to_the_workers() -> None:
    spent = spent_around_a_reaped_child(0.02)
    assert spent["python_workers"] >= 0.3, spent
    assert spent["jvm"] < 0.15, spent


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_child_too_short_lived_to_be_seen_is_booked_to_its_parent() -> None:
    spent = spent_around_a_reaped_child(60)
    assert spent["jvm"] >= 0.35, spent
    assert spent["python_workers"] < 0.05, spent


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_grandchild_left_to_init_is_booked_what_it_spent_in_the_tree() -> None:
    spent = spent_around_a_reaped_child(0.02, "orphan")
    assert 0.1 <= spent["python_workers"] <= 0.5, spent
    assert spent["jvm"] >= 0, spent
