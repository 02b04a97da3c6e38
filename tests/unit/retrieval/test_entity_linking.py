"""Commonness entity linking: the rules on hand-made tables, then recall on a generated world.

The generated-world test builds the tables with the project's real pipeline (synth world ->
`xh.wiki.process` in one process) and prints the figures it asserts floors for; run with `-s` to
see them.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from xh import schemas
from xh.retrieval.entity_linking import (
    EntityLink,
    EntityLinker,
    normalize_surface,
    strip_disambiguator,
    tokenize,
)

pytestmark = pytest.mark.unit


def anchors(*rows):
    return pa.Table.from_pylist([{"surface": s, "doc_id": d, "count": c} for s, d, c in rows], schema=schemas.ANCHORS)


def titles(*rows):
    return pa.table({"doc_id": [d for d, _ in rows], "title": [t for _, t in rows]})


def linked(linker, question):
    """(surface, doc_id) of each link; and every link's offsets point at its surface."""
    links = linker.link(question)
    for link in links:
        assert question[link.start : link.end] == link.surface
    return [(link.surface, link.doc_id) for link in links]


# --- commonness -------------------------------------------------------------------------------


def test_commonness_is_count_over_the_surface_total_after_normalising_surfaces():
    linker = EntityLinker.from_tables(
        anchors(("port arden", "1", 6), ("port arden", "2", 2), ("Port  Arden ", "2", 2), ("arden", "3", 1))
    )
    assert linker.lookup("Port Arden") == [("1", 0.6, 6.0), ("2", 0.4, 4.0)]
    assert linker.lookup("port   ARDEN") == linker.lookup("port arden")
    assert linker.lookup("nowhere") == []
    assert linker.link("Where is Port Arden?") == [EntityLink("Port Arden", "1", 0.6, 9, 19)]
    assert (linker.num_surfaces, linker.num_entries) == (2, 3)


def test_per_surface_keeps_the_top_entities_and_ties_go_to_the_lower_doc_id():
    table = anchors(("mercury", "planet", 3), ("mercury", "element", 3), ("mercury", "god", 2))
    assert linked(EntityLinker.from_tables(table), "Is Mercury hot?") == [("Mercury", "element")]
    top2 = EntityLinker.from_tables(table, per_surface=2).link("Is Mercury hot?")
    assert [(link.doc_id, link.score) for link in top2] == [("element", 3 / 8), ("planet", 3 / 8)]


def test_minimum_commonness_and_minimum_count():
    table = anchors(("arden", "1", 9), ("arden", "2", 1), ("belford", "3", 1))
    assert EntityLinker.from_tables(table, per_surface=5, min_commonness=0.5).lookup("arden")[0][0] == "1"
    assert linked(EntityLinker.from_tables(table, per_surface=5, min_commonness=0.5), "Arden or Belford?") == [
        ("Arden", "1"),
        ("Belford", "3"),
    ]
    assert linked(EntityLinker.from_tables(table, per_surface=5, min_count=2), "Arden or Belford?") == [("Arden", "1")]


# --- overlaps ---------------------------------------------------------------------------------


def test_the_longest_match_wins():
    linker = EntityLinker.from_tables(
        anchors(
            ("mount linstone", "city", 10),
            ("mount linstone state university", "uni", 1),
            ("state university", "generic", 50),
            ("new arden", "na", 5),
            ("arden bay", "ab", 5),
            ("bay", "b", 5),
        )
    )
    question = "Who founded Mount Linstone State University?"
    assert linked(linker, question) == [("Mount Linstone State University", "uni")]
    assert linked(linker, "Is Mount Linstone a State University town?") == [
        ("Mount Linstone", "city"),
        ("State University", "generic"),
    ]
    # Same length in tokens and characters: the leftmost wins; "Bay" overlaps the dropped one only.
    assert linked(linker, "In New Arden Bay?") == [("New Arden", "na"), ("Bay", "b")]


# --- titles -----------------------------------------------------------------------------------


