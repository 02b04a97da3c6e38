"""The path scorer's features computed per question batch (`xh.retrieval.paths.path_candidates_batch`,
`link_directions`, `Retriever.term_weights_batch`) against the per-pair scalar code they replaced, kept
here as the reference: on the real HotpotQA sample the pairs, their features and every candidate row
(the chosen pair, its score, the expansion's scores) are identical."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from xh import schemas
from xh.config import RetrieveConfig
from xh.retrieval import candidates
from xh.retrieval.bm25 import BM25Shard, CorpusStats, search_shards
from xh.retrieval.candidates import PATH_LINK_POOL, Retriever
from xh.retrieval.expansion import LinkGraph
from xh.retrieval.paths import FEATURES, PathCandidates, PathScorer, QuestionPaths, link_directions

# --- the reference: the scalar code that ran before the batch, as it was ------------------------------


def _scalar_path_candidates(ir_ids, term_weights, links, named, *, top, neighbours) -> PathCandidates:
    first = list(dict.fromkeys(ir_ids[:top]))
    if not first:
        return PathCandidates([], np.zeros((0, len(FEATURES)), np.float32))
    in_top = set(first)
    linked = {a: links(a) for a in first}
    extra = list(dict.fromkeys(b for a in first for b in linked[a] if b not in in_top))
    docs = first + extra
    weights = term_weights(docs)
    bm25 = dict(zip(docs, weights.sum(axis=0).tolist()))
    pairs = []
    for a in first:
        kept = sorted((b for b in linked[a] if b not in in_top), key=lambda b: -bm25[b])[:neighbours]
        pairs += [(a, b) for b in [*first, *kept] if b != a]
    return PathCandidates(pairs, _scalar_pair_features(pairs, ir_ids, top, weights, docs, linked, named))


def _scalar_pair_features(pairs, ir_ids, top, weights, docs, linked, named) -> np.ndarray:
    column = {d: i for i, d in enumerate(docs)}
    rank = {d: i for i, d in reversed(list(enumerate(ir_ids)))}
    in_top = set(ir_ids[:top])
    bm25 = weights.sum(axis=0)
    present = weights > 0
    num_terms = max(1, weights.shape[0])
    best = float(bm25[column[ir_ids[0]]]) if ir_ids and ir_ids[0] in column else float(bm25.max(initial=0.0))
    best = max(best, 1e-9)

    def doc(d: str) -> list[float]:
        c = column[d]
        return [
            float(bm25[c]) / best,
            1.0 / (1 + rank.get(d, len(ir_ids))),
            float(d in in_top),
            float(d in named),
            float(present[:, c].sum()) / num_terms,
        ]

    per_doc = {d: doc(d) for d in dict.fromkeys(d for pair in pairs for d in pair)}
    rows = []
    for a, b in pairs:
        direction = linked.get(a, {}).get(b)
        both_terms = float((present[:, column[a]] | present[:, column[b]]).sum()) / num_terms
        out, back = float(direction in ("out", "both")), float(direction in ("in", "both"))
        rows.append([*per_doc[a], *per_doc[b], out, back, both_terms])
    return np.asarray(rows, np.float32).reshape(len(rows), len(FEATURES))


class _ScalarRetriever(Retriever):
    """Retrieval as it ran before the batch: each question's pairs on their own, each document's links and
    weights looked up for it, the features pair by pair (expansion pairs too)."""

    def _question_paths(self, analyzed, ir_lists, named):
        settings = self.settings
        return [
            QuestionPaths(
                _scalar_path_candidates(
                    ir_ids,
                    lambda ids, terms=terms: self.term_weights(terms, ids),
                    lambda doc_id: self.graph.directions(doc_id, PATH_LINK_POOL),
                    names,
                    top=settings.path_top,
                    neighbours=settings.path_neighbours,
                ),
                [],
                np.zeros((0, 0)),
                {},
                0,
            )
            for terms, ir_ids, names in zip(analyzed, ir_lists, named)
        ]

    def _path_neighbours(self, terms, bm25_ids, named, pair, doc_ids, paths):
        settings = self.settings
        links = {a: self.graph.directions(a, settings.expansion_max_neighbours) for a in pair}
        pairs = [(a, n) for n in doc_ids for a in pair]
        docs = list(dict.fromkeys([*bm25_ids[:1], *pair, *doc_ids]))
        weights = self.term_weights(terms, docs)
        features = _scalar_pair_features(pairs, bm25_ids, settings.path_top, weights, docs, links, named)
        return self.path_scorer.score(features).reshape(len(doc_ids), len(pair)).max(axis=1)


# --- the real sample, as bench/rerank.py retrieves from it -----------------------------------------------


def _bench_rerank():
    path = Path(__file__).resolve().parents[3] / "bench" / "rerank.py"
    spec = importlib.util.spec_from_file_location("bench_rerank", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def sample(shared_data):
    """(records, the retriever's parts: one BM25 shard, entity linker, link graph, and a path scorer
    trained briefly on the first 200 questions as `xh retrieve paths` trains one) of the sample."""
    bench = _bench_rerank()
    records = json.loads((shared_data / "hotpotqa" / "hotpot_train_sample500.json").read_text())
    docs = bench.corpus_of(records)
    retriever, _ = bench.corpus_retriever(docs, bench.bm25_shard(docs), 100)
    by_title = {title: d for d, (title, _) in docs.items()}
    groups = retriever.question_paths([r["question"] for r in records[:200]])
    gold = [{by_title.get(t, f"missing:{t}") for t, _ in r["supporting_facts"]} for r in records[:200]]
    scorer = PathScorer.fit(groups, gold, epochs=60)
    return records, (retriever.shards, retriever.linker, retriever.graph), scorer, docs


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"path_top": 4, "path_neighbours": 2, "expansion_max_neighbours": 3, "expansion_keep": 5},
        {"path_neighbours": 0, "ir_candidates": 20},
    ],
)
def test_batched_path_features_and_rows_are_the_scalar_ones_on_the_real_sample(sample, settings):
    records, parts, scorer, _ = sample
    config = RetrieveConfig(ir_candidates=100).model_copy(update=settings)
    batched = Retriever(*parts, config, path_scorer=scorer)
    scalar = _ScalarRetriever(*parts, config, path_scorer=scorer)
    questions = [r["question"] for r in records]
    qids = [r["_id"] for r in records]

    new, old = batched.question_paths(questions), scalar.question_paths(questions)
    assert sum(len(c.pairs) for c in new) > 10 * len(questions)
    for got, expected in zip(new, old):
        assert got.pairs == expected.pairs
        np.testing.assert_array_equal(got.features, expected.features)

    expected = scalar.candidates(qids, questions)
    assert {r["ranker"] for r in expected if r["source"] != "el"} == {"paths"}
    assert batched.candidates(qids, questions) == expected  # one batch of 500
    by_batch = [
        row for i in range(0, len(qids), 37) for row in batched.candidates(qids[i : i + 37], questions[i : i + 37])
    ]
    assert by_batch == expected  # batch edges change nothing


def test_link_directions_are_the_graphs_own_for_every_document(sample):
    graph = sample[1][2]
    ids = graph.doc_ids.to_pylist()
    for limit in (1, 2, 3, PATH_LINK_POOL):
        assert link_directions(graph, [*ids, "no such doc"], limit) == [*(graph.directions(d, limit) for d in ids), {}]
    # repeated links, links both ways, and a hub past 4 * limit in-links (left to `directions` itself)
    edges = [("a", "b"), ("a", "b"), ("a", "c"), ("c", "a"), ("d", "a"), ("d", "a"), ("e", "a"), ("a", "e")]
    edges += [(f"in{i:02d}", "hub") for i in range(30)] + [("hub", "a"), ("a", "hub"), ("in03", "hub")]
    rows = [
        {"src_doc_id": s, "target_title": t, "target_doc_id": t, "anchor": t, "sentence": 0, "missing": False}
        for s, t in edges
    ]
    small = LinkGraph.from_table(pa.Table.from_pylist(rows, schema=schemas.LINKS))
    ids = [*small.doc_ids.to_pylist(), "a", "zz"]
    for limit in (1, 2, 3, 4, 5, 50):
        assert link_directions(small, ids, limit) == [small.directions(d, limit) for d in ids]
    assert link_directions(small, ["a"], 50)[0] == {"b": "out", "c": "both", "e": "both", "hub": "both", "d": "in"}
    assert link_directions(small, [], 5) == []


@pytest.mark.parametrize("cells", [None, 300])
def test_term_weights_of_a_batch_are_each_querys_own_over_several_shards(sample, cells, monkeypatch):
    from xh.retrieval.rerank import passage_text

    records, (shards, linker, graph), _, corpus = sample
    analyzer = shards[0].analyzer
    ids = list(corpus)
    tokens = analyzer.analyze_batch([passage_text(*corpus[d]) for d in ids])
    stats = CorpusStats.from_token_lists(tokens)
    third = len(ids) // 3
    split = [
        BM25Shard.build(ids[a:b], tokens[a:b], stats, analyzer=analyzer, doc_start=a)
        for a, b in ((0, third), (third, 2 * third), (2 * third, len(ids)))
    ]
    retriever = Retriever(split, linker, graph, RetrieveConfig())
    rng = np.random.default_rng(5)
    queries = [analyzer.analyze(r["question"]) for r in records[:60]]
    queries[3] = [*queries[3], queries[3][0], "zzzunknown"]  # a repeated term and one no shard knows
    queries[4] = []
    found = [list(hit.doc_ids) for hit in search_shards(split, queries, k=20)]  # documents sharing terms
    docs = [
        [*found[q][: int(rng.integers(0, 20))], *(ids[i] for i in rng.choice(len(ids), size=int(rng.integers(0, 20))))]
        + ["no such doc"]
        for q in range(len(queries))
    ]
    if cells is not None:  # many blocks, cut where a block's terms x documents pass `cells`
        monkeypatch.setattr(candidates, "BATCH_WEIGHT_CELLS", cells)
    got = retriever.term_weights_batch(queries, docs)
    assert len(got) == len(queries)
    for terms, doc_ids, weights in zip(queries, docs, got):
        np.testing.assert_array_equal(weights, retriever.term_weights(terms, doc_ids))
    assert sum(int((w > 0).sum()) for w in got) > 100
