"""A stop that interrupts ``foreachBatch`` reaches Spark as a short error in the form Spark
matches, not as a traceback that overflows Spark's pattern."""

from __future__ import annotations

import re

import pytest

from pyspark_abs.protocol.coordinator import spark_interruption

# Spark's StreamExecution.PROXY_ERROR, as Spark 4.3 builds it
PROXY_ERROR = re.compile(
    r"py4j.protocol.Py4JJavaError: An error occurred while calling((.|\r\n|\r|\n)*)"
    r"(java.lang.InterruptedException|java.io.InterruptedIOException"
    r"|java.nio.channels.ClosedByInterruptException)"
)
JAVA_TRACE = "\n".join(f"\tat org.apache.spark.Frame{i}.call(Frame.java:{i})" for i in range(400))


@pytest.mark.parametrize(
    "name",
    [
        "java.lang.InterruptedException",
        "java.io.InterruptedIOException",
        "java.nio.channels.ClosedByInterruptException",
    ],
)
def test_an_interruption_deep_in_the_chain_becomes_one_short_line_spark_matches(
    name: str,
) -> None:
    try:
        try:
            raise RuntimeError(
                f"py4j.protocol.Py4JJavaError: An error occurred while calling o42.collect.\n"
                f": {name}\n{JAVA_TRACE}"
            )
        except RuntimeError as inner:
            raise ValueError("epoch 3: pre-commit failed") from inner
    except ValueError as err:
        told = spark_interruption(err)
    assert told is not None
    assert len(told) < 200
    assert "\n" not in told
    assert PROXY_ERROR.search(told) is not None


def test_any_other_failure_is_left_as_it_is() -> None:
    err = ValueError(
        f"py4j.protocol.Py4JJavaError: An error occurred while calling o1.\n{JAVA_TRACE}"
    )
    assert spark_interruption(err) is None


def test_a_cyclic_chain_ends() -> None:
    first, second = ValueError("a"), ValueError("b")
    first.__context__, second.__context__ = second, first
    assert spark_interruption(first) is None
