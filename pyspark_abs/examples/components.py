"""Streaming connected components by label propagation: a pipeline with a feedback loop.

Edges stream in from a Delta table. Every vertex keeps the smallest label it has seen
(initially its own id) and its neighbours. A vertex whose label drops sends the new label to
its neighbours, and a new edge makes both ends send theirs across it; those offers travel
over the back-edge ``offers`` and come back as input in a later epoch. When the pipeline is
quiescent, every vertex is labelled with the smallest vertex id of its component.

Run it as a program (``scripts/examples/connected_components.py`` does the same)::

    python -m pyspark_abs.examples.components --root DIR [--edges FILE.csv]

``FILE.csv`` has two integer columns ``src,dst``; without it a random graph is generated.
The program exits 0 only if the components equal a union-find over the edge file.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pyspark_abs.config import AbsConfig
from pyspark_abs.errors import SourceError
from pyspark_abs.operators.contract import KeyGroupContext, KeyGroupResult, vectorized_operator
from pyspark_abs.pipeline.backedge import BackEdge
from pyspark_abs.pipeline.declaration import Pipeline
from pyspark_abs.session import local_session
from pyspark_abs.snapshots.reading import Snapshots
from pyspark_abs.sources import DeltaSource

EDGE_SCHEMA = pa.schema([("src", pa.int64()), ("dst", pa.int64())])
_NONE = np.empty(0, dtype=np.int64)


@vectorized_operator(
    key="vertex",
    state_schema="label long, neighbors array<long>",
    outputs={"labels": "vertex long, label long", "offers": "vertex long, label long"},
)
def propagate(rows: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext) -> KeyGroupResult:
    """Label propagation for one key group of vertices.

    Input rows are edge ends (``neighbor`` set) or label offers (``label`` set).
    """
    pairs = zip(state["label"].tolist(), state["neighbors"], strict=True)
    known = dict(zip(state["vertex"].tolist(), pairs, strict=True))
    offers = rows.loc[rows["label"].notna()]
    best = offers.groupby("vertex")["label"].min().astype("int64").to_dict()
    edges = rows.loc[rows["neighbor"].notna()]
    added_of = {
        int(str(v)): np.unique(n.to_numpy(np.int64)) for v, n in edges.groupby("vertex")["neighbor"]
    }
    changed: list[tuple[int, int, np.ndarray]] = []
    dropped: list[tuple[int, int]] = []
    targets: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    for vertex in pd.unique(rows["vertex"]).tolist():
        old = known.get(vertex)
        label, neighbors = (vertex, _NONE) if old is None else (int(old[0]), old[1])
        new_label = min(label, best.get(vertex, label))
        added = np.setdiff1d(added_of.get(vertex, _NONE), neighbors, assume_unique=True)
        lowered = old is None or new_label < label
        if lowered:
            dropped.append((vertex, new_label))
        if lowered or len(added):
            neighbors = np.concatenate([neighbors, added]) if len(added) else neighbors
            changed.append((vertex, new_label, neighbors))
        send = neighbors if lowered else added
        if len(send):
            targets.append(send)
            labels.append(np.full(len(send), new_label, dtype=np.int64))
    new_state = pd.DataFrame(changed, columns=["vertex", "label", "neighbors"])
    out = pd.DataFrame(dropped, columns=["vertex", "label"])
    sent = pd.DataFrame(
        {
            "vertex": np.concatenate(targets) if targets else _NONE,
            "label": np.concatenate(labels) if labels else _NONE,
        }
    )
    return KeyGroupResult(state=new_state, output={"labels": out, "offers": sent})


def both_directions(edges: DataFrame) -> DataFrame:
    """Each edge as two rows, one per end: ``vertex``, ``neighbor`` and a null ``label``."""
    ends = F.array(
        F.struct(F.col("src").alias("vertex"), F.col("dst").alias("neighbor")),
        F.struct(F.col("dst").alias("vertex"), F.col("src").alias("neighbor")),
    )
    return (
        edges.select(F.explode(ends).alias("end"))
        .select("end.vertex", "end.neighbor")
        .withColumn("label", F.lit(None).cast("long"))
    )


def build(
    spark: SparkSession,
    edges_table: str,
    root: str,
    *,
    edges_per_epoch: int | None = None,
    config: AbsConfig | None = None,
    checkpoint: str | None = None,
) -> Pipeline:
    """The connected-components pipeline over the edge table ``edges_table``."""
    return Pipeline(
        "components",
        DeltaSource(edges_table, max_rows_per_trigger=edges_per_epoch),
        propagate,
        root=root,
        sinks={"labels": f"{root}/sinks/labels"},
        back_edges=[BackEdge("offers")],
        transform=both_directions,
        config=config,
        checkpoint=checkpoint,
    )


def union_find(edges: pa.Table) -> dict[int, int]:
    """Each vertex's component label (its smallest vertex id), computed directly."""
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        root = x
        while parent.setdefault(root, root) != root:
            root = parent[root]
        while parent[x] != root:
            parent[x], x = root, parent[x]
        return root

    src: list[int] = edges["src"].to_numpy().tolist()
    dst: list[int] = edges["dst"].to_numpy().tolist()
    for a, b in zip(src, dst, strict=True):
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    return {v: find(v) for v in parent}


