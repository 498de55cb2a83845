"""The pyspark-abs command line against a real snapshot root."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pyspark_abs import Snapshots
from pyspark_abs.cli import main
from tests.support.inputs import EPOCHS, running_counts, write_epochs
from tests.support.pipelines import assert_same, word_pipeline


@pytest.fixture(scope="module")
def root(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("cli")
    word_pipeline(write_epochs(base / "in", EPOCHS), base / "root", bronze=True).run()
    return base / "root"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.smoke
def test_snapshots_and_describe(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "snapshots", str(root), "--json")
    assert status == 0
    listed = json.loads(out)
    assert [(s["epoch"], s["status"]) for s in listed] == [(e, "COMMITTED") for e in range(4)]
    status, out, _ = run(capsys, "snapshots", str(root))
    assert out.splitlines()[0].split()[:3] == ["epoch", "status", "recorded"]
    assert len(out.splitlines()) == 5

    status, out, _ = run(capsys, "describe", str(root), "2", "--json")
    described = json.loads(out)
    assert described["epoch"] == 2
    assert set(described["table_versions"]) == {
        "state/word_count",
        "sink/output",
    }
    assert str(round(described["batch_ms"], 1)) == str(described["batch_ms"])
    status, out, _ = run(capsys, "describe", str(root), "2")
    assert "table_versions:" in out
    assert "state/word_count:" in out
    assert f"batch_ms: {described['batch_ms']}\n" in out


def test_state_prints_the_state_as_of_an_epoch(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = run(
        capsys, "state", str(root), "word_count", "--epoch", "1", "--json", "--limit", "100"
    )
    assert status == 0
    counts = {r["word"]: r["count"] for r in json.loads(out)}
    assert counts == running_counts(EPOCHS[:2])[0]
    status, out, _ = run(capsys, "state", str(root), "word_count", "--limit", "2")
    total = len(Counter(running_counts(EPOCHS)[0]))
    assert out.splitlines()[-1] == f"({total} keys, 2 shown)"


def test_validate_compact_vacuum(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(capsys, "validate", str(root))
    assert status == 0
    assert "intact" in out
    assert "validating epoch 3 (4/4)" in err
    status, out, _ = run(capsys, "compact", str(root), "--json")
    assert status == 0
    assert json.loads(out)[0]["table"] == "state/word_count"
    status, out, _ = run(capsys, "vacuum", str(root), "--dry-run", "--json")
    assert status == 0
    assert json.loads(out)["dry_run"] is True
    status, out, _ = run(capsys, "validate", str(root), "--json")
    assert (status, json.loads(out)) == (0, {"ok": True, "problems": []})


def test_restore_copies_a_snapshot_into_a_new_root(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = tmp_path / "copy"
    status, out, _ = run(capsys, "restore", str(root), "2", "--into", str(copy), "--json")
    assert status == 0
    restored = json.loads(out)
    assert (restored["epoch"], restored["status"], restored["restored_from"]) == (2, "RESTORED", 2)
    status, out, _ = run(capsys, "snapshots", str(copy), "--json")
    assert [(s["epoch"], s["status"]) for s in json.loads(out)] == [(2, "RESTORED")]
    status, out, _ = run(capsys, "state", str(copy), "word_count", "--json", "--limit", "100")
    assert {r["word"]: r["count"] for r in json.loads(out)} == running_counts(EPOCHS[:3])[0]
    status, out, _ = run(capsys, "restore", str(root), "1", "--into", str(tmp_path / "other"))
    assert out.startswith(f"epoch 1 of {tmp_path / 'other'} RESTORED from epoch 1 of {root}")


def test_write_state_from_parquet_and_csv(
    spark: SparkSession, root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = tmp_path / "copy"
    assert run(capsys, "restore", str(root), "3", "--into", str(copy))[0] == 0
    edited = (
        Snapshots(str(copy), spark).state("word_count").withColumn("count", F.col("count") * 10)
    )
    parquet, csv = tmp_path / "edited.parquet", tmp_path / "edited.csv"
    edited.toPandas().to_parquet(parquet)
    edited.toPandas().to_csv(csv, index=False)
    operator = "pyspark_abs.examples.wordcount:word_count"

    status, out, err = run(
        capsys, "write-state", str(copy), "--operator", operator, "--from", str(parquet), "--json"
    )
    assert status == 0, err
    written = json.loads(out)
    assert (written["epoch"], written["status"], written["restored_from"]) == (4, "RESTORED", 3)
    assert "reading the state of operator 'word_count'" in err
    assert_same(Snapshots(str(copy), spark).state("word_count"), edited)

    # CSV has no types: its columns take those of the root's state table
    times_ten = edited.withColumn("count", F.col("count") * 10)
    times_ten.toPandas().to_csv(csv, index=False)
    status, out, _ = run(
        capsys, "write-state", str(copy), "--operator", operator, "--from", str(csv)
    )
    assert status == 0
    assert out.startswith("epoch 5 RESTORED with the state of operator 'word_count'")
    assert_same(Snapshots(str(copy), spark).state("word_count"), times_ten)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["snapshots", "/nonexistent/root"], "is not a pyspark-abs snapshot root"),
        (["describe", "{root}", "99"], "epoch 99 is not in snapshot root"),
        (["state", "{root}", "nope"], "operator 'nope' is not in snapshot root"),
        (["rollback", "{root}", "42"], "epoch 42 of snapshot root"),
        (["restore", "{root}", "42", "--into", "{root}-copy"], "epoch 42 of snapshot root"),
        (["restore", "{root}", "2", "--into", "{root}"], "copies a snapshot into another root"),
        (
            ["write-state", "{root}", "--operator", "no.such:thing", "--from", "x.parquet"],
            "--operator 'no.such:thing' cannot be loaded",
        ),
        (
            ["write-state", "{root}", "--operator", "json:dumps", "--from", "x.parquet"],
            "--operator 'json:dumps' is not a pyspark_abs Operator",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    root: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    status, out, err = run(capsys, *(a.format(root=root) for a in args))
    assert status == 2
    assert out == ""
    assert err.startswith("pyspark-abs: error: ")
    assert message in err
    assert len(err.strip().splitlines()) == 1


def test_validate_exits_1_with_a_report(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    damaged = tmp_path / "root"
    word_pipeline(write_epochs(tmp_path / "in", EPOCHS[:2]), damaged).run()
    victim = sorted((damaged / "state" / "word_count").glob("abs-e000000000001-*.parquet"))[0]
    victim.unlink()
    status, out, _ = run(capsys, "validate", str(damaged))
    assert status == 1
    assert out.splitlines()[0] == f"1 problem(s) in {damaged}:"
    assert f"epoch 1, table state/word_count: file {victim.name}" in out


def test_module_and_console_script(root: Path) -> None:
    module = subprocess.run(
        [sys.executable, "-m", "pyspark_abs", "snapshots", str(root), "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert module.returncode == 0, module.stderr[-3000:]
    assert len(json.loads(module.stdout)) == 4
    script = Path(sys.executable).parent / "pyspark-abs"
    usage = subprocess.run([str(script), "rollback", str(root)], capture_output=True, text=True)
    assert usage.returncode == 2
    assert "EPOCH" in usage.stderr
