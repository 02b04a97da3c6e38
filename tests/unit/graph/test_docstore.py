"""Docs and links by id (`xh.graph.docstore`): the same rows as filtering the tables, without reading them
per batch, built once per node."""

from __future__ import annotations

import random
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from xh import schemas
from xh.config import load_config
from xh.graph import docstore
from xh.graph.docstore import DocStore, build
from xh.graph.hotpot import HotpotGraphBuilder
from xh.pipeline import Pipeline, settings_of


def _between_docs(builder: HotpotGraphBuilder) -> dict:
    """A builder's links between two documents it holds: the only ones a graph can use (its nodes are
    documents of the table); filtering the tables also keeps links to wanted ids that are no document."""
    docs = builder.docs
    kept = {s: [link for link in links if link[0] in docs] for s, links in builder.links.items() if s in docs}
    return {s: links for s, links in kept.items() if links}


def _tables(root, docs: list[tuple[str, str]], links: list[tuple[str, str | None, str, int]]):
    """A docs table (two files) and a links table of (src, target or None, anchor, sentence)."""
    (root / "docs").mkdir(parents=True)
    (root / "links").mkdir()
    rows = [
        {"doc_id": d, "title": t, "text": f"{t} one. {t} two.", "sentences": [f"{t} one. ", f"{t} two."], "source": "x"}
        for d, t in docs
    ]
    half = len(rows) // 2
    pq.write_table(pa.Table.from_pylist(rows[:half], schema=schemas.DOCS), root / "docs" / "part-0.parquet")
    pq.write_table(pa.Table.from_pylist(rows[half:], schema=schemas.DOCS), root / "docs" / "part-1.parquet")
    link_rows = [
        {"src_doc_id": s, "target_title": a, "target_doc_id": t, "anchor": a, "sentence": k, "missing": t is None}
        for s, t, a, k in links
    ]
    pq.write_table(pa.Table.from_pylist(link_rows, schema=schemas.LINKS), root / "links" / "part-0.parquet")


DOCS = [("a", "Alpha"), ("b", "Beta"), ("c", "Gamma"), ("d", "Delta"), ("é", "Eta")]
LINKS = [
    ("a", "b", "beta", 0),
    ("a", "a", "self", 1),  # a self-link: never an edge
    ("b", "c", "gamma", 1),
    ("a", "b", "the beta", 1),  # a second link to the same page, kept in table order
    ("c", None, "missing page", 0),  # a link to a page outside the corpus
    ("d", "zz", "no such doc", 0),
    ("zz", "a", "from nowhere", 0),
    ("é", "a", "alpha", 1),
]


@pytest.mark.parametrize("collide", [False, True])
def test_lookups_give_what_filtering_the_tables_gives(tmp_path, monkeypatch, collide):
    if collide:  # every id one of two hashes: lookups must still tell the ids apart by their text
        real = docstore.hash_ids
        monkeypatch.setattr(docstore, "hash_ids", lambda ids: real(ids) % 2)
    _tables(tmp_path / "tables", DOCS, LINKS)
    (tmp_path / "store").mkdir()
    build(str(tmp_path / "tables"), tmp_path / "store", batch_rows=2)  # several batches per table
    store = DocStore(tmp_path / "store")
    cfg = load_config(None, [])
    graph = cfg.graphs
    for wanted in ({"a", "b", "c"}, {"a", "é", "zz", "d"}, {"c"}, {"nope"}, set(), {d for d, _ in DOCS}):
        expected = HotpotGraphBuilder.load(str(tmp_path / "tables"), wanted, graph, cfg.retrieve)
        assert store.lookup(wanted) == (expected.docs, _between_docs(expected)), wanted
    docs, links = store.lookup({"a", "b", "c"})
    assert docs["a"] == ("Alpha", ["Alpha one. ", "Alpha two."])
    assert links == {"a": [("b", "beta", 0), ("b", "the beta", 1)], "b": [("c", "gamma", 1)]}


