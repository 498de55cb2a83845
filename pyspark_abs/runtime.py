"""The PySpark pyspark-abs runs on: the runtime's own, 4.2 or newer.

PySpark is an optional dependency (``pyspark-abs[spark]``) so that installing the package on
Databricks or another Spark platform never replaces the runtime's PySpark.
"""

from __future__ import annotations

import re

OLDEST = (4, 2)
"""The oldest PySpark whose Python data source has read limits and ``availableNow``."""


def pyspark_problem(version: str | None) -> str | None:
    """Why PySpark ``version`` (None: not importable) cannot run pyspark-abs, or None."""
    needed = f"pyspark-abs needs PySpark {OLDEST[0]}.{OLDEST[1]} or newer"
    install = (
        "pip install 'pyspark-abs[spark]' to get it with the package, or use a Databricks "
        "Runtime built on Apache Spark 4.2 or newer"
    )
    if version is None:
        return f"{needed}, and none is installed: {install}"
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None or (int(found[1]), int(found[2])) < OLDEST:
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
