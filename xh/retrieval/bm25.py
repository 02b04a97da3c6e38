"""Exact BM25 (rank-bm25's Okapi scores), fast, sharded by document range, saved under any storage URI.

The paper's first retrieval stage is "BM25 top 100". This module computes exactly the scores of
`rank_bm25.BM25Okapi` (k1 = 1.5, b = 0.75, epsilon = 0.25), much faster (docs/results/retrieval.md):

    idf(t)     = log(N - df(t) + 0.5) - log(df(t) + 0.5)            (natural log)
                 replaced by epsilon * average_idf where it is negative; average_idf is the mean
                 of the raw (unfloored) idf over EVERY term of the corpus vocabulary
    w(t, d)    = idf(t) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))
    score(q,d) = sum of w(t, d) over the query's tokens, repeats included (a token written twice
                 counts twice, as rank-bm25 loops over the query's tokens)

How it is fast: `w(t, d)` is computed once, at build time, into a sparse term x document matrix
(CSR, one row per term, float64 so that scores match rank-bm25 to ~1e-15, not float32's ~1e-6).
A batch of queries becomes a sparse query x term matrix of token counts, and one sparse matrix
product gives every (query, document) score; only documents that share a term with a query
appear, and top-k is an `argpartition` over those. No Python loop runs over documents.

With numba installed (optional), a compiled scorer (`xh.retrieval.bm25_kernel`) does the searching
instead: per query, its posting lists are walked together a window of 4,096 documents at a time, with
MaxScore pruning on each term's largest weight (`term_max`), and the k best kept in a heap; it adds a
document's weights in the order below, so both paths return the same documents and the same floats.
Without numba, or for a query of more than `LONG_QUERY` distinct terms, the numpy path runs:

Frequent terms (the up to 32 terms in 1/16 of the corpus or more: "born", "film", "american")
have the longest posting lists and the smallest weights. The numpy path keeps them as dense rows
too (8 bytes per document each, built on its first use) and leaves them out of the product: their weights are added to the
documents the other terms found, and a document with frequent terms only can score at most the
sum of their largest weights. When the k-th best score found beats that bound, the top k is
complete and exact; when not (a query of frequent terms only, say), the documents with frequent
terms only are scored too. Every path adds a document's term weights in one order (other terms,
then frequent ones, each in term order), so a score is the same float whichever path, shard
layout or batch computed it.

Sharding: `CorpusStats` (N, total length, document frequencies) is computed for the whole corpus,
or merged from per-shard partial counts, and handed to every shard, so a corpus split by document
range scores exactly as one index. `search_shards` runs the shards and merges their top-k.

Ranking rule (everywhere: one shard, merged shards): score descending, ties broken by the
document's *position* ascending, i.e. its index in corpus order (`doc_start` of its shard + its
row in the shard). Only documents with a positive score are returned: the documents without a
query term (score 0 in rank-bm25 too) are not candidates, and neither are the rare ones whose
terms all have idf 0 or less, which only happens to terms in half the corpus or more, in a corpus
whose average idf is not positive (a handful of documents). A query that matches nothing gets an
empty result whose `reason` says why.

Usage:

    from xh.retrieval.analyzer import Analyzer
    from xh.retrieval.bm25 import BM25Shard, CorpusStats, search_shards

    analyzer = Analyzer()
    tokens = analyzer.analyze_batch(texts)                  # one list of terms per document
    stats = CorpusStats.from_token_lists(tokens)             # or CorpusStats.merge(per-shard parts)
    shard = BM25Shard.build(doc_ids, tokens, stats, analyzer=analyzer)
    [hit] = shard.search_text(["Which college did the Romanian singer study at?"], k=100)
    hit.doc_ids, hit.scores, hit.reason                      # reason is None when there are hits
    top = shard.top_k(tokens_of_questions, k=100)            # the same as arrays: positions, scores, counts

    shard.save("s3://bucket/xh/bm25/shard-00000")            # or a local folder
    shard = BM25Shard.load("s3://bucket/xh/bm25/shard-00000")

    # a corpus in shards by document range: the same stats for all, each knows where it starts
    shards = [BM25Shard.build(ids[a:b], tokens[a:b], stats, analyzer=analyzer, doc_start=a) for a, b in ranges]
    results = search_shards(shards, questions, k=100)        # == one index over the whole corpus

A saved shard is a folder: `manifest.json` (see `BM25Shard.save`), `terms.parquet`, `docs.parquet`
and three `.npy` arrays (the CSR matrix); the manifest records every file's size and SHA-256, so a
missing or damaged file is named when the shard is loaded. Nothing is pickled.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import math
import posixpath
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import scipy.sparse as sp

from xh.retrieval.analyzer import EMPTY_TEXT, ONLY_STOP_WORDS, Analyzer, AnalyzerMismatchError
from xh.storage import uris as storage
from xh.storage.store import Location, located

__all__ = [
    "BM25Params",
    "CorpusStats",
    "BM25Shard",
    "SearchResult",
    "TopK",
    "merge_topk",
    "search_shards",
    "ShardFileError",
    "AnalyzerMismatchError",
    "NO_TERMS",
    "UNKNOWN_TERMS",
    "NO_POSITIVE_SCORE",
    "EMPTY_TEXT",
    "ONLY_STOP_WORDS",
]

FORMAT = "xh-bm25-shard"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"

# Reasons for an empty result (the analyzer's EMPTY_TEXT and ONLY_STOP_WORDS come first when the
# query arrives as text).
NO_TERMS = "the query has no terms"
UNKNOWN_TERMS = "no query term occurs in the index"
NO_POSITIVE_SCORE = "no document scores above zero (every query term is in half the documents or more)"
_REASON_ORDER = (EMPTY_TEXT, ONLY_STOP_WORDS, NO_TERMS, NO_POSITIVE_SCORE, UNKNOWN_TERMS)  # merged: first found

# A term in at least this fraction of the corpus is "frequent" (see the module docstring), and
# at most this many terms are (each costs 8 bytes per document in memory).
FREQUENT_FRACTION = 1 / 16
MAX_FREQUENT = 32

# Below this many queries a batch is scored with plain numpy (scipy's sparse product costs ~0.1 ms
# to set up per call, more than a single query's work on a shard of some 10^4 documents).
SMALL_BATCH = 8
# At most this many (query, document) entries in one sparse product, counted as the postings of the
# queries' terms (an upper bound): a batch is cut into parts below it, so the product's arrays (12
# bytes an entry) stay the same size whatever the shard's (a query above it alone is a part of its own).
PRODUCT_ENTRIES = 1 << 20
# Documents scored at a time from the frequent terms' dense rows when a query's top k needs the
# documents with frequent terms only: no working array spans the whole shard.
FREQUENT_BLOCK = 1 << 16
# The compiled scorer is used where numba imports and this is on; queries of more distinct terms than
# LONG_QUERY take the numpy path (the compiled one looks at each of a query's lists per document).
USE_KERNEL = True
LONG_QUERY = 256
# Queries per call of the compiled scorer: its output arrays (16 bytes per query and rank) stay bounded.
COMPILED_BATCH = 4096
_KERNEL = None  # the compiled scorer once imported; False where numba is missing


class ShardFileError(OSError):
    """A saved shard cannot be read: a file is missing, damaged, or not what the manifest says."""


@dataclass(frozen=True)
class BM25Params:
    """rank-bm25's BM25Okapi defaults."""

    k1: float = 1.5
    b: float = 0.75
    epsilon: float = 0.25


