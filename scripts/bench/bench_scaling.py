"""Scaling (the ABS paper's Figure 7): records/s with and without ABS on 1, 2 and 2x1 cores.

Workload W (see ``_bench.py``) under each Spark master in ``--masters`` (default
``local[1] local[2] standalone``), with and without snapshots (``AbsConfig(snapshots=False)``
against ABS async), interleaved within each master, medians of the repeats.
``standalone`` starts a Spark standalone cluster from pyspark's own jars on this machine
(one ``Master`` and two ``Worker`` JVMs with 1 core each, bound to 127.0.0.1) and stops it
afterwards. Each master gets its own SparkSession; an active session with the same master
(a test's) is reused. The plot shows records/s per master. The last line printed is one
JSON object.

    python scripts/bench/bench_scaling.py [--records N] [--keys N] [--epochs N] [--repeats N]
        [--masters local[1] local[2] standalone] [--plot PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import _bench
import _costs

from pyspark_abs import AbsConfig

VARIANTS: dict[str, dict[str, Any]] = {
    "baseline": {"snapshots": False},
    "abs_async": {"commit_mode": "async"},
}
STANDALONE = "standalone"
WORKERS = 2


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.contextmanager
def standalone_cluster(work: Path) -> Iterator[tuple[str, list[int]]]:
    """Start a Master and two 1-core Workers; yield the master URL and their pids."""
    from pyspark.find_spark_home import _find_spark_home

    spark_class = Path(_find_spark_home()) / "bin" / "spark-class"
    port = _free_port()
    url = f"spark://127.0.0.1:{port}"
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    log = (work / "cluster.log").open("wb")
    master = ["--host", "127.0.0.1", "--port", str(port), "--webui-port", str(_free_port())]
    commands = [["org.apache.spark.deploy.master.Master", *master]]
    for i in range(WORKERS):
        worker = ["--cores", "1", "--memory", "2g", "--host", "127.0.0.1"]
        worker += ["--webui-port", str(_free_port()), "--work-dir", str(work / f"worker-{i}")]
        commands.append(["org.apache.spark.deploy.worker.Worker", *worker, url])
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for command in commands:
            processes.append(
                subprocess.Popen(
                    [str(spark_class), *command], env=env, stdout=log, stderr=subprocess.STDOUT
                )
            )
            if len(processes) == 1:
                _wait_for_port(port, processes[0])
        yield url, [p.pid for p in processes]
    finally:
        for process in reversed(processes):
            process.terminate()
        for process in reversed(processes):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        log.close()


def _wait_for_port(port: int, process: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the standalone Master exited with status {process.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        time.sleep(0.2)
    raise RuntimeError(f"the standalone Master did not listen on port {port} in {timeout_s} s")


def wait_for_executors(spark: Any, count: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        # The driver is listed too.
        if spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() > count:
            return
        time.sleep(0.5)
    raise RuntimeError(f"{count} executors did not register within {timeout_s} s")


def session_for(master: str, partitions: int) -> Any:
    """A session on ``master``, replacing an active session on another master."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None and active.sparkContext.master != master:
        active.stop()
    return _bench.session(partitions, master=master)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark per master, print a table and a JSON line; return the figures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    _bench.add_workload_arguments(parser)
    parser.add_argument(
        "--masters",
        nargs="+",
        default=["local[1]", "local[2]", STANDALONE],
        help=f"Spark master URLs, or {STANDALONE!r} for a local standalone cluster",
    )
    args = parser.parse_args(argv)
    masters: list[str] = args.masters
    plot_path = args.plot or Path("bench_scaling.png")
    rates: dict[str, dict[str, float]] = {}
    costs: dict[str, dict[str, Any]] = {}
    with _bench.workdir(args.workdir) as work:
        inputs = _bench.generate(work / "input", args.records, args.keys, args.epochs)
        for master in masters:
            with contextlib.ExitStack() as stack:
                url: str = master
                roots: list[int] = []
                if master == STANDALONE:
                    url, roots = stack.enter_context(standalone_cluster(work))
                spark = session_for(url, args.partitions)
                if master == STANDALONE:
                    stack.callback(spark.stop)
                    wait_for_executors(spark, WORKERS)
                print(f"master {master} ({url})", flush=True)
                by_variant: dict[str, _costs.RunCosts] = {}

                def run(variant: str, spark: Any = spark) -> float:
                    config = AbsConfig(key_groups=args.key_groups, **VARIANTS[variant])
                    source = _bench.parquet_source(spark, inputs)
                    result = _bench.run_pipeline(
                        spark, work, variant, source, _bench.keyed_count, config
                    )
                    shutil.rmtree(result.root, ignore_errors=True)
                    return result.seconds

                seconds = _bench.interleave(
                    list(VARIANTS),
                    args.repeats,
                    _bench.measured(spark, by_variant, run, roots),
                    warm_up=args.warm_up,
                )
                _bench.print_rates(args.records, seconds, "baseline", by_variant, args.repeats)
                rates[master] = {v: args.records / _bench.median(s) for v, s in seconds.items()}
                costs[master] = _bench.cost_figures(by_variant, args.repeats)

    _bench.bar_plot(
        plot_path,
        f"Scaling ({args.records:,} records, {args.keys:,} keys)",
        "records/s",
        masters,
        {v: [rates[m][v] for m in masters] for v in VARIANTS},
    )
    figures = {
        **_bench.workload_figures(args),
        "masters": masters,
        "records_per_s": {m: {v: round(r) for v, r in rs.items()} for m, rs in rates.items()},
        "async_vs_baseline": {
            m: round(rs["abs_async"] / rs["baseline"], 3) for m, rs in rates.items()
        },
        "costs": costs,
        "plot": str(plot_path),
    }
    _bench.emit(figures)
    return figures


if __name__ == "__main__":
    main()
