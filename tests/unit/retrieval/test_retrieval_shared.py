"""Retrieval state once per node (`xh.retrieval.shared`): a query actor maps the node's one layout of the
index, linker, link graph and doc lookup instead of holding its own copy, and retrieves exactly what a
retriever holding its own copy of everything retrieves (on generated data and on the real sample). The
fan-out (`xh.retrieval.fanout`): shard groups score apart and their top-k merge into the same results."""

from __future__ import annotations

import json
import mmap
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from xh import schemas, synth
from xh.config import RetrieveConfig
from xh.retrieval import shared
from xh.retrieval.analyzer import Analyzer
from xh.retrieval.bm25 import CorpusStats, search_shards
from xh.retrieval.candidates import DocPositions, Retriever
from xh.retrieval.entity_linking import EntityLinker
from xh.retrieval.expansion import LinkGraph
from xh.retrieval.fanout import FanoutShards, ShardGroup, same_results, shard_groups
from xh.retrieval.index import build_shard, doc_ranges, load_index, range_stats, write_manifest
from xh.retrieval.paths import PathScorer
from xh.stages import wiki
from xh.storage.store import Store


def build_index(tables: Path, index: Path, shards: int) -> None:
    """The index stage's own steps, in this process (`xh.stages.retrieve.index` runs them on Ray)."""
    ranges = doc_ranges(str(tables / "docs"), shards)
    stats = CorpusStats.merge(range_stats(r, index_titles=True) for r in ranges)
    entries = [build_shard(r, stats, str(index), index_titles=True) for r in ranges]
    write_manifest(str(index), stats, entries, str(tables), index_titles=True)


def copied(index: Path, tables: Path, settings: RetrieveConfig, scorer=None) -> Retriever:
    """A retriever holding its own copy of everything, as every query actor did before the shared layout."""
    parts = load_index(str(index)), EntityLinker.load(str(tables)), LinkGraph.load(str(tables))
    return Retriever(*parts, settings, path_scorer=scorer)


def fitted_scorer(retriever: Retriever, questions: list[str], gold: list[set[str]]) -> PathScorer:
    return PathScorer.fit(retriever.question_paths(questions), gold, epochs=40)


def mapped(array: np.ndarray) -> bool:
    """Whether the array's memory is a mapped file (not the process's own heap)."""
    while array is not None and not isinstance(array, mmap.mmap):
        array = getattr(array, "base", None)
    return isinstance(array, mmap.mmap)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A generated world's tables and an index of 3 shards; questions with their supporting titles."""
    root = tmp_path_factory.mktemp("shared")
    spec = synth.WorldSpec(num_docs=1200, seed=5)
    synth.write_world(spec, synth.output_under(str(root / "world")), docs_per_shard=400, num_questions=80, num_claims=0)
    wiki.write_tables(
        Store().at(str(root / "tables")), [Store().at(str(root / "world" / "wiki"))], "hotpot", partitions=3, local=True
    )
    build_index(root / "tables", root / "index", shards=3)
    records = json.loads((root / "world" / "hotpot" / "questions.json").read_text())
    return root, records


def test_the_mapped_retriever_gives_the_candidates_of_one_holding_its_own_copy(world, tmp_path):
    root, records = world
    questions, qids = [r["question"] for r in records], [r["_id"] for r in records]
    docs = pq.read_table(root / "tables" / "docs", columns=["doc_id", "title"]).to_pylist()
    by_title = {d["title"]: d["doc_id"] for d in docs}
    gold = [{by_title.get(t, "?") for t, _ in r["supporting_facts"]} for r in records]
    settings = RetrieveConfig(ir_candidates=50)
    scorer = fitted_scorer(copied(root / "index", root / "tables", settings), questions, gold)

    scorer.save(str(tmp_path / "scorer"))
    for path_scorer in (None, scorer):
        config = settings.model_copy(update={"path_scorer": str(tmp_path / "scorer") if path_scorer else None})
        expected = copied(root / "index", root / "tables", config, path_scorer).candidates(qids, questions)
        loaded = Retriever.load(str(root / "index"), str(root / "tables"), config, cache_dir=tmp_path / "cache")
        assert {r["source"] for r in expected} == {"ir", "el", "exp"}
        assert loaded.candidates(qids, questions) == expected
        by_batch = [
            row for i in range(0, len(qids), 7) for row in loaded.candidates(qids[i : i + 7], questions[i : i + 7])
        ]
        assert by_batch == expected

    # what used to be each process's own: every array of the state is a mapped file
    state = shared.node_state(str(root / "index"), str(root / "tables"), cache_dir=tmp_path / "cache")
    arrays = [state.linker.keys, state.linker.entry_docs, state.graph.edge_dst, state.graph.in_edges]
    arrays += [state.positions["keys"]]
    for shard in state.shards:
        arrays += [shard.weights.data, shard.weights.indices, shard.weights.indptr, shard._dense, shard.term_rows.keys]
    assert all(mapped(a) for a in arrays)
    assert all(isinstance(s.doc_ids, pa.Array) for s in state.shards)
    # the weights are the index stage's own files, not a copy of them
    files = {m.split()[-1] for m in Path("/proc/self/maps").read_text().splitlines() if "/" in m}
    assert str(root / "index" / "shards" / "shard-00000" / "weights.npy") in files