@dataclass(slots=True)
class SearchResult:
    """The top-k of one query: best first; empty with a `reason` when the query could not match.

    `positions` are the documents' indices in corpus order, the tie-break key (lower first).
    """

    doc_ids: list[str]
    scores: np.ndarray  # float64, descending
    positions: np.ndarray  # int64
    reason: str | None = None

    def __len__(self) -> int:
        return len(self.doc_ids)


@dataclass(frozen=True, slots=True)
class TopK:
    """The top k of a batch of queries as arrays (`BM25Shard.top_k`): query q's first `counts[q]` entries,
    best first; the others hold position -1 and score 0."""

    positions: np.ndarray  # int64, queries x k: the documents' indices in corpus order
    scores: np.ndarray  # float64, queries x k
    counts: np.ndarray  # int64, per query


def _empty(reason: str | None) -> SearchResult:
    return SearchResult([], np.zeros(0, np.float64), np.zeros(0, np.int64), reason)


# ------------------------------------------------------------------------------------------------
# Corpus statistics: computed over the whole corpus, or merged from shards' partial counts
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CorpusStats:
    """N, the total number of terms, and each term's document frequency, for the WHOLE corpus.

    BM25's idf and average document length are corpus-wide, and rank-bm25's epsilon floor uses the
    average idf over the whole vocabulary; so every shard is built from the same `CorpusStats`.
    Build it in one pass (`from_token_lists`), or per part and `merge` the parts.
    """

    num_docs: int
    total_length: int  # sum of document lengths in terms
    doc_freqs: dict[str, int] = field(repr=False)  # term -> number of documents containing it

    @classmethod
    def from_token_lists(cls, token_lists: Iterable[Sequence[str]]) -> CorpusStats:
        """The stats of these documents (each a list of terms from the analyzer)."""
        doc_freqs: Counter = Counter()
        num_docs = total_length = 0
        for tokens in token_lists:
            num_docs += 1
            total_length += len(tokens)
            doc_freqs.update(set(tokens))
        return cls(num_docs, total_length, dict(doc_freqs))

    @classmethod
    def merge(cls, parts: Iterable[CorpusStats]) -> CorpusStats:
        """The stats of the union of disjoint document sets (e.g. the shards' partial stats)."""
        doc_freqs: Counter = Counter()
        num_docs = total_length = 0
        for part in parts:
            num_docs += part.num_docs
            total_length += part.total_length
            doc_freqs.update(part.doc_freqs)
        return cls(num_docs, total_length, dict(doc_freqs))

    @property
    def avgdl(self) -> float:
        return self.total_length / self.num_docs

    def raw_idf(self, doc_freqs: Iterable[int]) -> np.ndarray:
        """log(N - df + 0.5) - log(df + 0.5), with math.log as rank-bm25 computes it (bit for bit)."""
        n = self.num_docs
        return np.array([math.log(n - df + 0.5) - math.log(df + 0.5) for df in doc_freqs], dtype=np.float64)

    @property
    def average_idf(self) -> float:
        """Mean raw idf over all terms of the vocabulary, negative ones included (rank-bm25's rule)."""
        cached = self.__dict__.get("_average_idf")
        if cached is None:
            raw = self.raw_idf(self.doc_freqs.values())
            cached = float(raw.sum() / len(raw)) if len(raw) else 0.0
            object.__setattr__(self, "_average_idf", cached)
        return cached

    def doc_freqs_of(self, terms: Sequence[str]) -> np.ndarray:
        try:
            return np.array([self.doc_freqs[t] for t in terms], dtype=np.int64)
        except KeyError as e:
            raise ValueError(
                f"term {e.args[0]!r} is not in the corpus stats: were they computed on other documents?"
            ) from None

    def idf(self, terms: Sequence[str], params: BM25Params = BM25Params()) -> np.ndarray:
        """Floored idf of `terms`: negative values become epsilon * average_idf."""
        raw = self.raw_idf(self.doc_freqs_of(terms).tolist())
        return np.where(raw < 0, params.epsilon * self.average_idf, raw)

    def summary(self) -> dict:
        """The scalars a manifest records, with a digest identifying the stats."""
        return {
            "num_docs": self.num_docs,
            "total_length": self.total_length,
            "avgdl": self.avgdl,
            "vocabulary_size": len(self.doc_freqs),
            "average_idf": self.average_idf,
            "frequent_df": self.frequent_df(),
            "digest": self.digest(),
        }

    def frequent_df(self) -> int:
        """The document frequency from which a term is "frequent": FREQUENT_FRACTION of the corpus,
        raised until at most MAX_FREQUENT terms reach it. Decided on the whole corpus, so that every
        shard picks the same frequent terms."""
        threshold = math.ceil(FREQUENT_FRACTION * self.num_docs)
        dfs = np.fromiter(self.doc_freqs.values(), dtype=np.int64, count=len(self.doc_freqs))
        if len(dfs) > MAX_FREQUENT:
            above = np.partition(dfs, len(dfs) - MAX_FREQUENT - 1)[len(dfs) - MAX_FREQUENT - 1]  # (MAX+1)-th largest
            threshold = max(threshold, int(above) + 1)
        return threshold

    def digest(self) -> str:
        """A hash of N, total length and every (term, df): shards of one index share it."""
        cached = self.__dict__.get("_digest")
        if cached is None:
            h = hashlib.sha256(f"{self.num_docs}\n{self.total_length}\n".encode())
            terms = sorted(self.doc_freqs)
            h.update("\n".join(terms).encode())
            h.update(np.array([self.doc_freqs[t] for t in terms], dtype=np.int64).tobytes())
            cached = h.hexdigest()[:16]
            object.__setattr__(self, "_digest", cached)
        return cached