def test_titles_are_surfaces_with_and_without_their_disambiguator():
    docs = titles(("7", "Mara Quinn (born 1972)"), ("10", "Glencliff Springs"), ("11", "Glencliff Springs (band)"))
    linker = EntityLinker.from_tables(anchors(), docs)
    assert linked(linker, "Is Mara Quinn a painter?") == [("Mara Quinn", "7")]
    assert linked(linker, "Is Mara Quinn (born 1972) a painter?") == [("Mara Quinn (born 1972)", "7")]
    # A plain title (pseudo-count 1) beats a stripped one (0.5); the full title names the band.
    assert linker.lookup("glencliff springs") == [("10", 1 / 1.5, 1.0), ("11", 0.5 / 1.5, 0.5)]
    assert linked(linker, "Where is Glencliff Springs?") == [("Glencliff Springs", "10")]
    assert linked(linker, "Who formed Glencliff Springs (band)?") == [("Glencliff Springs (band)", "11")]


def test_title_pseudo_counts_add_to_anchor_counts_and_can_be_turned_off():
    table = anchors(("mount wilton", "city", 8))
    docs = titles(("city", "Mount Wilton"), ("band", "Mount Wilton (band)"))
    linker = EntityLinker.from_tables(table, docs, title_count=2.0, stripped_title_count=1.0, per_surface=2)
    assert linker.lookup("Mount Wilton") == [("city", 10 / 11, 10.0), ("band", 1 / 11, 1.0)]
    off = EntityLinker.from_tables(table, docs, title_count=0, stripped_title_count=0)
    assert off.lookup("Mount Wilton") == [("city", 1.0, 8.0)]
    assert off.lookup("Mount Wilton (band)") == []


def test_strip_disambiguator():
    assert strip_disambiguator("Mara Quinn (born 1972)") == "Mara Quinn"
    assert strip_disambiguator("Mercury (planet)") == "Mercury"
    assert strip_disambiguator("Mercury") == "Mercury"
    assert strip_disambiguator("(Untitled) Song") == "(Untitled) Song"


# --- skipped surfaces and tokens --------------------------------------------------------------


def test_stop_word_numeric_short_and_lower_case_surfaces_are_skipped():
    table = anchors(
        ("the", "t", 5),
        ("of the", "ot", 5),
        ("the who", "band", 5),
        ("which", "w", 5),
        ("1986", "year", 5),
        ("x", "letter", 5),
        ("film", "film", 5),
        ("the film", "tf", 5),
    )
    linker = EntityLinker.from_tables(table)
    assert linked(linker, "Which of the members of The Who was born in 1986? X") == []
    assert linked(linker, "Which film?") == []
    assert linked(linker, "Which Film?") == [("Film", "film")]
    assert linked(EntityLinker.from_tables(table, require_capital=False), "which film?") == [("film", "film")]
    assert linked(EntityLinker.from_tables(table, skip_numeric=False), "Born in 1986?") == [("1986", "year")]


def test_empty_and_wordless_questions_have_no_links():
    linker = EntityLinker.from_tables(anchors(("arden", "1", 1)), titles(("1", "Arden")))
    assert linker.link("") == []
    assert linker.link("?!  ...") == []
    assert linker.link_batch([]) == []
    assert linker.link_batch(["", "Arden?", ""]) == [[], [EntityLink("Arden", "1", 1.0, 0, 5)], []]
    empty = EntityLinker.from_tables(anchors())
    assert empty.link("Arden?") == [] and empty.num_surfaces == 0


def test_tokens_keep_punctuation_inside_names():
    assert [("AC/DC's O'Brien St. Louis"[s:e]) for s, e in tokenize("AC/DC's O'Brien St. Louis")] == [
        "AC/DC's",
        "O'Brien",
        "St",
        "Louis",
    ]
    linker = EntityLinker.from_tables(
        anchors(
            ("ac/dc", "acdc", 3),
            ("st. louis", "stl", 3),
            ("o’brien", "ob", 3),
            ("d.c.", "dc", 3),
            ("dario pajari", "dp", 1),
        )
    )
    assert linked(linker, "Did AC/DC play in St. Louis?") == [("AC/DC", "acdc"), ("St. Louis", "stl")]
    assert linked(linker, "Is O'Brien from Washington D.C.") == [("O'Brien", "ob"), ("D.C.", "dc")]
    assert linked(linker, "What is Dario Pajari's job?") == [("Dario Pajari", "dp")]
    assert normalize_surface("  O’Brien\tof  AC/DC ") == "o'brien of ac/dc"


def test_link_batch_equals_link_one_by_one():
    linker = EntityLinker.from_tables(anchors(("arden", "1", 2), ("belford", "2", 1)), titles(("3", "Port Arden")))
    questions = ["Arden or Belford?", "Port Arden", "nothing here", "Belford, Belford and Arden"]
    assert linker.link_batch(questions) == [linker.link(q) for q in questions]
    assert [link.surface for link in linker.link("Belford, Belford and Arden")] == ["Belford", "Belford", "Arden"]