def test_the_layout_is_built_once_per_node_and_rebuilt_for_another_index(world, tmp_path, monkeypatch):
    root, _ = world
    first = shared.ensure_layout(str(root / "index"), str(root / "tables"), cache_dir=tmp_path)

    def no_second_build(*args):
        raise AssertionError("the layout was built again")

    with monkeypatch.context() as m:
        m.setattr(shared, "_write_layout", no_second_build)
        assert shared.ensure_layout(str(root / "index"), str(root / "tables"), cache_dir=tmp_path) == first
        # another process of the node maps the same layout, and retrieves the same as this one
        code = (
            "import sys, json; from xh.retrieval.shared import node_state; from xh.retrieval.bm25 import search_shards; "
            "s = node_state(sys.argv[1], sys.argv[2], cache_dir=sys.argv[3]); "
            "print(json.dumps([r.doc_ids for r in search_shards(s.shards, sys.argv[4:], k=5)]))"
        )
        texts = ["Which city was the founder born in?", "film director"]
        out = subprocess.run(
            [sys.executable, "-c", code, str(root / "index"), str(root / "tables"), str(tmp_path), *texts],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])},
        )
        here = shared.map_layout(first)
        assert json.loads(out.stdout) == [r.doc_ids for r in search_shards(here.shards, texts, k=5)]

    # a rebuilt index (another layout of shards) gets its own layout, and the new shards' results
    build_index(root / "tables", root / "index-two", shards=2)
    second = shared.ensure_layout(str(root / "index-two"), str(root / "tables"), cache_dir=tmp_path)
    assert second != first and len(json.loads((second / shared.READY).read_text())["shards"]) == 2


def test_a_builder_killed_half_way_leaves_nothing_that_is_read(world, tmp_path):
    root, _ = world
    key = shared.layout_key(str(root / "index"), str(root / "tables"))
    half = tmp_path / f".{key}.building"
    (half / "shard-00000").mkdir(parents=True)
    (half / "shard-00000" / "weights.npy").write_bytes(b"half written")
    folder = shared.ensure_layout(str(root / "index"), str(root / "tables"), cache_dir=tmp_path)
    assert folder.name == key and not half.exists()
    texts = ["Which city was the founder born in?"]
    expected = search_shards(load_index(str(root / "index")), texts, k=10)
    got = search_shards(shared.map_layout(folder).shards, texts, k=10)
    assert [r.doc_ids for r in got] == [r.doc_ids for r in expected]
    assert [r.scores.tolist() for r in got] == [r.scores.tolist() for r in expected]


def test_terms_are_found_through_their_keys_even_when_two_share_one(world, tmp_path):
    root, _ = world
    state = shared.node_state(str(root / "index"), str(root / "tables"), cache_dir=tmp_path)
    shard = state.shards[0]
    rows = shard.term_rows
    terms = rows.terms.to_pylist()
    assert all(rows[t] == i for i, t in enumerate(terms[:500])) and "no-such-term-zz" not in rows
    # two terms under one key: the one asked for is found at its own row, never at the other's
    term, other = terms[3], terms[4]
    key = shared.string_keys([term])[0]
    collided = shared.MappedTermRows(np.array([key, key], np.uint64), np.array([4, 3]), rows.terms)
    assert collided[term] == 3 and collided.get(other) is None


