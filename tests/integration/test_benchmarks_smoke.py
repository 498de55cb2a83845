"""Each benchmark script runs end to end at a tiny size and reports sensible figures.

The scripts run in this process (``main(argv)``), on the session-scoped SparkSession, with
one repeat, no warm-up, few keys and few key groups; the scaling script runs on this
session's master only (its standalone cluster is not started here), and the recovery
script's restarts run in processes of their own, as they must.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

sys.path.insert(0, str(Path(__file__).parents[2] / "scripts" / "bench"))

import bench_builtin
import bench_intervals
import bench_job_latency
import bench_kafka
import bench_latency
import bench_multistage
import bench_recovery
import bench_scaling
import bench_state_scale
import bench_windows
import probe_arrow_path
import probe_call_floor
import probe_map_state

from tests.support.kafka import BROKER, KAFKA_JARS

TINY = [
    "--records",
    "2000",
    "--keys",
    "200",
    "--epochs",
    "2",
    "--repeats",
    "1",
    "--key-groups",
    "4",
    "--partitions",
    "2",
    "--no-warm-up",
]


def positive(values: dict[str, Any]) -> bool:
    return bool(values) and all(v > 0 for v in values.values())


def test_intervals(spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plot = tmp_path / "intervals.png"
    argv = [*TINY, "--intervals", "1,2", "--plot", str(plot), "--workdir", str(tmp_path / "w")]
    figures = bench_intervals.main(argv)
    kinds = ("abs_async", "abs_sync", "naiad")
    assert set(figures["records_per_s"]) == {
        "baseline",
        *(f"{kind}_every_{n}" for kind in kinds for n in (1, 2)),
    }
    assert positive(figures["records_per_s"])
    assert {k: set(v) for k, v in figures["overhead_by_interval"].items()} == {
        "abs_async": {"1", "2"},
        "abs_sync": {"1", "2"},
        "naiad": {"1", "2"},
    }
    assert figures["largest_key_group_state"]["bytes"] > 0
    assert (
        figures["largest_key_group_state"]["arrow_bytes"]
        >= figures["largest_key_group_state"]["bytes"]
    )
    assert figures["largest_key_group_state"]["keys"] > 0
    assert figures["memory_peaks"]["abs_async_every_1"]["driver_python_mib"] > 0
    assert set(figures["cpu_overhead"]) == set(figures["records_per_s"])
    assert plot.stat().st_size > 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith('{"records": 2000')


def test_windows(spark: SparkSession, tmp_path: Path) -> None:
    figures = bench_windows.main([*TINY, "--workdir", str(tmp_path)])
    assert set(figures["records_per_s"]) == {"builtin_window", "abs_baseline", "abs_async"}
    assert positive(figures["records_per_s"])
    written = set(figures["windows_written"].values())
    assert len(written) == 1, f"Spark and pyspark-abs wrote other windows: {figures}"
    assert written.pop() > 0


def test_latency(spark: SparkSession, tmp_path: Path) -> None:
    argv = ["--files", "2", "--interval", "0.1", "--repeats", "1", "--no-warm-up"]
    argv += ["--key-groups", "4", "--partitions", "2", "--workdir", str(tmp_path)]
    figures = bench_latency.main(argv)
    variants = figures["variants"]
    assert set(variants) == {"builtin_default", "abs_baseline", "abs_sync", "abs_async"}
    for variant, f in variants.items():
        assert f["files"] == 2, (variant, f)
        assert 0 < f["latency_ms_p50"] <= f["latency_ms_p99"], (variant, f)
        assert f["epoch_ms_median"] > 0, (variant, f)
    assert set(figures["ratios"]) == {
        "abs_async_vs_builtin_default",
        "abs_async_vs_abs_baseline",
        "abs_async_vs_abs_sync",
    }


def test_job_latency(spark: SparkSession, tmp_path: Path) -> None:
    argv = ["--files", "2", "--interval", "0.1", "--repeats", "1", "--no-warm-up"]
    argv += ["--key-groups", "4", "--partitions", "2", "--workdir", str(tmp_path)]
    figures = bench_job_latency.main([*argv, "--idle-seconds", "1"])
    assert 0 < figures["spark_idle_cores_median"] < 2
    variants = figures["variants"]
    assert set(variants) == {"job_async", "job_sync"}
    for variant, f in variants.items():
        assert f["files"] == 2, (variant, f)
        for stage in bench_job_latency.STAGES:
            assert 0 < f["latency_ms_p50"][stage] <= f["latency_ms_p99"][stage], (variant, f)
        assert positive(f["epoch_ms_median"]), (variant, f)
        ratio = f["latency_ms_p50"]["last"] / sum(f["epoch_ms_median"].values())
        assert f["last_p50_vs_epoch_sum"] == pytest.approx(ratio, rel=0.01)
        assert f["first_file_at_last_ms_median"] > 0, (variant, f)
        assert 0 < f["idle_cores_median"] < 2, (variant, f)


def test_builtin(spark: SparkSession, tmp_path: Path) -> None:
    figures = bench_builtin.main([*TINY, "--workdir", str(tmp_path)])
    assert set(figures["records_per_s"]) == {
        "builtin_default",
        "builtin_rocksdb",
        "plain_pandas",
        "abs_baseline",
        "abs_async",
    }
    assert positive(figures["records_per_s"])
    for ratio in ("builtin_rocksdb", "builtin_default", "abs_baseline", "plain_pandas"):
        assert figures[f"abs_async_vs_{ratio}"] > 0
    assert isinstance(figures["targets_met"], bool)
    # CPU time and memory are measured per variant, for the measured run only.
    assert all(len(runs) == 1 and runs[0] > 0 for runs in figures["cpu_seconds"].values())
    assert positive(figures["cpu_ratios"])
    assert figures["memory_peaks"]["abs_async"]["jvm_mib"] > 0
    assert figures["cpu_median_s_by_process"]["builtin_default"]["jvm"] > 0
    assert figures["cpu_median_s_by_process"]["abs_async"]["python_workers"] > 0
    # The per-query RocksDB settings do not leak into the session.
    assert spark.conf.get("spark.sql.streaming.stateStore.providerClass", None) in (None, "")


def test_scaling_on_this_sessions_master(spark: SparkSession, tmp_path: Path) -> None:
    plot = tmp_path / "scaling.png"
    master = str(spark.sparkContext.master)
    argv = [*TINY, "--masters", master, "--plot", str(plot), "--workdir", str(tmp_path / "w")]
    figures = bench_scaling.main(argv)
    assert SparkSession.getActiveSession() is spark  # reused, not replaced
    assert positive(figures["records_per_s"][master])
    assert figures["async_vs_baseline"][master] > 0
    assert plot.stat().st_size > 0


def test_multistage(spark: SparkSession, tmp_path: Path) -> None:
    figures = bench_multistage.main([*TINY, "--buckets", "20", "--workdir", str(tmp_path)])
    assert positive(figures["records_per_s"])
    for variant in ("baseline", "abs_async", "job"):
        assert positive(figures["stage_seconds"][variant])
    assert figures["job_vs_independent"] > 0
    assert figures["job_epoch_latency_s"] > 0


def test_state_scale(spark: SparkSession, tmp_path: Path) -> None:
    plot = tmp_path / "scale.png"
    argv = ["--keys", "2k,4k", "--records", "500", "--steady-epochs", "1", "--key-groups", "4"]
    argv += ["--partitions", "2", "--plot", str(plot), "--workdir", str(tmp_path / "w")]
    figures = bench_state_scale.main(argv)
    results = figures["results"]
    assert {v: set(r) for v, r in results.items()} == {
        v: {"2000", "4000"} for v in bench_state_scale.VARIANTS
    }
    assert set(results) == {
        "abs_async",
        "abs_whole",
        "abs_off",
        "builtin_rocksdb",
        "builtin_default",
    }
    for variant, by_keys in results.items():
        for figure in by_keys.values():
            assert figure["epoch_s"] > 0
            assert figure["checkpoint_bytes"] > 0
            snapshotted = variant in ("abs_async", "abs_whole")
            assert (figure["delta_bytes"] > 0) == snapshotted
            assert (figure["local_bytes"] > 0) == snapshotted
    assert plot.exists()
    assert plot.with_name("scale_bytes.png").exists()


def test_recovery(tmp_path: Path) -> None:
    argv = ["--keys", "3000", "--records", "300", "--key-groups", "4", "--partitions", "2"]
    figures = bench_recovery.main([*argv, "--workdir", str(tmp_path)])
    assert set(figures["seconds"]) == {"3000"}
    assert set(figures["seconds"]["3000"]) == set(bench_recovery.VARIANTS)
    assert positive(figures["seconds"]["3000"])
    assert set(figures["targets_met"]) == {
        "new_cluster_at_most_rocksdb",
        "new_cluster_at_most_2x_warm_at_largest",
    }


def test_map_state_probe(spark: SparkSession) -> None:
    argv = ["--keys", "500", "--records", "200", "--epochs", "1", "--key-groups", "2"]
    figures = probe_map_state.main([*argv, "--partitions", "2"])
    assert figures["epoch_s"] > 0
    assert figures["checkpoint_bytes"] > 0


def test_call_floor_probe(spark: SparkSession, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--files", "2", "--records-per-file", "50", "--keys", "40", "--key-groups", "8"]
    figures = probe_call_floor.main([*argv, "--partitions", "2", "--repeats", "1", "--no-warm-up"])
    assert set(figures["variants"]) == set(probe_call_floor.VARIANTS)
    for found in figures["variants"].values():
        assert found["epoch_ms_median"] > 0
        assert found["jvm_cpu_ms_per_file"] > 0
    with pytest.raises(SystemExit):
        probe_call_floor.main([*argv, "--variants", "abs_async,abs_sync"])
    assert "unknown variant(s) ['abs_sync']" in capsys.readouterr().err


def test_arrow_path_probe(spark: SparkSession) -> None:
    argv = ["--files", "3", "--records-per-file", "40", "--keys", "40", "--key-groups", "4"]
    figures = probe_arrow_path.main([*argv, "--partitions", "2"])
    assert figures["master"] == spark.sparkContext.master  # the test's session, reused
    stateful, grouped = figures["ways"]["stateful"], figures["ways"]["grouped_arrow"]
    # the last file's watermark passes the timeouts set before it: one more micro-batch
    assert (stateful["micro_batches"], stateful["no_data_batches"]) == (4, 1)
    assert (grouped["micro_batches"], grouped["no_data_batches"]) == (3, 0)
    assert stateful["executors"] == grouped["executors"] == 1
    assert stateful["moved_share"] == grouped["moved_share"] == 0


def test_kafka(spark: SparkSession, tmp_path: Path) -> None:
    if not os.environ.get(BROKER) or not os.environ.get(KAFKA_JARS):
        pytest.skip("no Kafka broker jars or connector (scripts/test fetches them)")
    argv = [*TINY, "--rate", "100", "--seconds", "1", "--workdir", str(tmp_path / "w")]
    figures = bench_kafka.main(argv)
    assert positive(figures["records_per_s"])
    assert figures["latency_records"] == {"builtin": 100, "abs_async": 100, "abs_kafka_sink": 100}
    for found in figures["latency_ms"].values():
        assert 0 < found["p50"] <= found["p99"]
