from pyspark_abs.errors import OperatorError, SchemaMismatchError, rebuild_from_text


def test_rebuilds_the_innermost_error_from_spark_text() -> None:
    text = (
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        '  File "x.py", line 1\n'
        "pyspark_abs.errors.SchemaMismatchError: outer\n"
        "During handling...\n"
        "pyspark_abs.errors.OperatorError: operator 'wc', epoch 3, key ('a',): the function raised\n"
        "\tat org.apache.spark..."
    )
    error = rebuild_from_text(text)
    assert isinstance(error, OperatorError)
    assert not isinstance(error, SchemaMismatchError)
    assert str(error) == "operator 'wc', epoch 3, key ('a',): the function raised"


def test_text_without_pyspark_abs_error() -> None:
    assert rebuild_from_text("java.lang.OutOfMemoryError") is None
