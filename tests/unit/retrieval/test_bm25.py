"""Exact BM25 (xh.retrieval.bm25) against rank-bm25 on real HotpotQA paragraphs; shards, files, bad queries.

The reference is `rank_bm25.BM25Okapi` over the same token lists. Its ranking (np.argsort of the
scores) breaks ties arbitrarily, so top-k lists are compared ties aware: the same number of hits,
scores within 1e-6 of rank-bm25's best scores, every hit's rank-bm25 score within 1e-6 of the score
returned, and equal scores in position order (the project's tie rule).
"""

from __future__ import annotations

import json
import posixpath

import numpy as np
import pytest
from rank_bm25 import BM25Okapi

from xh.retrieval import bm25
from xh.retrieval.analyzer import EMPTY_TEXT, ONLY_STOP_WORDS, Analyzer, AnalyzerMismatchError
from xh.retrieval.bm25 import (
    MAX_FREQUENT,
    NO_POSITIVE_SCORE,
    NO_TERMS,
    SMALL_BATCH,
    UNKNOWN_TERMS,
    BM25Shard,
    CorpusStats,
    SearchResult,
    ShardFileError,
    merge_topk,
    search_shards,
)

pytestmark = pytest.mark.unit

TOLERANCE = 1e-6
SHARD_FILES = ["terms.parquet", "docs.parquet", "indptr.npy", "doc_index.npy", "weights.npy"]


# ------------------------------------------------------------------------------------------------
# Fixtures: the union of the context paragraphs of 500 HotpotQA questions, and the questions
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(shared_data):
    records = json.loads((shared_data / "hotpotqa" / "hotpot_train_sample500.json").read_text())
    paragraphs: dict[str, str] = {}
    for record in records:
        for title, sentences in record["context"]:
            paragraphs.setdefault(title, title + " " + "".join(sentences))
    analyzer = Analyzer()
    questions = [r["question"] for r in records]
    return {
        "analyzer": analyzer,
        "doc_ids": list(paragraphs),
        "tokens": analyzer.analyze_batch(paragraphs.values()),
        "questions": questions,
        "queries": analyzer.analyze_batch(questions),
    }


@pytest.fixture(scope="module")
def stats(corpus) -> CorpusStats:
    return CorpusStats.from_token_lists(corpus["tokens"])


@pytest.fixture(scope="module")
def shard(corpus, stats) -> BM25Shard:
    return BM25Shard.build(corpus["doc_ids"], corpus["tokens"], stats, analyzer=corpus["analyzer"])


@pytest.fixture(scope="module")
def reference(corpus) -> BM25Okapi:
    return BM25Okapi(corpus["tokens"])


@pytest.fixture(scope="module")
def reference_scores(corpus, reference) -> np.ndarray:
    """rank-bm25's score of every document for every question (500 x 4,968)."""
    return np.array([reference.get_scores(q) for q in corpus["queries"]])


def assert_top_k_agrees(result: SearchResult, reference: np.ndarray, k: int) -> None:
    matched = np.flatnonzero(reference > 0)
    expected = np.sort(reference[matched])[::-1][:k]
    assert len(result) == len(expected) == len(result.scores) == len(result.positions)
    np.testing.assert_allclose(result.scores, expected, rtol=0, atol=TOLERANCE)
    np.testing.assert_allclose(reference[result.positions], result.scores, rtol=0, atol=TOLERANCE)
    assert len(set(result.positions.tolist())) == len(result)
    ties = np.diff(result.scores) == 0
    assert np.all(np.diff(result.positions)[ties] > 0), "equal scores must come in position order"


# ------------------------------------------------------------------------------------------------
# Exactly rank-bm25
# ------------------------------------------------------------------------------------------------


@pytest.mark.shared_data
def test_corpus_is_the_real_sample(corpus, stats):
    assert len(corpus["doc_ids"]) == stats.num_docs == 4968
    assert len(corpus["queries"]) == 500


@pytest.mark.shared_data
def test_every_documents_score_equals_rank_bm25(shard, corpus, reference_scores):
    scores = shard.score_all(corpus["queries"])
    assert scores.shape == reference_scores.shape == (500, 4968)
    assert np.abs(scores - reference_scores).max() <= TOLERANCE