# ------------------------------------------------------------------------------------------------
# Top-k with the tie rule
# ------------------------------------------------------------------------------------------------


def term_max(weights: sp.csr_array) -> np.ndarray:
    """Each term's largest weight (its row's maximum): what it can add to one document, per count."""
    if not weights.nnz:
        return np.zeros(weights.shape[0])
    starts = np.minimum(weights.indptr[:-1], weights.nnz - 1)
    return np.where(np.diff(weights.indptr) > 0, np.maximum.reduceat(weights.data, starts), 0.0)


def compiled_kernel():
    """The compiled top-k scorer (`xh.retrieval.bm25_kernel.search_batch`), or None where numba is not
    installed or `USE_KERNEL` is off; imported on first use (numba takes a second to import)."""
    global _KERNEL
    if not USE_KERNEL:
        return None
    if _KERNEL is None:
        try:
            from xh.retrieval.bm25_kernel import search_batch
        except ImportError:
            search_batch = False
        _KERNEL = search_batch
    return _KERNEL or None


def _top_k(scores: np.ndarray, positions: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k best entries: score descending, then position ascending."""
    n = len(scores)
    if n > k:
        # argpartition finds the k-th best score; every entry at least that good is a candidate,
        # so entries tied at the boundary are all seen and the tie rule (not chance) picks among them.
        kth = scores[scores.argpartition(n - k)[n - k]]
        candidates = (scores >= kth).nonzero()[0]
        order = np.lexsort((positions[candidates], -scores[candidates]))[:k]
        return candidates[order]
    return np.lexsort((positions, -scores))


def merge_topk(per_shard: Sequence[Sequence[SearchResult]], k: int) -> list[SearchResult]:
    """Merge the shards' results (`per_shard[s][q]`: shard s, query q) into one top-k per query."""
    if not per_shard:
        return []
    num_queries = len(per_shard[0])
    if any(len(results) != num_queries for results in per_shard):
        raise ValueError("every shard must answer the same queries")
    merged = []
    for q in range(num_queries):
        parts = [results[q] for results in per_shard]
        hits = [p for p in parts if len(p)]
        if not hits:
            reasons = {p.reason for p in parts}
            merged.append(_empty(next((r for r in _REASON_ORDER if r in reasons), UNKNOWN_TERMS)))
            continue
        scores = np.concatenate([p.scores for p in hits])
        positions = np.concatenate([p.positions for p in hits])
        doc_ids = list(itertools.chain.from_iterable(p.doc_ids for p in hits))
        best = _top_k(scores, positions, k)
        merged.append(SearchResult([doc_ids[i] for i in best], scores[best], positions[best]))
    return merged


def _postings(token_lists: Sequence[Sequence[str]], rows: dict[str, int], lengths: np.ndarray, block: int = 1 << 16):
    """(term row, doc, tf) of every distinct (term, doc) pair, sorted by term then doc: CSR order.

    Documents are counted a block at a time, so no array ever holds one entry per token of the
    whole shard (a shard of 10^6 paragraphs has some 10^8 tokens).
    """
    terms, docs, tfs = [], [], []
    for start in range(0, len(token_lists), block):
        stop = min(start + block, len(token_lists))
        n_tokens = int(lengths[start:stop].sum())
        tokens = itertools.chain.from_iterable(token_lists[start:stop])
        term_of_token = np.fromiter(map(rows.__getitem__, tokens), dtype=np.int64, count=n_tokens)
        doc_of_token = np.repeat(np.arange(stop - start, dtype=np.int64), lengths[start:stop])
        pairs, tf = np.unique(term_of_token * (stop - start) + doc_of_token, return_counts=True)
        term, doc = np.divmod(pairs, stop - start)
        terms.append(term)
        docs.append((doc + start).astype(np.int32))
        tfs.append(tf)
    if not terms:
        return np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int64)
    term = np.concatenate(terms)
    order = np.argsort(term, kind="stable")  # blocks are in doc order, so docs stay ascending within a term
    return term[order], np.concatenate(docs)[order], np.concatenate(tfs)[order]


# ------------------------------------------------------------------------------------------------
# One shard: a range of documents, their precomputed BM25 weights
# ------------------------------------------------------------------------------------------------


