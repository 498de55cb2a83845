"""The benchmarks' CPU accounting books a worker's CPU to workers, also once a JVM reaped it;
real processes, no Spark."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "scripts"))

from _bench import CostSampler, cpu_kinds

# A parent that calls itself "java" (as Spark's JVM is named), then on each line of input
# runs a Python child that burns 0.4 s of CPU time, reaps it and says so.
FAKE_JVM = """
import ctypes, subprocess, sys
ctypes.CDLL(None).prctl(15, b"java", 0, 0, 0)
print("ready", flush=True)
for _ in sys.stdin:
    burn = "import time\\nwhile time.process_time() < 0.4: pass"
    subprocess.run([sys.executable, "-c", burn], check=True)
    print("reaped", flush=True)
"""


@pytest.mark.parametrize(
    ("name", "is_driver", "kinds"),
    [
        ("java", False, ("jvm", "python_workers")),
        ("python3.11", False, ("python_workers", "python_workers")),
        ("python3.11", True, ("driver", "jvm")),
    ],
)
def test_each_process_books_its_own_time_and_its_reaped_childrens(
    name: str, is_driver: bool, kinds: tuple[str, str]
) -> None:
    assert cpu_kinds(name, is_driver) == kinds


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_worker_the_jvm_reaps_stays_booked_to_the_workers() -> None:
    jvm = subprocess.Popen(
        [sys.executable, "-c", FAKE_JVM], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert jvm.stdin is not None
    assert jvm.stdout is not None
    try:
        assert jvm.stdout.readline() == "ready\n"
        with CostSampler([jvm.pid], interval_s=60) as sampler:
            jvm.stdin.write("go\n")
            jvm.stdin.flush()
            assert jvm.stdout.readline() == "reaped\n"
    finally:
        jvm.stdin.close()
        jvm.wait(timeout=30)
    spent = sampler.costs.cpu_by_process[0]
    assert spent["python_workers"] >= 0.35, spent
    assert spent["jvm"] < 0.2, spent