@pytest.mark.shared_data
@pytest.mark.parametrize("k", [10, 100])
def test_top_k_is_rank_bm25s_top_k(shard, corpus, reference_scores, k):
    results = shard.search(corpus["queries"], k)
    for result, reference, question in zip(results, reference_scores, corpus["questions"]):
        assert result.reason is None, question
        assert_top_k_agrees(result, reference, k)
        assert result.doc_ids == [corpus["doc_ids"][p] for p in result.positions]


@pytest.mark.shared_data
def test_idf_and_its_epsilon_floor_are_rank_bm25s(stats, reference, shard):
    assert stats.average_idf == pytest.approx(reference.average_idf, rel=1e-12)
    assert stats.avgdl == reference.avgdl
    terms = list(reference.idf)
    np.testing.assert_allclose(stats.idf(terms), [reference.idf[t] for t in terms], rtol=0, atol=1e-12)
    assert shard.stats["num_docs"] == reference.corpus_size


@pytest.mark.shared_data
def test_a_repeated_query_token_counts_twice(shard, reference, corpus):
    once, twice = ["romanian", "singer"], ["romanian", "romanian", "singer"]
    assert set(once) <= set(shard.term_rows)
    np.testing.assert_allclose(shard.score_all([twice])[0], reference.get_scores(twice), rtol=0, atol=TOLERANCE)
    single = shard.score_all([["romanian"]])[0]
    np.testing.assert_allclose(shard.score_all([twice])[0] - shard.score_all([once])[0], single, atol=1e-12)


SMALL = [
    "apple banana apple".split(),
    "banana cherry".split(),
    "banana apple date".split(),
    "banana".split(),
    "cherry date elder fig".split(),
    "banana fig".split(),
]


def test_small_corpus_with_negative_idf_equals_rank_bm25():
    """'banana' is in 5 of 6 documents: its idf is negative and floored at epsilon * average idf."""
    stats = CorpusStats.from_token_lists(SMALL)
    shard = BM25Shard.build([f"d{i}" for i in range(len(SMALL))], SMALL, stats)
    reference = BM25Okapi(SMALL)
    queries = [["banana"], ["apple"], ["banana", "fig"], ["fig", "fig", "cherry"], ["date", "elder", "banana"]]
    for query in queries:
        np.testing.assert_allclose(shard.score_all([query])[0], reference.get_scores(query), rtol=0, atol=1e-12)
        [result] = shard.search([query], k=3)
        assert_top_k_agrees(result, reference.get_scores(query), 3)
    assert reference.idf["banana"] == pytest.approx(0.25 * reference.average_idf) and reference.average_idf > 0


def test_degenerate_corpus_where_common_terms_score_below_zero():
    """Two documents: the average idf is negative, so a term in both scores below 0 everywhere."""
    docs = [["common", "rare"], ["common"]]
    shard = BM25Shard.build(["a", "b"], docs, CorpusStats.from_token_lists(docs))
    reference = BM25Okapi(docs)
    np.testing.assert_allclose(shard.score_all([["common"]])[0], reference.get_scores(["common"]), atol=1e-12)
    assert reference.get_scores(["common"]).max() < 0
    for results in (shard.search([["common"]], 5), shard.search([["common"]] * 10, 5)):
        assert len(results[0]) == 0 and results[0].reason == NO_POSITIVE_SCORE


@pytest.mark.shared_data
def test_every_path_gives_the_same_floats(shard, corpus):
    queries = corpus["queries"][:100]
    batched = shard.search(queries, 20)  # one sparse matrix product, frequent terms added after
    single = [shard.search([q], 20)[0] for q in queries]  # the numpy path for small batches
    every = shard.score_all(queries)
    for a, b, scores in zip(batched, single, every):
        assert a.doc_ids == b.doc_ids
        assert np.array_equal(a.scores, b.scores) and np.array_equal(a.positions, b.positions)
        assert np.array_equal(scores[a.positions], a.scores)


