"""Hyperlink expansion: neighbours, directions, anchors and ranking on a hand-made graph, then
recall of the second hop on a generated world (figures printed; run with `-s` to see them)."""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from xh import schemas
from xh.retrieval.entity_linking import EntityLinker
from xh.retrieval.expansion import ExpandedDoc, LinkGraph, Neighbour

pytestmark = pytest.mark.unit


def links(*rows):
    """Rows (src, target doc id or None, anchor) as a `links` table; None marks a missing page."""
    return pa.Table.from_pylist(
        [
            {"src_doc_id": s, "target_title": a, "target_doc_id": t, "anchor": a, "sentence": 0, "missing": t is None}
            for s, t, a in rows
        ],
        schema=schemas.LINKS,
    )


@pytest.fixture
def graph_table():
    return links(
        ("A", "B", "Bee"),
        ("A", "B", "the Bee"),
        ("A", "C", "Sea"),
        ("D", "A", "Alpha"),
        ("B", "A", "A."),
        ("A", None, "Nowhere"),  # missing page
        ("A", "A", "itself"),  # self-link
        ("C", "D", "Dee"),
        ("E", "F", "Eff"),
    )


def test_directions_of_one_doc_agree_with_its_neighbours_and_are_cut_out_links_first(graph_table):
    graph = LinkGraph.from_table(graph_table)
    for doc in ("A", "B", "C", "D", "E", "F", "unknown"):
        assert graph.directions(doc, limit=10) == {n.doc_id: n.direction for n in graph.neighbours([doc])}
    assert graph.directions("A", limit=2) == {"B": "both", "C": "out"}  # D links in only: cut
    assert graph.directions("A", limit=1) == {"B": "both"}
    # a hub: 1,500 pages link to it, one of them it links to as well
    hub = LinkGraph.from_table(links(("H", "p0700", "x"), *((f"p{i:04d}", "H", "h") for i in range(1500))))
    assert hub.directions("H", limit=4) == {"p0700": "both", "p0000": "in", "p0001": "in", "p0002": "in"}


def test_neighbours_have_direction_and_anchors_and_exclude_seeds_and_missing_pages(graph_table):
    graph = LinkGraph.from_table(graph_table)
    assert (graph.num_docs, graph.num_links) == (6, 7)
    assert graph.neighbours(["A"]) == [
        Neighbour("B", "both", 1, 3, ("Bee", "the Bee"), ("A.",)),
        Neighbour("C", "out", 1, 1, ("Sea",), ()),
        Neighbour("D", "in", 1, 1, (), ("Alpha",)),
    ]
    # With C a seed too: C is no neighbour, and D is linked with two seeds (D -> A, C -> D).
    assert graph.neighbours(["A", "C", "A"]) == [
        Neighbour("B", "both", 1, 3, ("Bee", "the Bee"), ("A.",)),
        Neighbour("D", "both", 2, 2, ("Dee",), ("Alpha",)),
    ]
    assert graph.neighbours(["unknown"]) == [] and graph.neighbours([]) == []
    assert graph.neighbours(["F"]) == [Neighbour("E", "in", 1, 1, (), ("Eff",))]


def test_fallback_order_is_connections_then_out_links_then_links_then_doc_id(graph_table):
    graph = LinkGraph.from_table(graph_table)
    expansion = graph.expand(["A", "C"])
    assert expansion.ranking == "connections" and expansion.num_neighbours == 2
    rows = [(d.doc_id, d.score, d.rank, d.direction) for d in expansion.docs]
    assert rows == [("D", 2.0, 1, "both"), ("B", 1.0, 2, "both")]
    # One seed: B (out and in, 3 links) and C (out) before D (in only); top_k cuts.
    assert [d.doc_id for d in graph.expand(["A"]).docs] == ["B", "C", "D"]
    assert [d.doc_id for d in graph.expand(["A"], top_k=2).docs] == ["B", "C"]
    assert graph.expand(["A"], top_k=2).num_neighbours == 3


def test_a_scorer_ranks_and_the_fallback_order_breaks_its_ties(graph_table):
    graph = LinkGraph.from_table(graph_table)
    asked = []

    def scorer(doc_ids):
        asked.append(list(doc_ids))
        return [{"B": 1.0, "C": 5.0, "D": 1.0}[d] for d in doc_ids]

    expansion = graph.expand(["A"], question_scorer=scorer)
    assert expansion.ranking == "scorer"
    assert expansion.docs == [
        ExpandedDoc("C", 5.0, 1, "out", ("Sea",), ()),
        ExpandedDoc("B", 1.0, 2, "both", ("Bee", "the Bee"), ("A.",)),
        ExpandedDoc("D", 1.0, 3, "in", (), ("Alpha",)),
    ]
    assert asked == [["B", "C", "D"]]  # the scorer sees the neighbours once, in the fallback order
    # max_candidates cuts before scoring, in the fallback order.
    assert [d.doc_id for d in graph.expand(["A"], question_scorer=scorer, max_candidates=2).docs] == ["C", "B"]
    with pytest.raises(ValueError, match="scores"):
        graph.expand(["A"], question_scorer=lambda ids: [1.0])
    assert graph.expand(["unknown"], question_scorer=scorer).docs == []