def test_the_world_by_id_matches_the_tables_and_graphs_need_no_table_reads(synth_tables, tmp_path):
    tables, questions = synth_tables
    copy = tmp_path / "tables"
    shutil.copytree(tables, copy)
    store = DocStore.open(str(copy), cache_root=str(tmp_path / "cache"))
    cfg = load_config(None, [])
    graph = cfg.graphs
    ids = pq.read_table(copy / "docs", columns=["doc_id"])["doc_id"].to_pylist()
    rng = random.Random(7)
    for _ in range(5):
        wanted = set(rng.sample(ids, 200)) | {"not-a-doc"}
        expected = HotpotGraphBuilder.load(str(copy), wanted, graph, cfg.retrieve)
        assert store.lookup(wanted) == (expected.docs, _between_docs(expected))

    # the graph half with the store: the same graphs as filtering the tables, and once built it reads
    # no docs or links file (a batch touches only the rows it needs)
    from tests.helpers import tables_retriever

    retrieval, graph = settings_of(load_config(None, []))
    retriever = tables_retriever(copy, retrieval)
    rows = [{"qid": q["_id"], "question": q["question"], "type": q["type"]} for q in questions]
    scanned = Pipeline(retriever, str(copy), graph).graphs(rows)
    looked_up = []

    class Recording(DocStore):
        def lookup(self, doc_ids):
            doc_ids = list(doc_ids)
            looked_up.extend(doc_ids)
            return super().lookup(doc_ids)

    by_id = Pipeline(retriever, str(copy), graph, docs=Recording(store.folder))
    shutil.rmtree(copy / "docs")
    shutil.rmtree(copy / "links")
    graphs, quarantined = by_id.graphs(rows)
    assert (graphs, quarantined) == scanned and len(graphs) > 50
    # the rows of the documents that became nodes, not of every candidate
    assert set(looked_up) == {node["doc_id"] for g in graphs for node in g["nodes"]}


def test_a_node_builds_its_copy_once_and_a_rebuilt_table_gets_a_new_one(tmp_path, monkeypatch):
    tables = tmp_path / "tables"
    _tables(tables, DOCS, LINKS)
    builds = []
    real = docstore.build
    monkeypatch.setattr(docstore, "build", lambda *a, **k: builds.append(a) or real(*a, **k))
    first = DocStore.open(str(tables), cache_root=str(tmp_path / "cache"))
    second = DocStore.open(str(tables), cache_root=str(tmp_path / "cache"))
    assert first.folder == second.folder and len(builds) == 1
    _tables(tmp_path / "rewritten", [*DOCS, ("f", "Phi")], LINKS)  # the docs table written again
    shutil.rmtree(tables / "docs")
    shutil.copytree(tmp_path / "rewritten" / "docs", tables / "docs")
    third = DocStore.open(str(tables), cache_root=str(tmp_path / "cache"))
    assert third.folder != first.folder and len(builds) == 2
    assert third.lookup({"b", "f"})[0] == {
        "b": ("Beta", ["Beta one. ", "Beta two."]),
        "f": ("Phi", ["Phi one. ", "Phi two."]),
    }
    # no staging folder is left beside the copies
    assert sorted(p.name for p in (tmp_path / "cache").iterdir() if p.is_dir()) == sorted(
        {first.folder.name, third.folder.name}
    )


def test_take_rows_a_batch_at_a_time_is_arrows_take():
    """The store's rows are taken from the record batches that hold them (Arrow's take over a chunked
    column would join every chunk first): the same table as `Table.take`, in the order asked, repeats too."""
    from xh.graph.docstore import take_rows

    rng = random.Random(3)
    batches = [
        pa.record_batch(
            {
                "n": list(range(a, a + size)),
                "text": [f"t{i}" for i in range(a, a + size)],
                "list": [[i, i] for i in range(a, a + size)],
            }
        )
        for a, size in ((0, 5), (5, 1), (6, 7), (13, 4))
    ]
    table = pa.Table.from_batches(batches)
    assert table.column("n").num_chunks == 4
    for rows in ([], [3], [16, 0, 5, 5, 12, 6], [rng.randrange(17) for _ in range(40)]):
        got = take_rows(table, rows)
        assert got.equals(table.take(pa.array(rows, pa.int64()))), rows
        assert got.column("n").to_pylist() == rows
    one = pa.Table.from_batches(batches[:1])
    assert take_rows(one, [4, 0]).column("n").to_pylist() == [4, 0]