@pytest.mark.shared_data
def test_working_memory_bounded_by_parts_and_blocks_gives_the_same_floats(shard, corpus, monkeypatch):
    """A batch cut into parts of a few postings each, and the documents with frequent terms only scored
    a few hundred at a time: the same documents, scores and order as one product over the whole shard."""
    queries = corpus["queries"][:200] + [["film"], ["american", "film"], ["born", "state"]] * 4
    whole = shard.search(queries, 50)
    monkeypatch.setattr(bm25, "PRODUCT_ENTRIES", 2000)
    monkeypatch.setattr(bm25, "FREQUENT_BLOCK", 300)
    parts = shard._product_parts(queries)
    assert len(parts) > 20 and [q for part in parts for q in part] == queries
    assert any(len(part) == 1 for part in parts) and max(map(len, parts)) > 1
    assert shard.num_docs > 10 * bm25.FREQUENT_BLOCK
    for got, want in zip(shard.search(queries, 50), whole, strict=True):
        assert got.doc_ids == want.doc_ids and got.reason == want.reason
        assert np.array_equal(got.scores, want.scores) and np.array_equal(got.positions, want.positions)


@pytest.mark.shared_data
@pytest.mark.parametrize("k", [1, 10, 100])
def test_queries_of_frequent_terms_are_exact(shard, reference, k):
    """Frequent terms are added after the product and bounded; queries made mostly or only of them
    take the way round (every document), and still agree with rank-bm25."""
    frequent = shard.frequent_terms
    assert 0 < len(frequent) <= MAX_FREQUENT and {"born", "film", "american"} <= set(frequent)
    queries = [
        ["film"],
        ["american", "film"],
        ["born", "born", "state"],
        frequent[:6],
        ["film", "romanian"],
        ["american", "singer"],
        ["year", "born", "film", "album", "record"],
    ]
    batch = (queries * SMALL_BATCH)[: max(len(queries), SMALL_BATCH)]
    for result, query in zip(shard.search(batch, k), batch):
        assert_top_k_agrees(result, reference.get_scores(query), k)


def test_ties_are_broken_by_position_within_and_across_shards():
    docs = [["x", "y"], ["z"], ["x", "y"], ["y", "x"], ["w"], ["x", "y"], ["z", "z"]]
    ids = [f"doc{i}" for i in range(len(docs))]
    stats = CorpusStats.from_token_lists(docs)
    whole = BM25Shard.build(ids, docs, stats)
    for batch in (1, 10):  # both scoring paths
        [result] = whole.search([["x"]] * batch, k=3)[:1]
        assert result.doc_ids == ["doc0", "doc2", "doc3"] and len(set(result.scores.tolist())) == 1
    shards = [BM25Shard.build(ids[a:b], docs[a:b], stats, doc_start=a) for a, b in [(0, 3), (3, 5), (5, 7)]]
    [merged] = search_shards(shards[::-1], [["x"]], k=3)  # shard order does not matter either
    assert merged.doc_ids == ["doc0", "doc2", "doc3"] and merged.positions.tolist() == [0, 2, 3]


# ------------------------------------------------------------------------------------------------
# Shards: the same as one index
# ------------------------------------------------------------------------------------------------


@pytest.mark.shared_data
def test_three_shards_equal_one_index(corpus, stats, shard):
    ids, tokens, n = corpus["doc_ids"], corpus["tokens"], len(corpus["doc_ids"])
    ranges = [(0, 1500), (1500, 3333), (3333, n)]
    merged_stats = CorpusStats.merge(CorpusStats.from_token_lists(tokens[a:b]) for a, b in ranges)
    assert (merged_stats.num_docs, merged_stats.total_length) == (stats.num_docs, stats.total_length)
    assert merged_stats.doc_freqs == stats.doc_freqs and merged_stats.digest() == stats.digest()
    assert merged_stats.average_idf == pytest.approx(stats.average_idf, rel=1e-12)

    shards = [
        BM25Shard.build(ids[a:b], tokens[a:b], merged_stats, analyzer=corpus["analyzer"], doc_start=a)
        for a, b in ranges
    ]
    for part in shards:  # frequent terms are chosen on the whole corpus: the same in every shard
        assert set(part.frequent_terms) == set(shard.frequent_terms) & set(part.terms)
    for k in (10, 100):
        expected = shard.search_text(corpus["questions"], k)
        for results in (search_shards(shards, corpus["questions"], k), search_shards(shards, corpus["queries"], k)):
            for got, want in zip(results, expected):
                assert got.doc_ids == want.doc_ids and got.reason == want.reason
                assert np.array_equal(got.positions, want.positions) and np.array_equal(got.scores, want.scores)