# --- the real sample ----------------------------------------------------------------------------------


def write_sample_tables(shared_data: Path, tables: Path) -> list[dict]:
    """The sample's paragraphs as wiki tables: docs, no anchors, and links from each paragraph to the ones
    whose titles it names (as `bench/rerank.py` links them). Returns the records."""
    records = json.loads((shared_data / "hotpotqa" / "hotpot_train_sample500.json").read_text())
    by_title: dict[str, list[str]] = {}
    for record in records:
        for title, sentences in record["context"]:
            if sentences:
                by_title.setdefault(title, sentences)
    ids = [f"d{i:05d}" for i in range(len(by_title))]
    titles = list(by_title)
    docs = pa.table(
        {
            "doc_id": ids,
            "title": titles,
            "text": ["".join(by_title[t]) for t in titles],
            "sentences": [by_title[t] for t in titles],
            "source": ["sample"] * len(ids),
        },
        schema=schemas.DOCS,
    )
    anchors = pa.Table.from_pylist([], schema=schemas.ANCHORS)
    linker = EntityLinker.from_tables(anchors, docs.select(["doc_id", "title"]))
    links = [
        {"src_doc_id": d, "target_title": titles[ids.index(m.doc_id)], "target_doc_id": m.doc_id}
        | {"anchor": m.surface, "sentence": 0, "missing": False}
        for d, mentions in zip(ids, linker.link_batch(docs["text"].to_pylist()))
        for m in mentions
        if m.doc_id != d
    ]
    for name, table in (
        ("docs", docs),
        ("anchors", anchors),
        ("links", pa.Table.from_pylist(links, schema=schemas.LINKS)),
    ):
        (tables / name).mkdir(parents=True)
        half = table.num_rows // 2  # two files, as the wiki stage writes several
        pq.write_table(table.slice(0, half), tables / name / "part-0.parquet")
        pq.write_table(table.slice(half), tables / name / "part-1.parquet")
    return records


def test_the_mapped_retriever_on_the_real_sample(shared_data, tmp_path):
    tables, index = tmp_path / "tables", tmp_path / "index"
    records = write_sample_tables(shared_data, tables)
    assert pq.read_table(tables / "docs").num_rows == 4968
    build_index(tables, index, shards=4)
    questions, qids = [r["question"] for r in records], [r["_id"] for r in records]
    by_title = dict(zip(*(pq.read_table(tables / "docs").column(c).to_pylist() for c in ("title", "doc_id"))))
    gold = [{by_title.get(t, "?") for t, _ in r["supporting_facts"]} for r in records]
    settings = RetrieveConfig(ir_candidates=100)
    scorer = fitted_scorer(copied(index, tables, settings), questions[:200], gold[:200])
    expected = copied(index, tables, settings, scorer).candidates(qids, questions)
    assert {r["ranker"] for r in expected if r["source"] == "ir"} >= {"paths"}
    scorer.save(str(tmp_path / "scorer"))
    config = settings.model_copy(update={"path_scorer": str(tmp_path / "scorer")})
    loaded = Retriever.load(str(index), str(tables), config, cache_dir=tmp_path / "cache")
    assert loaded.candidates(qids, questions) == expected
    # and BM25 over the 4 mapped shards is one index over the whole sample
    analyzer = Analyzer()
    whole = load_index(str(index))
    assert [r.doc_ids for r in search_shards(loaded.shards, questions, k=100)] == [
        r.doc_ids for r in search_shards(whole, [analyzer.analyze(q) for q in questions], k=100)
    ]


# --- the fan-out layout: shard groups scored apart, their top-k merged ------------------------------------


def fanned(index: Path, tables: Path, settings: RetrieveConfig, groups: list[list[int]], cache: Path) -> Retriever:
    """A retriever whose BM25 and term weights come from shard groups (in this process: the merge is the
    point here; tests/integration/test_retrieval_fanout.py runs them as Ray actors)."""
    state = shared.node_state(str(index), str(tables), cache_dir=cache)
    searcher = FanoutShards([ShardGroup(str(index), str(tables), g, cache_dir=cache) for g in groups], groups)
    positions = DocPositions(state.shards, state.positions)
    return Retriever(state.shards, state.linker, state.graph, settings, positions=positions, searcher=searcher)