@dataclass(eq=False)
class BM25Shard:
    """The BM25 index of documents `doc_start .. doc_start + num_docs - 1` of a corpus.

    `weights` is a (terms x documents) CSR matrix of w(t, d) (idf included); row i is `terms[i]`.
    Build with `BM25Shard.build`, or `BM25Shard.load` a saved one.
    """

    analyzer: Analyzer
    params: BM25Params
    stats: dict  # CorpusStats.summary() of the corpus the shard belongs to
    doc_start: int
    doc_ids: np.ndarray | pa.StringArray  # row order: object array of str, or (mapped) an Arrow array
    doc_lengths: np.ndarray  # int32, terms per document
    terms: list[str] | pa.StringArray
    term_dfs: np.ndarray  # int64: each term's document frequency in the whole corpus
    weights: sp.csr_array
    # Given by `xh.retrieval.shared` for a shard mapped from a node's cache: the term lookup and the
    # frequent terms' arrays, computed once per node instead of once per process.
    term_rows: Mapping[str, int] | None = field(default=None, repr=False)
    prepared: dict | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.term_rows is None:
            self.term_rows = {t: i for i, t in enumerate(self.terms)}
        if self.prepared is not None:
            p = self.prepared
            self._has_nonpositive = bool(p["has_nonpositive"])
            self._slot, self._dense_rows, self._dense_max = p["slot"], p["dense"], p["dense_max"]
            self._term_max = p["term_max"] if "term_max" in p else term_max(self.weights)
            return
        # Some w(t, d) <= 0 only in a degenerate corpus (average idf <= 0); results then keep
        # positive scores only, and frequent-term pruning (whose bound needs w >= 0) is off.
        self._has_nonpositive = bool((self.weights.data <= 0).any())
        self._term_max = term_max(self.weights)
        # The frequent terms, chosen by corpus-wide df, so every shard of an index picks the same terms
        # and adds weights in the same order; their dense rows are built when the numpy path first needs them.
        frequent = np.flatnonzero(self.term_dfs >= self.stats["frequent_df"])
        if self._has_nonpositive:
            frequent = frequent[:0]
        self._slot = np.full(len(self.terms), -1, dtype=np.int64)  # term row -> row of _dense, or -1
        self._slot[frequent] = np.arange(len(frequent))
        self._dense_max = self._term_max[frequent]
        self._dense_rows = None

    @property
    def _dense(self) -> np.ndarray:
        """The frequent terms' weights as dense rows (8 bytes per document each), for the numpy path."""
        if self._dense_rows is None:
            indptr, docs, values = self.weights.indptr, self.weights.indices, self.weights.data
            frequent = np.flatnonzero(self._slot >= 0)
            dense = np.zeros((len(frequent), self.num_docs))
            for slot, row in enumerate(frequent.tolist()):
                dense[slot, docs[indptr[row] : indptr[row + 1]]] = values[indptr[row] : indptr[row + 1]]
            self._dense_rows = dense
        return self._dense_rows

    @property
    def num_docs(self) -> int:
        return len(self.doc_ids)

    @property
    def frequent_terms(self) -> list[str]:
        """The terms kept as dense rows (see `CorpusStats.frequent_df`)."""
        return [_as_str(self.terms[row]) for row in np.flatnonzero(self._slot >= 0).tolist()]

    def doc_id(self, row: int) -> str:
        """The doc id of one row."""
        return _as_str(self.doc_ids[row])

    def doc_ids_at(self, rows: np.ndarray) -> list[str]:
        """The doc ids of these rows, in their order."""
        if isinstance(self.doc_ids, pa.Array):
            return self.doc_ids.take(pa.array(rows, pa.int64())).to_pylist()
        return self.doc_ids[rows].tolist()

    @property
    def doc_stop(self) -> int:
        return self.doc_start + self.num_docs

    def memory_bytes(self) -> int:
        """Bytes of the shard's arrays in memory: the weight matrix, each term's largest weight, and the
        frequent terms' dense rows once the numpy path has built them."""
        w, dense = self.weights, self._dense_rows
        held = w.data.nbytes + w.indices.nbytes + w.indptr.nbytes + self._term_max.nbytes + self.doc_lengths.nbytes
        return held + (0 if dense is None else dense.nbytes)

    # -- building ------------------------------------------------------------------------------

    @classmethod
    def build(
        cls,
        doc_ids: Sequence[str],
        token_lists: Sequence[Sequence[str]],
        stats: CorpusStats,
        *,
        analyzer: Analyzer | None = None,
        doc_start: int = 0,
        params: BM25Params = BM25Params(),
    ) -> BM25Shard:
        """Index documents `doc_start ..` of the corpus `stats` describes.

        `token_lists` must come from `analyzer` (default `Analyzer()`), which the shard records and
        uses for text queries.
        """
        if stats.num_docs < 1:
            raise ValueError("the corpus stats describe no documents")
        if len(doc_ids) != len(token_lists):
            raise ValueError(f"{len(doc_ids)} doc ids but {len(token_lists)} token lists")
        if doc_start < 0 or doc_start + len(doc_ids) > stats.num_docs:
            raise ValueError(
                f"documents {doc_start}..{doc_start + len(doc_ids)} do not fit the corpus of "
                f"{stats.num_docs} documents the stats describe"
            )
        n = len(token_lists)
        terms = sorted(set(itertools.chain.from_iterable(token_lists)))
        lengths = np.fromiter(map(len, token_lists), dtype=np.int64, count=n)
        term, doc, tf = _postings(token_lists, {t: i for i, t in enumerate(terms)}, lengths)
        indptr = np.zeros(len(terms) + 1, dtype=np.int64)
        np.cumsum(np.bincount(term, minlength=len(terms)), out=indptr[1:])

        # rank-bm25's expression, operation for operation, so each term's contribution is the same float
        k1, b = params.k1, params.b
        dl = lengths[doc]
        dfs = stats.doc_freqs_of(terms)
        raw_idf = stats.raw_idf(dfs.tolist())
        idf = np.where(raw_idf < 0, params.epsilon * stats.average_idf, raw_idf)
        data = idf[term] * (tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / stats.avgdl)))

        return cls(
            analyzer=analyzer or Analyzer(),
            params=params,
            stats=stats.summary(),
            doc_start=doc_start,
            doc_ids=np.array(list(doc_ids), dtype=object),
            doc_lengths=lengths.astype(np.int32),
            terms=terms,
            term_dfs=dfs,
            weights=_csr(data, doc, indptr, (len(terms), n)),
        )

    # -- searching -----------------------------------------------------------------------------

    def search(
        self, queries: Sequence[Sequence[str]], k: int = 100, *, batch_size: int = 256, threads: int = 1
    ) -> list[SearchResult]:
        """Top-k documents of each query (a list of terms from this shard's analyzer).

        With numba installed, a compiled scorer (`xh.retrieval.bm25_kernel`) walks each query's posting
        lists with pruning, `threads` threads at once; queries of more than `LONG_QUERY` distinct terms,
        and every query without numba, take the numpy path: `batch_size` queries at a time in one
        sparse matrix product, or fewer than `SMALL_BATCH` without scipy's per-call set-up. Every path
        gives the same documents and the same floats.
        """
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        kernel = None if self._has_nonpositive else compiled_kernel()
        results: list[SearchResult] = []
        step = batch_size if kernel is None else max(batch_size, COMPILED_BATCH)
        for start in range(0, len(queries), step):
            batch = queries[start : start + step]
            results.extend(self._search_numpy(batch, k) if kernel is None else self._search_compiled(batch, k, threads))
        return results

    def top_k(self, queries: Sequence[Sequence[str]], k: int = 100, *, threads: int = 1) -> TopK:
        """`search`'s documents and scores as arrays, without a Python object per query (the compiled
        scorer writes them in place; doc ids: `doc_ids_at(positions - doc_start)`). An empty result has
        count 0; its reason is not kept."""
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        if self._has_nonpositive or compiled_kernel() is None:
            docs, scores = np.zeros((len(queries), k), np.int64), np.zeros((len(queries), k))
            counts, missing = np.zeros(len(queries), np.int64), range(len(queries))
        else:
            docs, scores, counts = self._top_k_compiled(queries, k, threads)
            missing = np.flatnonzero(counts < 0).tolist()  # long queries: the numpy path
        if len(missing):
            for q, result in zip(missing, self.search([queries[q] for q in missing], k)):
                counts[q] = len(result)
                docs[q, : len(result)], scores[q, : len(result)] = result.positions - self.doc_start, result.scores
        held = np.arange(k) < counts[:, None]
        return TopK(np.where(held, docs + np.int64(self.doc_start), -1), scores, counts)

    def _search_numpy(self, batch: Sequence[Sequence[str]], k: int) -> list[SearchResult]:
        if len(batch) < SMALL_BATCH:
            matches = self._match_small(batch)
            return [_empty(m) if isinstance(m, str) else self._top(*m, k) for m in matches]
        return [result for part in self._product_parts(batch) for result in self._search_batch(part, k)]

    def _search_compiled(self, queries: Sequence[Sequence[str]], k: int, threads: int) -> list[SearchResult]:
        """`search` of one batch with the compiled scorer; the threads share the batch's queries."""
        out_docs, out_scores, out_n = self._top_k_compiled(queries, k, threads)
        ids = self.doc_ids_at(out_docs[np.arange(k) < out_n[:, None]])
        ends = np.cumsum(np.maximum(out_n, 0)).tolist()
        # each result's arrays are views of a row (split off in C; sliced only when a query has fewer than k)
        score_rows, position_rows = list(out_scores), list(out_docs + np.int64(self.doc_start))
        results = [
            SearchResult(ids[a:b], s if b - a == k else s[: b - a], p if b - a == k else p[: b - a])
            if a < b
            else _empty(UNKNOWN_TERMS if len(q) else NO_TERMS)
            for a, b, q, s, p in zip([0, *ends[:-1]], ends, queries, score_rows, position_rows)
        ]
        long = np.flatnonzero(out_n < 0).tolist()
        for q, result in zip(long, self._search_numpy([queries[q] for q in long], k)):
            results[q] = result  # left to the numpy path: the compiled one proposes documents term by term
        return results

    def _top_k_compiled(self, queries: Sequence[Sequence[str]], k: int, threads: int):
        """The compiled scorer's (docs, scores, counts) of a batch: rows (k per query, best first), their
        scores, and how many each query has (-1 for a query of more than `LONG_QUERY` distinct terms).
        Python's part is one pass over the tokens (the term lookup); the threads share the queries."""
        token_ptr = np.zeros(len(queries) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, queries), np.int64, len(queries)), out=token_ptr[1:])
        tokens = itertools.chain.from_iterable(queries)
        token_rows = np.fromiter(map(self.term_rows.get, tokens, itertools.repeat(-1)), np.int64, int(token_ptr[-1]))
        n = len(queries)
        out_docs, out_scores = np.zeros((n, k), np.int64), np.zeros((n, k), np.float64)
        out_n = np.zeros(n, np.int64)
        w, kernel = self.weights, compiled_kernel()

        def run(a: int, b: int) -> None:
            kernel(w.indptr, w.indices, w.data, self._term_max, self._slot, token_ptr[a : b + 1], token_rows, k,
                   LONG_QUERY, out_docs[a:b], out_scores[a:b], out_n[a:b])  # fmt: skip

        # the threads' parts hold about as many tokens each (a long query is slower, not the others)
        cuts = np.searchsorted(token_ptr, np.linspace(0, token_ptr[-1], max(1, min(threads, n)) + 1)[1:-1])
        cuts = [0, *cuts.tolist(), n]
        if len(cuts) > 2:
            with ThreadPoolExecutor(len(cuts) - 1) as pool:
                list(pool.map(run, cuts[:-1], cuts[1:]))
        else:
            run(0, n)
        return out_docs, out_scores, out_n

    def _product_parts(self, queries: Sequence[Sequence[str]]) -> list[Sequence[Sequence[str]]]:
        """`queries` cut into consecutive parts whose terms that are not frequent have at most
        `PRODUCT_ENTRIES` postings together (each query's row of the product holds at most its terms'
        postings); a query with more is a part of its own."""
        rows, indptr = self.term_rows, self.weights.indptr
        columns = np.array([rows.get(t, -1) for tokens in queries for t in tokens], dtype=np.int64)
        query_of = np.repeat(np.arange(len(queries)), [len(tokens) for tokens in queries])
        known = columns >= 0
        columns, query_of = columns[known], query_of[known]
        postings = np.where(self._slot[columns] < 0, indptr[columns + 1] - indptr[columns], 0)
        per_query = np.bincount(query_of, weights=postings, minlength=len(queries)).tolist()
        parts, start, total = [], 0, 0.0
        for q, size in enumerate(per_query):
            if q > start and total + size > PRODUCT_ENTRIES:
                parts.append(queries[start:q])
                start, total = q, 0.0
            total += size
        parts.append(queries[start:])
        return parts

    def search_text(self, questions: Sequence[str], k: int = 100, *, batch_size: int = 256) -> list[SearchResult]:
        """Analyze the questions with the shard's analyzer, then `search`; empty results say why."""
        analyzed = [self.analyzer.analyze_with_reason(q) for q in questions]
        results = self.search([terms for terms, _ in analyzed], k, batch_size=batch_size)
        return [r if why is None else _empty(why) for r, (_, why) in zip(results, analyzed)]

    def score_all(self, queries: Sequence[Sequence[str]]) -> np.ndarray:
        """Every document's score for every query, dense (queries x documents): for checks and re-ranking."""
        matrix, frequent, _ = self._query_matrix(queries)
        scores = (matrix @ self.weights).toarray()
        for q, slot, count in zip(*frequent):  # sorted by query, then term: the order all paths add in
            scores[q] += count * self._dense[slot]
        return scores

    def _query_matrix(self, queries: Sequence[Sequence[str]]) -> tuple[sp.csr_array, tuple, np.ndarray]:
        """The queries' token counts: a sparse (queries x terms) matrix of the terms that are not
        frequent; the frequent ones as arrays (query, dense slot, count), sorted by query then slot;
        and how many known tokens each query has."""
        rows = self.term_rows
        columns = np.array([rows.get(t, -1) for tokens in queries for t in tokens], dtype=self.weights.indices.dtype)
        query_of = np.repeat(np.arange(len(queries), dtype=columns.dtype), [len(tokens) for tokens in queries])
        known = columns >= 0
        columns, query_of = columns[known], query_of[known]
        slots = self._slot[columns]
        other = slots < 0
        # duplicates are summed: a token written twice gets count 2, as rank-bm25 counts it twice
        matrix = sp.csr_array(
            (np.ones(int(other.sum())), (query_of[other], columns[other])), shape=(len(queries), len(self.terms))
        )
        num_slots = max(len(self._dense_max), 1)
        pairs, counts = np.unique(query_of[~other] * np.int64(num_slots) + slots[~other], return_counts=True)
        frequent = (pairs // num_slots, pairs % num_slots, counts.astype(np.float64))
        return matrix, frequent, np.bincount(query_of, minlength=len(queries))

    def _search_batch(self, queries: Sequence[Sequence[str]], k: int) -> list[SearchResult]:
        matrix, (query_of, slots, counts), known = self._query_matrix(queries)
        found = matrix @ self.weights  # CSR: row q holds the documents sharing a non-frequent term with query q
        indptr, docs, values = found.indptr.tolist(), found.indices, found.data
        # query q's frequent terms are slots[starts[q]:starts[q + 1]], in term order
        starts = np.searchsorted(query_of, np.arange(len(queries) + 1)).tolist()
        slots, counts = slots.tolist(), counts.tolist()
        results = []
        for q, tokens in enumerate(queries):
            if not known[q]:
                results.append(_empty(UNKNOWN_TERMS if len(tokens) else NO_TERMS))
                continue
            local, scores = docs[indptr[q] : indptr[q + 1]], values[indptr[q] : indptr[q + 1]]
            if starts[q] == starts[q + 1]:
                results.append(self._top(local, scores, k))
                continue
            bound = 0.0  # the best score of a document with frequent terms only
            frequent = list(zip(slots[starts[q] : starts[q + 1]], counts[starts[q] : starts[q + 1]]))
            for slot, count in frequent:
                scores = scores + count * self._dense[slot].take(local)
                bound += count * self._dense_max[slot]
            result = self._top(local, scores, k)
            if len(result) < k or result.scores[-1] <= bound:  # not provably complete: add the rest
                result = self._top(*self._with_frequent_only(local, scores, frequent, k), k)
            results.append(result)
        return results

    def _with_frequent_only(
        self, local: np.ndarray, scores: np.ndarray, frequent: list[tuple[int, float]], k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """The candidates for the top k among all matching documents: those found through other terms
        (`local`, `scores`, complete scores), and those with frequent terms only (`frequent`: (slot,
        count)), from the dense rows. Scored `FREQUENT_BLOCK` documents at a time, each block's top k
        kept: the top k of what is kept is the top k of all (the order is total: score, then position)."""
        order = np.argsort(local, kind="stable")
        local, scores = local[order], scores[order]
        kept_docs, kept_scores = [], []
        for start in range(0, self.num_docs, FREQUENT_BLOCK):
            stop = min(start + FREQUENT_BLOCK, self.num_docs)
            block = np.zeros(stop - start)
            for slot, count in frequent:
                block += count * self._dense[slot, start:stop]
            a, b = np.searchsorted(local, [start, stop])
            block[local[a:b] - start] = scores[a:b]
            matched = block.nonzero()[0]  # pruning runs only where every weight is positive
            docs, found = matched + start, block[matched]
            best = _top_k(found, docs, k)
            kept_docs.append(docs[best])
            kept_scores.append(found[best])
        if not kept_docs:
            return local[:0], scores[:0]
        return np.concatenate(kept_docs), np.concatenate(kept_scores)

    # A match is (local doc indices, scores) of the documents sharing a term with the query, or the
    # reason there are none.
    def _match_small(self, queries: Sequence[Sequence[str]]) -> list[tuple[np.ndarray, np.ndarray] | str]:
        """Every matching document's score with plain numpy, adding weights in the order all paths use."""
        rows, indptr, docs, values = self.term_rows, self.weights.indptr, self.weights.indices, self.weights.data
        matches: list[tuple[np.ndarray, np.ndarray] | str] = []
        for tokens in queries:
            counts = Counter(rows[t] for t in tokens if t in rows)
            if not counts:
                matches.append(UNKNOWN_TERMS if len(tokens) else NO_TERMS)
                continue
            order = sorted(counts, key=lambda r: (self._slot[r] >= 0, r))  # other terms, then frequent ones
            spans = [(indptr[r], indptr[r + 1], float(counts[r])) for r in order]
            if len(spans) == 1:
                a, b, count = spans[0]
                matches.append((docs[a:b], 0.0 + count * values[a:b]))
                continue
            all_docs = np.concatenate([docs[a:b] for a, b, _ in spans])
            all_values = np.concatenate([count * values[a:b] for a, b, count in spans])
            # the matched documents numbered 0..m-1 (no array spans the shard); bincount adds in input
            # order: per document, the spans' order above
            local, slot = np.unique(all_docs, return_inverse=True)
            matches.append((local, np.bincount(slot, weights=all_values, minlength=len(local))))
        return matches

    def _top(self, local: np.ndarray, scores: np.ndarray, k: int) -> SearchResult:
        """The result of one query from its matching documents (shard rows) and their scores."""
        if self._has_nonpositive:  # keep positive scores only (scipy's product already drops exact zeros)
            keep = scores > 0
            local, scores = local[keep], scores[keep]
            if not len(scores):
                return _empty(NO_POSITIVE_SCORE)
        best = _top_k(scores, local, k)
        local = local[best]
        return SearchResult(self.doc_ids_at(local), scores[best], local + np.int64(self.doc_start))

    # -- saving and loading --------------------------------------------------------------------

    def manifest(self) -> dict:
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "analyzer": {"fingerprint": self.analyzer.fingerprint(), "settings": self.analyzer.settings()},
            "params": {"k1": self.params.k1, "b": self.params.b, "epsilon": self.params.epsilon},
            "stats": self.stats,
            "shard": {
                "doc_start": self.doc_start,
                "doc_stop": self.doc_stop,
                "num_docs": self.num_docs,
                "num_terms": len(self.terms),
                "num_postings": int(self.weights.nnz),
            },
        }

    def save(self, where: Location | str) -> dict:
        """Write the shard under `where` (a folder; local or s3://); returns the manifest written.

        Files: terms.parquet (term, df in the whole corpus), docs.parquet (doc_id, length), indptr.npy (int64),
        doc_index.npy (int32), weights.npy (float64) and, written last, manifest.json: format,
        analyzer fingerprint and settings, BM25 params, corpus stats summary, doc range, and
        `files: {name: {bytes, sha256}}`.
        """
        fs, root = located(where).fs_path()
        fs.create_dir(root, recursive=True)
        blobs = {
            "terms.parquet": _parquet_bytes(
                pa.table({"term": _string_array(self.terms), "df": pa.array(self.term_dfs, pa.int64())})
            ),
            "docs.parquet": _parquet_bytes(
                pa.table({"doc_id": _string_array(self.doc_ids), "length": self.doc_lengths})
            ),
            "indptr.npy": _npy_bytes(self.weights.indptr.astype(np.int64)),
            "doc_index.npy": _npy_bytes(self.weights.indices.astype(np.int32)),
            "weights.npy": _npy_bytes(self.weights.data.astype(np.float64)),
        }
        manifest = self.manifest()
        manifest["files"] = {}
        for name, blob in blobs.items():
            with fs.open_output_stream(posixpath.join(root, name)) as out:
                out.write(blob)
            manifest["files"][name] = {"bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
        with fs.open_output_stream(posixpath.join(root, MANIFEST)) as out:
            out.write(json.dumps(manifest, indent=2).encode())
        return manifest

    @classmethod
    def load(cls, where: Location | str, analyzer: Analyzer | None = None) -> BM25Shard:
        """Read a saved shard. With `analyzer`, refuse a shard built with another one
        (`AnalyzerMismatchError`); without, use the analyzer the manifest records.

        A missing or damaged file raises `ShardFileError` naming it.
        """
        where = located(where)
        uri = where.uri
        files = _ShardFiles(where)
        manifest = files.manifest()
        try:
            recorded, shard, p = manifest["analyzer"], manifest["shard"], manifest["params"]
            if analyzer is None:
                analyzer = Analyzer.from_settings(recorded["settings"])
            analyzer.check_same(recorded["fingerprint"], what=f"the BM25 shard at {uri}")

            term_table = files.table("terms.parquet")
            terms = term_table.column("term").to_pylist()
            docs = files.table("docs.parquet")
            indptr = files.array("indptr.npy", np.int64)
            doc_index = files.array("doc_index.npy", np.int32)
            data = files.array("weights.npy", np.float64)
            n = docs.num_rows
            if (
                n != shard["num_docs"]
                or len(terms) != shard["num_terms"]
                or len(indptr) != len(terms) + 1
                or indptr[-1] != len(doc_index)
                or len(doc_index) != len(data)
                or (len(doc_index) and (doc_index.min() < 0 or doc_index.max() >= n))
            ):
                raise ShardFileError(f"BM25 shard at {uri}: its arrays do not fit together or with its manifest")
            return cls(
                analyzer=analyzer,
                params=BM25Params(p["k1"], p["b"], p["epsilon"]),
                stats=manifest["stats"],
                doc_start=shard["doc_start"],
                doc_ids=docs.column("doc_id").to_numpy(zero_copy_only=False).astype(object),
                doc_lengths=docs.column("length").to_numpy().astype(np.int32),
                terms=terms,
                term_dfs=term_table.column("df").to_numpy().astype(np.int64),
                weights=_csr(data, doc_index, indptr, (len(terms), n)),
            )
        except KeyError as e:
            raise ShardFileError(f"BM25 shard at {uri}: {e.args[0]!r} is missing from its manifest or tables") from None


class _ShardFiles:
    """Reads the files of a saved shard, checking each against the manifest; errors name the file."""

    def __init__(self, where: Location) -> None:
        self.uri = where.uri
        self.fs, self.root = where.fs_path()
        self.files: dict = {}

    def where(self, name: str) -> str:
        return storage.join(self.uri, name)

    def read(self, name: str) -> bytes:
        path = posixpath.join(self.root, name)
        try:
            with self.fs.open_input_stream(path) as f:
                data = f.readall()
        except OSError as e:  # FileNotFoundError locally; a plain OSError from S3
            if isinstance(e, FileNotFoundError) or self.fs.get_file_info(path).type == pafs.FileType.NotFound:
                raise ShardFileError(f"BM25 shard file {self.where(name)} is missing") from None
            raise ShardFileError(f"BM25 shard file {self.where(name)} cannot be read: {e}") from None
        if name != MANIFEST:
            expected = self.files.get(name)
            if expected is None:
                raise ShardFileError(f"BM25 shard manifest {self.where(MANIFEST)} does not list {name}")
            if len(data) != expected["bytes"] or hashlib.sha256(data).hexdigest() != expected["sha256"]:
                raise ShardFileError(
                    f"BM25 shard file {self.where(name)} is damaged: {len(data):,} bytes whose checksum is not the "
                    f"manifest's ({expected['bytes']:,} bytes); rebuild the shard"
                )
        return data

    def manifest(self) -> dict:
        try:
            manifest = json.loads(self.read(MANIFEST))
        except (ValueError, UnicodeDecodeError) as e:
            raise ShardFileError(f"BM25 shard manifest {self.where(MANIFEST)} is not valid JSON: {e}") from None
        found = (manifest.get("format"), manifest.get("format_version")) if isinstance(manifest, dict) else None
        if found != (FORMAT, FORMAT_VERSION):
            raise ShardFileError(f"{self.where(MANIFEST)} is not a {FORMAT} v{FORMAT_VERSION} manifest (found {found})")
        self.files = manifest.get("files", {})
        return manifest

    def table(self, name: str) -> pa.Table:
        data = self.read(name)
        try:
            return pq.read_table(pa.BufferReader(data))
        except Exception as e:  # written wrongly, yet matching its checksum
            raise ShardFileError(f"BM25 shard file {self.where(name)} cannot be read: {e}") from None

    def array(self, name: str, dtype) -> np.ndarray:
        data = self.read(name)
        try:
            arr = np.load(io.BytesIO(data), allow_pickle=False)
        except Exception as e:  # written wrongly, yet matching its checksum
            raise ShardFileError(f"BM25 shard file {self.where(name)} cannot be read: {e}") from None
        if arr.dtype != dtype or arr.ndim != 1:
            raise ShardFileError(
                f"BM25 shard file {self.where(name)} holds {arr.dtype}[{arr.ndim}d], not {np.dtype(dtype)}[1d]"
            )
        return arr


def _string_array(values) -> pa.Array:
    return values if isinstance(values, pa.Array) else pa.array(list(values), pa.string())


def _as_str(value) -> str:
    return value.as_py() if isinstance(value, pa.Scalar) else value


def _csr(data: np.ndarray, indices: np.ndarray, indptr: np.ndarray, shape: tuple[int, int]) -> sp.csr_array:
    """The weight matrix, with 32-bit indices while they fit (half the memory, a faster product)."""
    index_dtype = np.int32 if len(data) < np.iinfo(np.int32).max and shape[1] < np.iinfo(np.int32).max else np.int64
    return sp.csr_array((data, indices.astype(index_dtype), indptr.astype(index_dtype)), shape=shape)


def _parquet_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def _npy_bytes(arr: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, arr, allow_pickle=False)
    return out.getvalue()


# ------------------------------------------------------------------------------------------------
# Several shards as one index
# ------------------------------------------------------------------------------------------------


def search_shards(
    shards: Sequence[BM25Shard], queries: Sequence[str] | Sequence[Sequence[str]], k: int = 100
) -> list[SearchResult]:
    """Search every shard and merge: the same results as one index over their documents.

    `queries` are question texts (analyzed with the shards' analyzer) or lists of terms. The shards
    must come from one index: the same analyzer, params and corpus stats, disjoint doc ranges.
    """
    if not shards:
        raise ValueError("no shards to search")
    first = shards[0]
    for shard in shards[1:]:
        first.analyzer.check_same(shard.analyzer.fingerprint(), what=f"shard {shard.doc_start}..{shard.doc_stop}")
        if shard.params != first.params or shard.stats["digest"] != first.stats["digest"]:
            raise ValueError(
                f"shard {shard.doc_start}..{shard.doc_stop} has other BM25 params or corpus stats than shard "
                f"{first.doc_start}..{first.doc_stop}: they are not parts of one index"
            )
    ranges = sorted((s.doc_start, s.doc_stop) for s in shards)
    for (_, stop), (start, _) in zip(ranges, ranges[1:]):
        if start < stop:
            raise ValueError(f"shards overlap: document ranges {ranges}")
    if not all(isinstance(q, str) for q in queries):
        return merge_topk([shard.search(queries, k) for shard in shards], k)
    analyzed = [first.analyzer.analyze_with_reason(q) for q in queries]  # once, not once per shard
    tokens = [terms for terms, _ in analyzed]
    merged = merge_topk([shard.search(tokens, k) for shard in shards], k)
    return [r if why is None else _empty(why) for r, (_, why) in zip(merged, analyzed)]
