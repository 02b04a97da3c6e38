"""The compiled BM25 scorer (xh.retrieval.bm25_kernel) against the numpy path and rank-bm25; bad queries.

The compiled path (numba, optional) and the numpy path must return the same documents in the same order
with the same floats, bit for bit, on a generated corpus of several scoring windows (short documents:
many equal scores, so the tie rule is exercised) and on the real HotpotQA sample.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from rank_bm25 import BM25Okapi

from xh.retrieval import bm25
from xh.retrieval.analyzer import Analyzer
from xh.retrieval.bm25 import LONG_QUERY, NO_TERMS, UNKNOWN_TERMS, BM25Shard, CorpusStats
from xh.synth import WorldSpec, page

pytestmark = pytest.mark.unit
kernel = pytest.importorskip("xh.retrieval.bm25_kernel", reason="numba (the compiled scorer) is not installed")

TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def world():
    """9,000 generated pages (more than two of the compiled scorer's windows), their shard and rank-bm25."""
    spec = WorldSpec(num_docs=9000, seed=5)
    pages = [page(spec, i) for i in range(spec.num_docs)]
    tokens = Analyzer().analyze_batch(p.title + " " + "".join(p.sentences) for p in pages)
    shard = BM25Shard.build([str(p.doc_id) for p in pages], tokens, CorpusStats.from_token_lists(tokens))
    rng = np.random.default_rng(3)
    vocabulary = sorted(shard.term_rows)
    by_df = [vocabulary[i] for i in np.argsort(-shard.term_dfs[[shard.term_rows[t] for t in vocabulary]])]
    queries = [list(rng.choice(vocabulary, size=int(rng.integers(1, 12)))) for _ in range(150)]
    queries += [by_df[:3], by_df[:1], [by_df[0], by_df[0], by_df[5]], by_df[:40], list(rng.choice(vocabulary, 200))]
    queries += [tokens[i][:6] for i in range(0, 9000, 300)]  # documents' own words: many near-equal scores
    return {"shard": shard, "tokens": tokens, "queries": queries, "vocabulary": vocabulary}


def search(shard: BM25Shard, queries, k: int, compiled: bool, threads: int = 1):
    saved = bm25.USE_KERNEL
    bm25.USE_KERNEL = compiled
    try:
        return shard.search(queries, k, threads=threads)
    finally:
        bm25.USE_KERNEL = saved


def assert_same(got, want) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.doc_ids == b.doc_ids and a.reason == b.reason
        assert np.array_equal(a.scores, b.scores) and np.array_equal(a.positions, b.positions)


@pytest.mark.parametrize("k", [1, 10, 100])
def test_compiled_path_is_the_numpy_path_bit_for_bit(world, k):
    shard, queries = world["shard"], world["queries"]
    assert shard.num_docs > 2 * kernel.WINDOW
    compiled = search(shard, queries, k, compiled=True)
    assert_same(compiled, search(shard, queries, k, compiled=False))
    assert_same(search(shard, queries, k, compiled=True, threads=2), compiled)
    assert sum(len(r) == k for r in compiled) > len(queries) // 2  # most queries fill their top k
    assert k < 100 or any(0 < len(r) < k for r in compiled)  # and results cut short of k are exercised


def test_compiled_path_is_rank_bm25s_top_k(world):
    reference = BM25Okapi(world["tokens"])
    shard = world["shard"]
    for query, result in zip(world["queries"], search(shard, world["queries"], 10, compiled=True)):
        scores = reference.get_scores(query)
        matched = np.flatnonzero(scores > 0)
        expected = np.sort(scores[matched])[::-1][:10]
        np.testing.assert_allclose(result.scores, expected, rtol=0, atol=TOLERANCE)
        np.testing.assert_allclose(scores[result.positions], result.scores, rtol=0, atol=TOLERANCE)
        ties = np.diff(result.scores) == 0
        assert np.all(np.diff(result.positions)[ties] > 0), "equal scores must come in position order"


@pytest.mark.parametrize("compiled", [True, False])
def test_bad_queries_answer_empty_or_exact_and_leave_the_others_alone(world, compiled):
    """An empty query, one of 10,000 terms, one of terms the index lacks (alone and beside known ones):
    no error, empty results that say why or the exact top k, and every other query of the batch gets
    what it gets in a batch of its own."""
    shard, queries = world["shard"], world["queries"][:40]
    rng = np.random.default_rng(11)
    huge = list(rng.choice(world["vocabulary"], size=10_000))
    assert len(set(huge)) > LONG_QUERY
    bad = [[], huge, ["qwxyzzy"], ["qwxyzzy", *queries[0]]]
    batch = queries[:20] + bad + queries[20:]
    results = search(shard, batch, 10, compiled=compiled)
    assert_same(results[:20] + results[24:], search(shard, queries, 10, compiled=compiled))
    empty, long, absent, mixed = results[20:24]
    assert (len(empty), empty.reason) == (0, NO_TERMS)
    assert (len(absent), absent.reason) == (0, UNKNOWN_TERMS)
    assert_same([mixed], search(shard, [queries[0]], 10, compiled=compiled))
    every = shard.score_all([huge])[0]
    order = np.lexsort((np.arange(len(every)), -every))[:10]
    assert long.positions.tolist() == order.tolist() and np.array_equal(long.scores, every[order])


@pytest.mark.shared_data
@pytest.mark.parametrize("k", [10, 100])
def test_compiled_path_on_real_paragraphs(shared_data, k):
    records = json.loads((shared_data / "hotpotqa" / "hotpot_train_sample500.json").read_text())
    paragraphs = {t: t + " " + "".join(s) for r in records for t, s in r["context"]}
    analyzer = Analyzer()
    tokens = analyzer.analyze_batch(paragraphs.values())
    shard = BM25Shard.build(list(paragraphs), tokens, CorpusStats.from_token_lists(tokens), analyzer=analyzer)
    queries = analyzer.analyze_batch(r["question"] for r in records)
    frequent = shard.frequent_terms
    queries += [frequent[:1], frequent[:6], ["film", "film", "romanian"]]
    assert_same(search(shard, queries, k, compiled=True), search(shard, queries, k, compiled=False))


@pytest.mark.parametrize("compiled", [True, False])
def test_top_k_arrays_are_the_search_results(world, compiled):
    """`top_k` (arrays, no object per query) holds `search`'s documents and floats, bad queries included."""
    shard = world["shard"]
    rng = np.random.default_rng(12)
    queries = world["queries"][:30] + [[], ["qwxyzzy"], list(rng.choice(world["vocabulary"], size=10_000))]
    saved = bm25.USE_KERNEL
    bm25.USE_KERNEL = compiled
    try:
        arrays = shard.top_k(queries, 10, threads=2)
    finally:
        bm25.USE_KERNEL = saved
    results = search(shard, queries, 10, compiled=compiled)
    assert arrays.counts.tolist() == [len(r) for r in results]
    for q, result in enumerate(results):
        n = len(result)
        assert arrays.positions[q, :n].tolist() == result.positions.tolist()
        assert np.array_equal(arrays.scores[q, :n], result.scores)
        assert (arrays.positions[q, n:] == -1).all()
    assert arrays.counts[-1] == 10 and arrays.counts[-3:-1].tolist() == [0, 0]


def test_bad_queries_cost_the_batch_no_more_than_their_own_time(world):
    """A batch with an empty query, one of 10,000 terms and one of absent terms takes the processor time of
    the batch without them plus theirs alone (slack for noise: 2x and 0.05 s): they add their own cost, the
    others are not slowed. Processor time, the best of 3, so that other work on the machine counts less."""
    shard, queries = world["shard"], world["queries"][:100]
    bad = [[], list(np.random.default_rng(13).choice(world["vocabulary"], size=10_000)), ["qwxyzzy", "zzyxwq"]]

    def cpu(batch) -> float:
        best = float("inf")
        for _ in range(3):
            start = time.process_time()
            shard.search(batch, 10, threads=1)
            best = min(best, time.process_time() - start)
        return best

    cpu(queries + bad)  # warm-up (the compiler, the numpy path's dense rows)
    assert cpu(queries[:50] + bad + queries[50:]) <= 2 * (cpu(queries) + cpu(bad)) + 0.05