def components(root: str) -> dict[int, int]:
    """The labels of the newest snapshot of a components pipeline, read without Spark."""
    state = Snapshots(root).state_table("propagate")
    vertices: list[int] = state["vertex"].to_numpy().tolist()
    labels: list[int] = state["label"].to_numpy().tolist()
    return dict(zip(vertices, labels, strict=True))


def generate(shape: str, size: int, seed: int) -> pa.Table:
    """A test graph of about ``size`` edges with shuffled vertex ids.

    Shapes: ``random`` (``size`` random edges over ``size // 2`` vertices), ``chain`` (a
    path), ``star`` (one hub), ``small`` (many components of 2 to 5 vertices), and ``mixed``
    (a chain, a star and small components side by side).
    """
    rng = np.random.default_rng(seed)
    src, dst = _shape(shape, size, rng)
    ids = rng.permutation(int(max(src.max(), dst.max())) + 1)
    order = rng.permutation(len(src))
    columns = [pa.array(ids[src][order]), pa.array(ids[dst][order])]
    return pa.Table.from_arrays(columns, schema=EDGE_SCHEMA)


def _shape(shape: str, size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    if shape == "random":
        n = max(2, size // 2)
        return rng.integers(0, n, size), rng.integers(0, n, size)
    if shape == "chain":
        return np.arange(size), np.arange(1, size + 1)
    if shape == "star":
        return np.zeros(size, dtype=np.int64), np.arange(1, size + 1)
    if shape == "small":
        sizes = rng.integers(2, 6, size)
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        src = np.concatenate([np.full(k - 1, s) for s, k in zip(starts, sizes, strict=True)])
        dst = np.concatenate([s + np.arange(1, k) for s, k in zip(starts, sizes, strict=True)])
        return src[:size], dst[:size]
    if shape == "mixed":
        parts = [_shape(s, max(1, size // 3), rng) for s in ("chain", "star", "small")]
        shifted, offset = [], 0
        for src, dst in parts:
            shifted.append((src + offset, dst + offset))
            offset += int(max(src.max(), dst.max())) + 1
        return np.concatenate([s for s, _ in shifted]), np.concatenate([d for _, d in shifted])
    raise ValueError(f"unknown graph shape {shape!r}; use random, chain, star, small or mixed")


def read_edges(path: str) -> pa.Table:
    """Read an edge CSV with the integer columns ``src`` and ``dst``.

    Raises:
        SourceError: The file cannot be read or lacks the columns.
    """
    try:
        table = pacsv.read_csv(path)
    except (OSError, pa.ArrowInvalid) as err:
        raise SourceError(f"cannot read edge file {path}: {err}") from None
    if table.column_names[:2] != ["src", "dst"]:
        raise SourceError(
            f"edge file {path} must start with the header src,dst; it has {table.column_names}"
        )
    try:
        return table.select(["src", "dst"]).cast(EDGE_SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
        raise SourceError(f"edge file {path}: src and dst must be integers ({err})") from None


def write_edges(edges: pa.Table, table: str) -> None:
    """Write edges as a new Delta table."""
    from deltalake import write_deltalake

    write_deltalake(table, edges, mode="error")


def main(argv: Sequence[str] | None = None) -> int:
    """Run connected components until quiescent and check them against a union-find."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, help="snapshot root (input and sinks inside)")
    parser.add_argument("--edges", help="CSV file with columns src,dst (default: generated)")
    parser.add_argument("--generate", type=int, default=100_000, help="edges to generate")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--edges-per-epoch", type=int, default=25_000)
    parser.add_argument("--max-epochs", type=int, default=500)
    parser.add_argument("--commit-mode", choices=["sync", "async"], default="async")
    parser.add_argument("--key-groups", type=int, default=64)
    args = parser.parse_args(argv)
    edges = read_edges(args.edges) if args.edges else generate("random", args.generate, args.seed)
    table = str(Path(args.root) / "input" / "edges")
    if not Path(table).exists():
        write_edges(edges, table)
    spark = local_session("components", shuffle_partitions=2)
    config = AbsConfig(commit_mode=args.commit_mode, key_groups=args.key_groups)
    pipeline = build(spark, table, args.root, edges_per_epoch=args.edges_per_epoch, config=config)
    started = time.perf_counter()
    outcome = pipeline.run_until_quiescent(max_epochs=args.max_epochs)
    found, expected = components(args.root), union_find(edges)
    wrong = sum(found.get(v) != label for v, label in expected.items())
    report = {
        "edges": edges.num_rows,
        "vertices": len(expected),
        "components": len(set(expected.values())),
        "quiescent_epoch": outcome.epoch,
        "epochs_run": outcome.epochs_run,
        "seconds": round(time.perf_counter() - started, 1),
        "wrong_labels": wrong,
        "extra_vertices": len(set(found) - set(expected)),
    }
    print(json.dumps(report))
    return 0 if wrong == 0 and report["extra_vertices"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