def test_shard_groups_fit_the_budget_and_refuse_a_shard_larger_than_it():
    assert shard_groups([3, 3, 3, 5], budget_bytes=6) == [[0, 1], [2], [3]]
    assert shard_groups([3, 3, 3], budget_bytes=100) == [[0, 1, 2]]
    with pytest.raises(ValueError, match="shard 1 maps .* more than the budget"):
        shard_groups([3, 7], budget_bytes=6)


@pytest.mark.parametrize("groups", [[[0], [1], [2]], [[0, 1], [2]]])
def test_the_fanout_gives_the_candidates_of_one_retriever_holding_every_shard(world, tmp_path, groups):
    root, records = world
    questions, qids = [r["question"] for r in records], [r["_id"] for r in records]
    settings = RetrieveConfig(ir_candidates=50)
    one = copied(root / "index", root / "tables", settings)
    docs = pq.read_table(root / "tables" / "docs", columns=["doc_id", "title"]).to_pylist()
    by_title = {d["title"]: d["doc_id"] for d in docs}
    gold = [{by_title.get(t, "?") for t, _ in r["supporting_facts"]} for r in records]
    one.path_scorer = fitted_scorer(one, questions, gold)
    fan = fanned(root / "index", root / "tables", settings, groups, tmp_path)
    fan.path_scorer = one.path_scorer
    analyzed = [Analyzer().analyze(q) for q in questions]
    assert same_results(fan.searcher.search(analyzed, 50), search_shards(one.shards, analyzed, 50))
    expected = one.candidates(qids, questions)
    assert {r["ranker"] for r in expected if r["source"] == "ir"} >= {"paths"}
    assert fan.candidates(qids, questions) == expected


def test_the_fanout_on_the_real_sample(shared_data, tmp_path):
    tables, index = tmp_path / "tables", tmp_path / "index"
    records = write_sample_tables(shared_data, tables)
    build_index(tables, index, shards=4)
    questions, qids = [r["question"] for r in records], [r["_id"] for r in records]
    settings = RetrieveConfig(ir_candidates=100)
    one = copied(index, tables, settings)
    fan = fanned(index, tables, settings, [[0, 1], [2], [3]], tmp_path / "cache")
    analyzed = [Analyzer().analyze(q) for q in questions]
    assert same_results(fan.searcher.search(analyzed, 100), search_shards(one.shards, analyzed, 100))
    assert fan.candidates(qids, questions) == one.candidates(qids, questions)


def test_term_weights_are_the_stored_weights_without_copying_posting_lists(world, tmp_path):
    """Weights of given documents are looked up in each term's postings (binary search): the same as the
    dense matrix holds, for a single query and a batch, repeated terms and unknown documents included."""
    root, records = world
    retriever = Retriever.load(str(root / "index"), str(root / "tables"), RetrieveConfig(), cache_dir=tmp_path)
    dense = {id(s): s.weights.toarray() for s in retriever.shards}
    rng = np.random.default_rng(0)
    all_ids = [s.doc_id(c) for s in retriever.shards for c in range(s.num_docs)]
    analyzer = Analyzer()
    terms = [analyzer.analyze(r["question"]) for r in records[:30]]
    terms[0] = terms[0] + terms[0][:2] + ["no-such-term-zz"]  # repeats and an unknown term
    docs = [[*rng.choice(all_ids, 40, replace=False).tolist(), "no-such-doc"] for _ in terms]

    def reference(query: list[str], ids: list[str]) -> np.ndarray:
        out = np.zeros((len(query), len(ids)))
        where, cols = retriever._where.find(ids)
        for j, (s, c) in enumerate(zip(where.tolist(), cols.tolist())):
            if s >= 0:
                shard = retriever.shards[s]
                for i, t in enumerate(query):
                    if t in shard.term_rows:
                        out[i, j] = dense[id(shard)][shard.term_rows[t], c]
        return out

    expected = [reference(t, d) for t, d in zip(terms, docs)]
    assert sum(int((e > 0).sum()) for e in expected) > 100
    for got, want in zip(retriever.term_weights_batch(terms, docs), expected):
        np.testing.assert_array_equal(got, want)
    for t, d, want in zip(terms, docs, expected):
        np.testing.assert_array_equal(retriever.term_weights(t, d), want)
