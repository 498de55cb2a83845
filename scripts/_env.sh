# Sourced by scripts/demo and scripts/test: make sure .venv holds the project and its
# test dependencies at the pinned versions, (re)installing only when they changed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v java >/dev/null 2>&1; then
    echo "pyspark-abs needs Java 17 or 21 on PATH for Spark (e.g. apt-get install openjdk-17-jre-headless)" >&2
    exit 2
fi

VENV="${ABS_VENV:-.venv}"
PYTHON="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
    echo "creating $VENV" >&2
    "$PYTHON" -m venv "$VENV"
fi
# ABS_PYSPARK=X.Y.Z pins that PySpark in place of constraints.txt's (scripts/test_spark_versions)
constraints="$VENV/constraints.txt"
grep -v '^pyspark==' constraints.txt > "$constraints"
echo "pyspark==${ABS_PYSPARK:-$(sed -n 's/^pyspark==//p' constraints.txt)}" >> "$constraints"
stamp="$VENV/.pyspark-abs-installed"
wanted="$(cat setup.cfg pyproject.toml "$constraints" | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$wanted" ]; then
    echo "installing pyspark-abs and its test dependencies into $VENV" >&2
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
        -c "$constraints" -e ".[test]"
    "$VENV/bin/python" scripts/_empty_pyspark_zips.py
    echo "$wanted" > "$stamp"
fi
export PATH="$PWD/$VENV/bin:$PATH"
# How scripts/test and scripts/test_spark_versions run a whole suite: its test files on
# ABS_TEST_WORKERS processes (default 2), each with a SparkSession of its own
pytest_workers=(--numprocesses "${ABS_TEST_WORKERS:-2}" --dist loadfile)