def test_merge_of_empty_shard_results_keeps_the_reason():
    empty = SearchResult([], np.zeros(0), np.zeros(0, np.int64), UNKNOWN_TERMS)
    hit = SearchResult(["a"], np.array([1.0]), np.array([7]))
    assert merge_topk([[empty], [empty]], 5)[0].reason == UNKNOWN_TERMS
    [merged] = merge_topk([[empty], [hit]], 5)
    assert merged.doc_ids == ["a"] and merged.reason is None


def test_shards_of_different_indexes_are_refused():
    docs = [["a", "b"], ["b", "c"], ["c", "d"], ["d", "a"]]
    stats = CorpusStats.from_token_lists(docs)
    other = CorpusStats.from_token_lists(docs + [["e"]])
    left = BM25Shard.build(["0", "1"], docs[:2], stats)
    with pytest.raises(ValueError, match="corpus stats"):
        search_shards([left, BM25Shard.build(["2", "3"], docs[2:], other, doc_start=2)], [["a"]])
    with pytest.raises(ValueError, match="overlap"):
        search_shards([left, BM25Shard.build(["1", "2"], docs[1:3], stats, doc_start=1)], [["a"]])
    with pytest.raises(AnalyzerMismatchError):
        foreign = BM25Shard.build(["2", "3"], docs[2:], stats, doc_start=2, analyzer=Analyzer(stop_words=frozenset()))
        search_shards([left, foreign], [["a"]])


def test_build_refuses_inconsistent_input():
    docs = [["a"], ["b"]]
    stats = CorpusStats.from_token_lists(docs)
    with pytest.raises(ValueError, match="2 doc ids but 1 token lists"):
        BM25Shard.build(["0", "1"], docs[:1], stats)
    with pytest.raises(ValueError, match="do not fit"):
        BM25Shard.build(["0", "1"], docs, stats, doc_start=1)
    with pytest.raises(ValueError, match="'zzz' is not in the corpus stats"):
        BM25Shard.build(["0"], [["zzz"]], stats)
    with pytest.raises(ValueError, match="k must be"):
        BM25Shard.build(["0", "1"], docs, stats).search([["a"]], k=0)


# ------------------------------------------------------------------------------------------------
# Queries that cannot match
# ------------------------------------------------------------------------------------------------


@pytest.mark.shared_data
@pytest.mark.parametrize("batch", [1, 12])  # the small-batch path and the matrix product
def test_queries_without_usable_terms_return_nothing_and_say_why(shard, batch):
    questions = ["", "  ?! ", "Which of them was it?", "Qwxyzzy Blorptastic", "Romanian singer"]
    results = shard.search_text((questions * batch)[: max(batch, len(questions))], k=10)
    assert [r.reason for r in results[:5]] == [EMPTY_TEXT, EMPTY_TEXT, ONLY_STOP_WORDS, UNKNOWN_TERMS, None]
    assert [len(r) for r in results[:4]] == [0, 0, 0, 0] and len(results[4]) == 10
    for result in results[:4]:
        assert result.doc_ids == [] and result.scores.shape == (0,) and result.positions.shape == (0,)
    assert shard.search([[]], 10)[0].reason == NO_TERMS
    assert shard.search([["qwxyzzy"]] * batch, 10)[0].reason == UNKNOWN_TERMS
    # unknown terms beside known ones change nothing
    [mixed, plain] = shard.search([["qwxyzzy", "romanian", "singer"], ["romanian", "singer"]], 10)
    assert mixed.doc_ids == plain.doc_ids and np.array_equal(mixed.scores, plain.scores)


