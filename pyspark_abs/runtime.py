"""The Spark pyspark-abs runs on: the runtime's own, 4.0 or newer, what needs 4.2, and its workers.

PySpark is an optional dependency (``pyspark-abs[spark]``) so that installing the package on
Databricks or another Spark platform never replaces the runtime's PySpark. The operators,
snapshots, savepoints and Spark's own sources (Delta, files, Kafka) run on Spark 4.0 and
newer; the package's own streaming sources are Python data sources that plan micro-batches
with read limits and ``availableNow``, which Spark's Python data source API has since 4.2.
The module also settles a Python worker's heap as a task starts (:func:`settle_worker_heap`).
"""

from __future__ import annotations

import functools
import gc
import importlib.util
import os
import re
import subprocess
import sys
import zipimport
from typing import TYPE_CHECKING

from pyspark_abs.errors import ConfigError, SparkVersionError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

OLDEST = (4, 0)
"""The oldest PySpark pyspark-abs imports on."""

PYTHON_SOURCES = (4, 2)
"""The oldest Spark whose Python data sources have read limits and ``availableNow``."""

DATABRICKS = {(4, 0): "17.3 LTS", (4, 1): "18 LTS", (4, 2): "19"}
"""The Databricks Runtime built on each Spark version, as users know them."""


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity where the system has one."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def _release(version: str) -> tuple[int, int] | None:
    found = re.match(r"(\d+)\.(\d+)", version)
    return None if found is None else (int(found[1]), int(found[2]))


def _named(release: tuple[int, int]) -> str:
    runtime = DATABRICKS.get(release)
    suffix = f" (Databricks Runtime {runtime} or newer)" if runtime else ""
    return f"Spark {release[0]}.{release[1]}{suffix}"


def pyspark_problem(version: str | None) -> str | None:
    """Why PySpark ``version`` (None: not importable) cannot run pyspark-abs, or None."""
    needed = f"pyspark-abs needs PySpark {OLDEST[0]}.{OLDEST[1]} or newer"
    install = (
        "pip install 'pyspark-abs[spark]' to get it with the package, or use a Databricks "
        f"Runtime built on {_named(OLDEST)}"
    )
    if version is None:
        return f"{needed}, and none is installed: {install}"
    release = _release(version)
    if release is None or release < OLDEST:
        return f"{needed}, found {version}: {install}"
    return None


def require_pyspark() -> None:
    """Raise ImportError with what to do when the importable PySpark cannot run pyspark-abs."""
    try:
        import pyspark
    except ImportError:
        version = None
    else:
        version = str(getattr(pyspark, "__version__", "0.0"))
    problem = pyspark_problem(version)
    if problem is not None:
        raise ImportError(problem)


def python_source_problem(spark_version: str, feature: str, instead: str) -> str | None:
    """Why ``feature`` of a Python data source cannot run on ``spark_version``, or None."""
    release = _release(spark_version)
    if release is not None and release >= PYTHON_SOURCES:
        return None
    needs = f"{feature} needs {_named(PYTHON_SOURCES)}"
    return f"{needs}; this session runs Spark {spark_version}. {instead}"


def require_python_sources(spark: SparkSession, feature: str, instead: str) -> None:
    """Refuse ``feature`` before anything runs when the session's Spark predates 4.2.

    Raises:
        SparkVersionError: The session runs Spark 4.0 or 4.1; ``instead`` says what to use.
    """
    problem = python_source_problem(spark.version, feature, instead)
    if problem is not None:
        raise SparkVersionError(problem)


def _archive() -> str | None:
    """The zip archive (a ``--py-files`` wheel) this process imported pyspark-abs from, or None."""
    spec = importlib.util.find_spec("pyspark_abs")
    loader = None if spec is None else spec.loader
    return loader.archive if isinstance(loader, zipimport.zipimporter) else None


@functools.cache
def _finds_package(python: str, archive: str) -> bool:
    """Whether ``python`` finds pyspark-abs without ``archive`` on its path."""
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p != archive)}
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('pyspark_abs') is None)"
    try:
        return subprocess.run([python, "-c", probe], env=env, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def require_workers_import(spark: SparkSession, feature: str) -> None:
    """Refuse a Python data source whose Python workers cannot import pyspark-abs.

    Spark's Python data source workers import the package by name with the Python that
    ``spark.pyspark.python`` or ``PYSPARK_PYTHON`` names, and archives shipped with
    ``--py-files`` do not reach them. Checked only when this process imported the package
    from such an archive: that Python must find it without the archive.

    Raises:
        ConfigError: That Python does not have pyspark-abs; the message says how to install it.
    """
    archive = _archive()
    if archive is None:
        return
    python = spark.conf.get("spark.pyspark.python", None) or os.environ.get(
        "PYSPARK_PYTHON", "python3"
    )
    if not _finds_package(python, archive):
        raise ConfigError(
            f"{feature} is read by Spark's Python data source workers, which import "
            f"pyspark-abs with {python} (PYSPARK_PYTHON), and that Python does not have it: "
            f"--py-files ({archive}) does not reach those workers. Install the package into "
            f"the Python the cluster runs ({python} -m pip install pyspark-abs; on Databricks "
            f"a cluster library or %pip install pyspark-abs)"
        )


class _Heap:
    modules_at_freeze = 0
    """How many modules the process had loaded when it last froze its heap."""


def settle_worker_heap() -> None:
    """Spare a Python worker's garbage collections the objects of the modules it loaded.

    A reused PySpark worker collects garbage in full after every task, and a full collection
    walks every object the process tracks: with PySpark, pandas and pyarrow loaded, some
    80,000 of them and 30 to 90 ms, paid by every task of every epoch. Called as a task
    starts, this collects once and freezes what is left (:func:`gc.freeze`) whenever the
    worker has loaded modules since it last did, so later collections walk only what tasks
    create. A frozen object is still freed when its last reference goes. It does nothing
    outside a Spark task (a driver, a test calling a task itself) and in a worker Spark
    does not reuse, which runs no such collections.
    """
    if len(sys.modules) == _Heap.modules_at_freeze or not os.environ.get("SPARK_REUSE_WORKER"):
        return
    from pyspark import TaskContext

    if TaskContext.get() is None:
        return
    gc.collect()
    gc.freeze()
    _Heap.modules_at_freeze = len(sys.modules)