def test_compact_storage_and_load_from_parquet_equals_from_table(graph_table, tmp_path):
    (tmp_path / "links").mkdir()
    pq.write_table(graph_table.slice(0, 4), tmp_path / "links" / "part-00000.parquet")
    pq.write_table(graph_table.slice(4), tmp_path / "links" / "part-00001.parquet")
    loaded, built = LinkGraph.load(str(tmp_path)), LinkGraph.from_table(graph_table)
    for name in ("edge_src", "edge_dst", "edge_anchor", "out_offsets", "in_edges", "in_offsets"):
        assert np.array_equal(getattr(loaded, name), getattr(built, name)), name
    assert loaded.doc_ids.equals(built.doc_ids) and loaded.anchors.equals(built.anchors)
    for name in ("edge_src", "edge_dst", "edge_anchor", "in_edges"):
        assert getattr(loaded, name).dtype == np.int32, name
    assert list(loaded.index_of(["A", "F", "nope", ""])) == [0, 5, -1, -1]
    assert loaded.expand(["A", "C"]) == built.expand(["A", "C"])
    empty = LinkGraph.from_table(schemas.LINKS.empty_table())
    assert empty.neighbours(["A"]) == [] and empty.expand(["A"]).docs == []


# --- a generated world, through the real pipeline ---------------------------------------------


@pytest.fixture(scope="module")
def world(synth_tables):
    return synth_tables


def word_overlap_scorer(docs: pa.Table, question: str):
    """A stand-in for BM25: how many of the question's words (4+ letters) a doc's text contains."""
    text_of = dict(zip(docs["doc_id"].to_pylist(), docs["text"].to_pylist()))
    words = {w for w in re.findall(r"\w+", question.lower()) if len(w) >= 4}
    return lambda doc_ids: [len(words & set(re.findall(r"\w+", text_of[d].lower()))) for d in doc_ids]


def test_generated_world_expansion_reaches_the_second_hop(world):
    tables, questions = world
    graph = LinkGraph.load(str(tables))
    docs = pq.read_table(tables / "docs", columns=["doc_id", "title", "text"])
    doc_of_title = dict(zip(docs["title"].to_pylist(), docs["doc_id"].to_pylist()))

    # The graph agrees with the links table, for a few seeds.
    table = pq.read_table(tables / "links").filter(pa.compute.invert(pa.compute.field("missing")))
    rows = list(zip(table["src_doc_id"].to_pylist(), table["target_doc_id"].to_pylist()))
    for seed in sorted({s for s, _ in rows})[:25]:
        expected = {t for s, t in rows if s == seed} | {s for s, t in rows if t == seed}
        assert {n.doc_id for n in graph.neighbours([seed])} == expected - {seed}

    bridge = [q for q in questions if q["type"] == "bridge"]
    linker = EntityLinker.load(str(tables))
    reached = in_top15 = in_top15_scored = from_linked = 0
    for q in bridge:
        gold = list(dict.fromkeys(t for t, _ in q["supporting_facts"]))
        text = q["question"].lower()
        first = next((t for t in gold if re.sub(r"\s*\([^()]*\)$", "", t).lower() in text), gold[0])
        second = doc_of_title[next(t for t in gold if t != first)]
        seeds = [doc_of_title[first]]
        reached += second in {n.doc_id for n in graph.neighbours(seeds)}
        in_top15 += second in {d.doc_id for d in graph.expand(seeds, top_k=15).docs}
        scored = graph.expand(seeds, question_scorer=word_overlap_scorer(docs, q["question"]), top_k=15)
        in_top15_scored += second in {d.doc_id for d in scored.docs}
        # As the pipeline does it: seeds are the docs the entity linker finds in the question.
        linked = [link.doc_id for link in linker.link(q["question"])]
        scorer = word_overlap_scorer(docs, q["question"])
        from_linked += second in {d.doc_id for d in graph.expand(linked, question_scorer=scorer, top_k=15).docs}
    n = len(bridge)
    print(
        f"\nexpansion on synth world ({graph.num_docs} docs, {graph.num_links} links, {graph.nbytes} bytes) from the "
        f"gold first hop of {n} bridge questions: second hop among neighbours {reached / n:.3f}, "
        f"in top 15 (fallback order) {in_top15 / n:.3f}, in top 15 (word-overlap scorer) {in_top15_scored / n:.3f}; "
        f"from the entity linker's docs instead, in top 15 (scorer) {from_linked / n:.3f}"
    )
    assert n >= 30
    assert reached / n >= 0.95
    assert in_top15 / n >= 0.9
    assert in_top15_scored / n >= 0.9
    assert from_linked / n >= 0.85