@pytest.mark.shared_data
def test_sharded_search_gives_the_same_reasons(corpus, stats, shard):
    questions = ["", "the of and", "Qwxyzzy", "Romanian singer"]
    results = search_shards([shard], questions, k=5)
    assert [r.reason for r in results] == [EMPTY_TEXT, ONLY_STOP_WORDS, UNKNOWN_TERMS, None]


# ------------------------------------------------------------------------------------------------
# Saving and loading
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved(shard, tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("bm25") / "shard-00000")
    shard.save(path)
    return path


@pytest.mark.shared_data
def test_save_and_load_round_trip(shard, saved, corpus):
    manifest = json.loads(open(posixpath.join(saved, "manifest.json")).read())
    assert manifest["format"] == "xh-bm25-shard" and manifest["format_version"] == 1
    assert manifest["analyzer"]["fingerprint"] == corpus["analyzer"].fingerprint()
    assert manifest["params"] == {"k1": 1.5, "b": 0.75, "epsilon": 0.25}
    assert manifest["shard"] == {
        "doc_start": 0,
        "doc_stop": 4968,
        "num_docs": 4968,
        "num_terms": len(shard.terms),
        "num_postings": shard.weights.nnz,
    }
    assert manifest["stats"]["num_docs"] == 4968 and manifest["stats"]["digest"] == shard.stats["digest"]
    assert sorted(manifest["files"]) == sorted(SHARD_FILES)

    for analyzer in (None, Analyzer()):  # the recorded analyzer, or the caller's equal one
        loaded = BM25Shard.load(saved, analyzer=analyzer)
        assert loaded.analyzer == corpus["analyzer"] and loaded.terms == shard.terms
        assert loaded.doc_ids.tolist() == shard.doc_ids.tolist()
        for got, want in zip(loaded.search_text(corpus["questions"], 10), shard.search_text(corpus["questions"], 10)):
            assert got.doc_ids == want.doc_ids and np.array_equal(got.scores, want.scores)


@pytest.mark.shared_data
def test_loading_with_another_analyzer_is_refused(saved):
    with pytest.raises(AnalyzerMismatchError, match="built with analyzer"):
        BM25Shard.load(saved, analyzer=Analyzer(language="porter"))


def _copy(saved: str, tmp_path) -> str:
    import shutil

    target = tmp_path / "copy"
    shutil.copytree(saved, target)
    return str(target)


@pytest.mark.shared_data
@pytest.mark.parametrize("name", SHARD_FILES)
def test_a_missing_file_is_named(saved, tmp_path, name):
    path = _copy(saved, tmp_path)
    (tmp_path / "copy" / name).unlink()
    with pytest.raises(ShardFileError, match=rf"{name} is missing"):
        BM25Shard.load(path)


@pytest.mark.shared_data
@pytest.mark.parametrize("name", SHARD_FILES)
def test_a_damaged_file_is_named(saved, tmp_path, name):
    path = _copy(saved, tmp_path)
    file = tmp_path / "copy" / name
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    file.write_bytes(bytes(data))
    with pytest.raises(ShardFileError, match=rf"{name} is damaged"):
        BM25Shard.load(path)
    file.write_bytes(bytes(data[: len(data) // 2]))  # truncated
    with pytest.raises(ShardFileError, match=rf"{name} is damaged"):
        BM25Shard.load(path)


@pytest.mark.shared_data
def test_a_missing_or_broken_manifest_is_named(saved, tmp_path):
    path = _copy(saved, tmp_path)
    manifest = tmp_path / "copy" / "manifest.json"
    manifest.write_text("{not json")
    with pytest.raises(ShardFileError, match="manifest.json is not valid JSON"):
        BM25Shard.load(path)
    manifest.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(ShardFileError, match="not a xh-bm25-shard"):
        BM25Shard.load(path)
    manifest.unlink()
    with pytest.raises(ShardFileError, match="manifest.json is missing"):
        BM25Shard.load(path)
    with pytest.raises(ShardFileError, match="missing"):
        BM25Shard.load(str(tmp_path / "no-such-shard"))
