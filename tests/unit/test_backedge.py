"""Back-edge declarations, loop-head offsets and the examples' pure parts, without Spark."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from pyspark_abs.errors import OperatorDefinitionError
from pyspark_abs.examples import components
from pyspark_abs.manifest.entries import EpochStatus, ManifestEntry
from pyspark_abs.operators.contract import Clock, KeyGroupContext
from pyspark_abs.pipeline.backedge import BackEdge, check_back_edges, check_loop_schema
from pyspark_abs.sources.backedge_log import consumed_before, split_offsets
from pyspark_abs.sources.delta.offsets import Offset
from tests.support.inputs import arrow_schema
from tests.support.manifest import entry


def test_loop_head_offsets_carry_their_tag_but_compare_by_position() -> None:
    tagged = Offset(3, 7, tag="offers")
    assert tagged.to_dict() == {
        "source": "pyspark_abs_delta",
        "version": 3,
        "index": 7,
        "tag": "offers",
    }
    assert Offset.parse(tagged.to_dict()) == Offset(3, 7)
    assert Offset.parse(tagged.to_dict()).tag == "offers"
    assert "tag" not in Offset(3, 7).to_dict()
    with pytest.raises(ValueError, match="tag must be a string"):
        Offset.parse({**Offset(1, 0).to_dict(), "tag": 5})
    with pytest.raises(ValueError, match="exactly the keys"):
        Offset.parse({**Offset(1, 0).to_dict(), "edge": "x"})


def test_split_offsets_separates_loop_heads_from_other_sources() -> None:
    lines = [
        json.dumps(Offset(0, 500).to_dict()),
        json.dumps(Offset(4, 0, tag="offers").to_dict()),
        '{"logOffset":3}',
        json.dumps(Offset(9, 2, tag="retry").to_dict()),
        "not json",
    ]
    others, loops = split_offsets("\n".join(lines))
    assert others == [lines[0], lines[2], lines[4]]
    assert loops == {"offers": Offset(4, 0), "retry": Offset(9, 2)}
    assert split_offsets(None) == ([], {})


def snapshot(
    epoch: int, log_version: int | None, *offsets: Offset, origin: str | None = None
) -> ManifestEntry:
    """A COMMITTED (or, with an origin, RESTORED) epoch whose loop heads read ``offsets``."""
    return entry(
        epoch,
        EpochStatus.RESTORED if origin else EpochStatus.COMMITTED,
        table_versions={} if log_version is None else {"backedge/offers": log_version},
        source_offsets="\n".join(json.dumps(o.to_dict()) for o in offsets),
        origin=origin,
    )


def test_a_snapshot_consumed_its_log_up_to_its_loop_head() -> None:
    source = Offset(0, 100)
    assert consumed_before(snapshot(4, 6, source, Offset(3, 2, tag="offers")), "offers") == 3
    assert consumed_before(snapshot(5, 8, Offset(7, 0, tag="offers"), source), "offers") == 7
    # A restore epoch rewrote the log at its own version; its loop head starts there.
    assert consumed_before(snapshot(6, 9, source, origin="rollback to 4"), "offers") == 9
    # A snapshot whose loop head has read nothing yet, or that has no such edge.
    assert consumed_before(snapshot(0, 1, source), "offers") == 0
    assert consumed_before(snapshot(1, None, source), "offers") == 0
    assert consumed_before(snapshot(5, 8, Offset(7, 0, tag="offers")), "retry") == 0


OUTPUTS = ["labels", "offers"]


@pytest.mark.parametrize(
    ("edges", "sinks", "message"),
    [
        ([BackEdge("nope")], [], r"loops output 'nope', which the operator does not declare"),
        ([BackEdge("offers")], ["offers"], r"also has a sink"),
        ([BackEdge("offers"), BackEdge("offers", name="b")], [], r"declared twice"),
        ([BackEdge("offers", name="a b")], [], r"back-edge id 'a b'"),
        (["offers"], [], r"takes BackEdge\(...\) declarations, got str"),
    ],
)
def test_back_edge_declarations_are_checked(
    edges: list[BackEdge], sinks: list[str], message: str
) -> None:
    with pytest.raises(OperatorDefinitionError, match=message):
        check_back_edges("cc", edges, OUTPUTS, sinks)


def test_loop_rows_must_fit_the_input() -> None:
    source = arrow_schema(("vertex", pa.int64()), ("neighbor", pa.int64()), ("label", pa.int64()))
    edge = BackEdge("offers")
    check_loop_schema(
        "cc", edge, arrow_schema(("vertex", pa.int64()), ("label", pa.int64())), source, ["vertex"]
    )
    loop = arrow_schema(("label", pa.int32()), ("other", pa.string()))
    with pytest.raises(OperatorDefinitionError) as err:
        check_loop_schema("cc", edge, loop, source, ["vertex"])
    text = str(err.value)
    assert "['other'] are not input columns" in text
    assert "label: int32 (input: int64)" in text
    assert "key column(s) ['vertex'] are missing" in text


@pytest.mark.parametrize(("shape", "components_"), [("chain", 1), ("star", 1), ("mixed", 5)])
def test_generated_shapes_and_union_find(shape: str, components_: int) -> None:
    edges = components.generate(shape, 18, seed=1)
    labels = components.union_find(edges)
    assert len(set(labels.values())) == components_
    assert all(label <= vertex for vertex, label in labels.items())
    assert set(labels) == set(edges["src"].to_pylist()) | set(edges["dst"].to_pylist())


def test_small_components_have_two_to_five_vertices() -> None:
    labels = components.union_find(components.generate("small", 40, seed=2))
    sizes = pd.Series(list(labels.values())).value_counts()
    assert sizes.between(2, 5).all()
    assert len(sizes) > 5


def _ctx() -> KeyGroupContext:
    return KeyGroupContext("propagate", 0, 0, Clock(0, None), pd.DataFrame({"vertex": []}))


def test_propagate_sends_labels_over_new_edges_then_lowers_labels() -> None:
    edges = pd.DataFrame({"vertex": [5, 3], "neighbor": [3.0, 5.0], "label": [np.nan, np.nan]})
    empty = pd.DataFrame({"vertex": pd.Series([], dtype="int64"), "label": [], "neighbors": []})
    first = components.propagate.function(edges, empty, _ctx())
    assert first is not None
    assert isinstance(first.output, dict)
    offers = first.output["offers"].sort_values("vertex").reset_index(drop=True)
    assert offers.to_dict("list") == {"vertex": [3, 5], "label": [5, 3]}
    assert first.state is not None
    state = first.state

    second = components.propagate.function(offers.assign(neighbor=np.nan), state, _ctx())
    assert second is not None
    assert isinstance(second.output, dict)
    assert second.output["labels"].to_dict("list") == {"vertex": [5], "label": [3]}
    assert second.output["offers"].to_dict("list") == {"vertex": [3], "label": [3]}
    assert isinstance(second.state, pd.DataFrame)
    assert second.state[["vertex", "label"]].to_dict("list") == {"vertex": [5], "label": [3]}
