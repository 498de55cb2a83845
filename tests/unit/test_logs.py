"""Log lines name the pipeline their thread works for, also in its background threads."""

from __future__ import annotations

import logging

import pytest

from pyspark_abs.logs import background, logger, working_for

log = logger("pyspark_abs.tests_logs")


def test_lines_name_the_pipeline_only_while_a_thread_works_for_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="pyspark_abs")
    log.info("before %d", 1)
    with working_for("silver"):
        log.info("epoch %d committed", 3)
        with working_for("gold"):
            log.info("inner")
        thread = background(log.info, "worker", "from a thread of %s", "silver")
        thread.start()
        thread.join()
    log.info("after")
    assert [r.getMessage() for r in caplog.records] == [
        "before 1",
        "[silver] epoch 3 committed",
        "[gold] inner",
        "[silver] from a thread of silver",
        "after",
    ]
    assert [getattr(r, "pipeline", None) for r in caplog.records] == [
        None,
        "silver",
        "gold",
        "silver",
        None,
    ]
    assert thread.daemon
