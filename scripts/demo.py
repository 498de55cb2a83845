"""The pyspark-abs demo: an incremental word count that crashes, recovers and is restored.

1. Runs the word count over a directory of text files (one file per epoch) in a child
   process, which is killed right after epoch E is PREPARED, and shows the manifest the
   crash left behind: epochs before E COMMITTED, epoch E PREPARED.
2. Restarts the pipeline: recovery commits epoch E from the manifest, Spark replays the
   micro-batch (the replay is discarded), and the run finishes.
3. Checks the final state against a word count computed directly from the input.
4. Restores the snapshot of epoch E - 1 into a new root and runs the rest of the input again
   at another scale (4 key groups instead of 16): the restored state equals the recovered
   one, and the restored sink holds exactly the rows the recovered run wrote after E - 1.

Exits 0 only when every check holds.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from pyspark.sql import SparkSession

from pyspark_abs import Snapshots, local_session, restore
from pyspark_abs.examples.wordcount import count_directly
from pyspark_abs.faults import EXIT_CODE

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DIR = REPO / ".demo"
VOCABULARY = [
    "lightweight",
    "asynchronous",
    "snapshots",
    "for",
    "distributed",
    "dataflows",
    "barrier",
    "alignment",
    "state",
    "operator",
    "epoch",
    "commit",
    "prepare",
    "recover",
    "stream",
    "record",
    "channel",
    "marker",
    "snapshot",
    "consistent",
    "cut",
    "exactly",
    "once",
    "delta",
    "table",
    "spark",
    "pandas",
    "key",
    "group",
    "partition",
    "checkpoint",
]


def generate(directory: Path, files: int, seed: int) -> None:
    """Write ``files`` text files of random words, oldest first; each brings new words."""
    rng = random.Random(seed)
    directory.mkdir(parents=True)
    for i in range(files):
        known = VOCABULARY[: min(len(VOCABULARY), 8 + 3 * i)]
        lines = (" ".join(rng.choices(known, k=rng.randint(1, 6))) for _ in range(40))
        path = directory / f"text-{i:03d}.txt"
        path.write_text("\n".join(lines) + "\n")
        os.utime(path, (1_700_000_000 + 10 * i, 1_700_000_000 + 10 * i))


def run_pipeline(input_dir: Path, root: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """Run the word-count example in a child process, as a spark-submit job would."""
    command = [sys.executable, "-m", "pyspark_abs.examples.wordcount"]
    command += ["--input", str(input_dir), "--root", str(root), *options]
    log_config = REPO / "conf" / "log4j2.properties"
    env = {**os.environ, "JDK_JAVA_OPTIONS": f"-Dlog4j2.configurationFile={log_config}"}
    return subprocess.run(command, capture_output=True, text=True, env=env, check=False)


def show(snapshots: Snapshots, title: str) -> None:
    """Print one line per epoch of the manifest."""
    print(f"\n{title}")
    print(
        f"{'epoch':>5}  {'status':<9}  {'state rows':>10}  {'sink rows':>9}  "
        f"{'state keys':>10}  {'batch ms':>8}  {'align ms':>8}  {'prepare ms':>10}  "
        f"{'commit ms':>9}"
    )
    for info in snapshots.list(include_aborted=True):
        state_rows = sum(n for t, n in info.rows.items() if t.startswith("state/"))
        sink_rows = sum(n for t, n in info.rows.items() if t.startswith("sink/"))

        def ms(value: float | None) -> str:
            return "-" if value is None else f"{value:.0f}"

        print(
            f"{info.epoch:>5}  {info.status.value:<9}  {state_rows:>10}  {sink_rows:>9}  "
            f"{info.state_keys or 0:>10}  {ms(info.batch_ms):>8}  {ms(info.align_ms):>8}  "
            f"{ms(info.prepare_ms):>10}  {ms(info.commit_ms):>9}"
        )


def main() -> int:
    """Run the demo; exit 0 only if the recovered state equals a direct word count."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", type=Path, help="directory of text files (default: generated)")
    parser.add_argument("--root", type=Path, help="snapshot root (default: .demo/root)")
    parser.add_argument("--files", type=int, default=8, help="files to generate (default: 8)")
    parser.add_argument("--crash-epoch", type=int, default=3, help="epoch to crash at (default: 3)")
    args = parser.parse_args()

    input_dir = args.input or DEFAULT_DIR / "input"
    if args.input is None:
        shutil.rmtree(input_dir, ignore_errors=True)
        generate(input_dir, args.files, seed=1506)
    root = args.root or DEFAULT_DIR / "root"
    copy = root.with_name(f"{root.name}-restored")
    if args.root is None:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(copy, ignore_errors=True)
    else:
        for path in (root, copy):
            if path.exists() and any(path.iterdir()):
                print(f"{path} is not empty; give the demo a new --root", file=sys.stderr)
                return 2
    epochs = sum(1 for p in input_dir.iterdir() if p.is_file())
    if not 0 < args.crash_epoch < epochs:
        print(f"--crash-epoch must be between 1 and {epochs - 1}", file=sys.stderr)
        return 2

    print(f"word count over {epochs} files in {input_dir}, snapshots in {root}")
    print(
        f"\n[1/4] running; the process will be killed right after epoch {args.crash_epoch} "
        f"is PREPARED ..."
    )
    started = time.perf_counter()
    crashed = run_pipeline(input_dir, root, "--crash", f"after_prepared:{args.crash_epoch}")
    if crashed.returncode != EXIT_CODE:
        print(crashed.stderr[-4000:], file=sys.stderr)
        print(f"expected the injected crash (exit {EXIT_CODE}), got exit {crashed.returncode}")
        return 1
    print(f"      killed after {time.perf_counter() - started:.0f} s (exit {EXIT_CODE})")
    show(Snapshots(str(root)), "manifest after the crash:")

    print("\n[2/4] restarting on the same checkpoint ...")
    started = time.perf_counter()
    restarted = run_pipeline(input_dir, root)
    if restarted.returncode != 0:
        print(restarted.stderr[-4000:], file=sys.stderr)
        return 1
    print(restarted.stdout.strip())
    print(f"      finished after {time.perf_counter() - started:.0f} s")
    snapshots = Snapshots(str(root))
    show(snapshots, "manifest after recovery:")

    print("\n[3/4] checking the final state against a direct word count ...")
    log_config = REPO / "conf" / "log4j2.properties"
    spark = local_session(
        "pyspark-abs-demo",
        shuffle_partitions=2,
        conf={"spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={log_config}"},
    )
    snapshots = Snapshots(str(root), spark)
    state = {row["word"]: row["count"] for row in snapshots.state("word_count").collect()}
    expected = dict(count_directly(str(input_dir)))
    top = sorted(state.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
    print(f"      {len(state)} words in the state, top 5: {top}")
    if state != expected:
        missing = {w: n for w, n in expected.items() if state.get(w) != n}
        print(f"      MISMATCH for {len(missing)} word(s), e.g. {list(missing.items())[:5]}")
        return 1
    print("      the state equals the direct count: no record lost, none counted twice")
    return restore_and_compare(spark, input_dir, root, copy, args.crash_epoch - 1)


def restore_and_compare(
    spark: SparkSession, input_dir: Path, root: Path, copy: Path, epoch: int
) -> int:
    """Restore ``epoch`` of ``root`` into ``copy``, run the rest there and compare the two."""
    print(f"\n[4/4] restoring the snapshot of epoch {epoch} into {copy}, at 4 key groups ...")
    restore(str(root), epoch, str(copy))
    started = time.perf_counter()
    rerun = run_pipeline(input_dir, copy, "--key-groups", "4")
    if rerun.returncode != 0:
        print(rerun.stderr[-4000:], file=sys.stderr)
        return 1
    print(
        f"      read the files after epoch {epoch} again in {time.perf_counter() - started:.0f} s"
    )
    original, restored = Snapshots(str(root), spark), Snapshots(str(copy), spark)
    show(restored, "manifest of the restored root:")
    print(
        "      (Spark's file source lists the input from its first file again: the epochs "
        "that meet\n      files the snapshot had read skip them and write nothing)"
    )
    same_state = sorted(original.state("word_count").collect()) == sorted(
        restored.state("word_count").collect()
    )
    after = Counter(original.sink("output").collect())
    after.subtract(Counter(original.sink("output", epoch).collect()))
    same_sink = +after == Counter(restored.sink("output").collect())
    if not (same_state and same_sink):
        print(
            f"      MISMATCH: state equal {same_state}, sink after epoch {epoch} equal {same_sink}"
        )
        return 1
    print(
        f"      the restored state equals the recovered one, and its sink holds exactly the "
        f"{sum(after.values())} rows written after epoch {epoch}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
