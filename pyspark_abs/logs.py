"""Log lines that name their pipeline: in a job, every line says which stage wrote it.

Each module logs through :func:`logger`. While a thread works for a pipeline (its start,
its micro-batches, its committer and its background compaction), every line those loggers
write starts with ``[<pipeline>]`` and its record carries the name as ``record.pipeline``
for handlers that format it themselves.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

_PIPELINE: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "pyspark_abs_pipeline", default=None
)


@contextmanager
def working_for(pipeline: str) -> Iterator[None]:
    """Name ``pipeline`` in every line logged in this thread (and its threads) meanwhile."""
    token = _PIPELINE.set(pipeline)
    try:
        yield
    finally:
        _PIPELINE.reset(token)


class _NamesPipeline(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        name = _PIPELINE.get()
        if name is not None and not hasattr(record, "pipeline"):
            record.pipeline = name
            record.msg = f"[{name}] {record.msg}"
        return True


_FILTER = _NamesPipeline()


def logger(module: str) -> logging.Logger:
    """The logger of ``module`` (``__name__``), naming the pipeline its lines are for."""
    found = logging.getLogger(module)
    found.addFilter(_FILTER)
    return found


def background(target: Callable[..., None], name: str, *args: Any) -> threading.Thread:
    """A daemon thread running ``target(*args)`` for the pipeline the caller works for."""
    context = contextvars.copy_context()
    return threading.Thread(target=context.run, args=(target, *args), name=name, daemon=True)