# --- storage ----------------------------------------------------------------------------------


def test_load_from_parquet_equals_from_tables(tmp_path):
    table = anchors(("port arden", "1", 6), ("port arden", "2", 2), ("belford", "3", 1))
    docs = pa.Table.from_pylist(
        [
            {"doc_id": d, "title": t, "text": t, "sentences": [t], "source": "x"}
            for d, t in (("1", "Port Arden"), ("2", "Port Arden (film)"), ("3", "Belford"), ("4", "Mara Quinn"))
        ],
        schema=schemas.DOCS,
    )
    for name, t in (("anchors", table), ("docs", docs)):
        (tmp_path / name).mkdir()
        pq.write_table(t.slice(0, 2), tmp_path / name / "part-00000.parquet")
        pq.write_table(t.slice(2), tmp_path / name / "part-00001.parquet")
    loaded = EntityLinker.load(str(tmp_path), per_surface=2)
    built = EntityLinker.from_tables(table, docs.select(["doc_id", "title"]), per_surface=2)
    for name in ("keys", "offsets", "entry_docs", "entry_counts"):
        assert np.array_equal(getattr(loaded, name), getattr(built, name)), name
    assert loaded.doc_ids.equals(built.doc_ids)
    questions = ["Was Port Arden filmed in Belford?", "Mara Quinn", ""]
    assert loaded.link_batch(questions) == built.link_batch(questions)
    assert loaded.link("Mara Quinn") == [EntityLink("Mara Quinn", "4", 1.0, 0, 10)]
    assert loaded.entry_docs.dtype == np.int32 and loaded.entry_counts.dtype == np.float32


# --- a generated world, through the real pipeline ---------------------------------------------


@pytest.fixture(scope="module")
def world(synth_tables):
    """The shared generated world's tables and questions, plus title -> doc id."""
    tables, questions = synth_tables
    docs = pq.read_table(tables / "docs", columns=["doc_id", "title"])
    doc_of_title = dict(zip(docs["title"].to_pylist(), docs["doc_id"].to_pylist()))
    return tables, questions, doc_of_title


def named_in_question(question: dict) -> tuple[str, str]:
    """(first-hop title, second title) of a bridge question: the first is the one the question names."""
    gold = list(dict.fromkeys(title for title, _ in question["supporting_facts"]))
    text = question["question"].lower()
    named = [t for t in gold if t.lower() in text or strip_disambiguator(t).lower() in text]
    first = named[0] if named else gold[0]
    return first, next(t for t in gold if t != first)


def test_generated_world_links_the_first_hop_of_bridge_questions(world):
    tables, questions, doc_of_title = world
    linker = EntityLinker.load(str(tables))
    assert linker.num_surfaces > 0

    # Commonness over the real anchors table: each surface's docs add up to 1.
    anchors_table = pq.read_table(tables / "anchors")
    for surface in anchors_table["surface"].unique().to_pylist()[:50]:
        assert sum(score for _, score, _ in linker.lookup(surface)) == pytest.approx(1.0)

    links = linker.link_batch([q["question"] for q in questions])
    bridge = [(q, ls) for q, ls in zip(questions, links) if q["type"] == "bridge"]
    comparison = [(q, ls) for q, ls in zip(questions, links) if q["type"] == "comparison"]
    found_first = sum(doc_of_title[named_in_question(q)[0]] in {link.doc_id for link in ls} for q, ls in bridge)
    both_compared = sum(
        {doc_of_title[t] for t, _ in q["supporting_facts"]} <= {link.doc_id for link in ls} for q, ls in comparison
    )
    per_question = np.mean([len(ls) for ls in links])
    print(
        f"\nentity linking on synth world (800 docs, {linker.num_surfaces} surfaces, {linker.nbytes} bytes): "
        f"bridge first hop linked {found_first}/{len(bridge)} = {found_first / len(bridge):.3f}; "
        f"comparison both entities linked {both_compared}/{len(comparison)}; {per_question:.2f} links/question"
    )
    assert len(bridge) >= 30
    assert found_first / len(bridge) >= 0.85
    assert both_compared / max(1, len(comparison)) >= 0.6
    assert per_question <= 3
