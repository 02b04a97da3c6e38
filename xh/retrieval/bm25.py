"""Exact BM25 (rank-bm25's Okapi scores), fast, sharded by document range, saved under any storage URI.

The paper's first retrieval stage is "BM25 top 100". This module computes exactly the scores of
`rank_bm25.BM25Okapi` (k1 = 1.5, b = 0.75, epsilon = 0.25), several hundred times faster:

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

Sharding: `CorpusStats` (N, total length, document frequencies) is computed for the whole corpus,
or merged from per-shard partial counts, and handed to every shard, so a corpus split by document
range scores exactly as one index. `search_shards` runs the shards and merges their top-k.

Ranking rule (everywhere: one shard, merged shards): score descending, ties broken by the
document's *position* ascending, i.e. its index in corpus order (`doc_start` of its shard + its
row in the shard). Only documents that contain at least one query term are returned: documents
without one score 0 in rank-bm25 too, and are not candidates. A query with no usable term gets
an empty result whose `reason` says why.

Usage:

    from xh.retrieval.analyzer import Analyzer
    from xh.retrieval.bm25 import BM25Shard, CorpusStats, search_shards

    analyzer = Analyzer()
    tokens = analyzer.analyze_batch(texts)                  # one list of terms per document
    stats = CorpusStats.from_token_lists(tokens)             # or CorpusStats.merge(per-shard parts)
    shard = BM25Shard.build(doc_ids, tokens, stats, analyzer=analyzer)
    [hit] = shard.search_text(["Which college did the Romanian singer study at?"], k=100)
    hit.doc_ids, hit.scores, hit.reason                      # reason is None when there are hits

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
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import scipy.sparse as sp

from xh import storage
from xh.retrieval.analyzer import EMPTY_TEXT, ONLY_STOP_WORDS, Analyzer, AnalyzerMismatchError

__all__ = [
    "BM25Params",
    "CorpusStats",
    "BM25Shard",
    "SearchResult",
    "merge_topk",
    "search_shards",
    "ShardFileError",
    "AnalyzerMismatchError",
    "NO_TERMS",
    "UNKNOWN_TERMS",
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
_REASON_ORDER = (EMPTY_TEXT, ONLY_STOP_WORDS, NO_TERMS, UNKNOWN_TERMS)


class ShardFileError(OSError):
    """A saved shard cannot be read: a file is missing, damaged, or not what the manifest says."""


@dataclass(frozen=True)
class BM25Params:
    """rank-bm25's BM25Okapi defaults."""

    k1: float = 1.5
    b: float = 0.75
    epsilon: float = 0.25


@dataclass(frozen=True)
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
    def from_token_lists(cls, token_lists: Iterable[Sequence[str]]) -> "CorpusStats":
        doc_freqs: Counter = Counter()
        num_docs = total_length = 0
        for tokens in token_lists:
            num_docs += 1
            total_length += len(tokens)
            doc_freqs.update(set(tokens))
        return cls(num_docs, total_length, dict(doc_freqs))

    @classmethod
    def merge(cls, parts: Iterable["CorpusStats"]) -> "CorpusStats":
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
            cached = float(self.raw_idf(self.doc_freqs.values()).sum() / len(self.doc_freqs))
            object.__setattr__(self, "_average_idf", cached)
        return cached

    def idf(self, terms: Sequence[str], params: BM25Params = BM25Params()) -> np.ndarray:
        """Floored idf of `terms`: negative values become epsilon * average_idf."""
        try:
            raw = self.raw_idf([self.doc_freqs[t] for t in terms])
        except KeyError as e:
            raise ValueError(f"term {e.args[0]!r} is not in the corpus stats: were they computed on other documents?")
        return np.where(raw < 0, params.epsilon * self.average_idf, raw)

    def summary(self) -> dict:
        """The scalars a manifest records, with a digest identifying the stats."""
        return {
            "num_docs": self.num_docs,
            "total_length": self.total_length,
            "avgdl": self.avgdl,
            "vocabulary_size": len(self.doc_freqs),
            "average_idf": self.average_idf,
            "digest": self.digest(),
        }

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


def _top_k(scores: np.ndarray, positions: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k best entries: score descending, then position ascending."""
    if len(scores) > k:
        # argpartition finds the k-th best score; every entry at least that good is a candidate,
        # so entries tied at the boundary are all seen and the tie rule (not chance) picks among them.
        kth = scores[np.argpartition(scores, len(scores) - k)[len(scores) - k]]
        candidates = np.flatnonzero(scores >= kth)
    else:
        candidates = np.arange(len(scores))
    order = np.lexsort((positions[candidates], -scores[candidates]))[:k]
    return candidates[order]


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
    doc_ids: np.ndarray  # object array of str, row order
    doc_lengths: np.ndarray  # int32, terms per document
    terms: list[str]
    weights: sp.csr_array
    term_rows: dict[str, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.term_rows = {t: i for i, t in enumerate(self.terms)}

    @property
    def num_docs(self) -> int:
        return len(self.doc_ids)

    @property
    def doc_stop(self) -> int:
        return self.doc_start + self.num_docs

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
    ) -> "BM25Shard":
        """Index documents `doc_start ..` of the corpus `stats` describes.

        `token_lists` must come from `analyzer` (default `Analyzer()`), which the shard records and
        uses for text queries.
        """
        if len(doc_ids) != len(token_lists):
            raise ValueError(f"{len(doc_ids)} doc ids but {len(token_lists)} token lists")
        if doc_start < 0 or doc_start + len(doc_ids) > stats.num_docs:
            raise ValueError(
                f"documents {doc_start}..{doc_start + len(doc_ids)} do not fit the corpus of {stats.num_docs} the stats describe"
            )
        n = len(token_lists)
        terms = sorted(set(itertools.chain.from_iterable(token_lists)))
        rows = {t: i for i, t in enumerate(terms)}
        lengths = np.fromiter(map(len, token_lists), dtype=np.int64, count=n)
        term_of_token = np.array(list(map(rows.__getitem__, itertools.chain.from_iterable(token_lists))), dtype=np.int64)
        doc_of_token = np.repeat(np.arange(n, dtype=np.int64), lengths)

        # (term, doc) pairs with their counts, sorted by term then doc: CSR order directly.
        pairs, tf = np.unique(term_of_token * max(n, 1) + doc_of_token, return_counts=True)
        term, doc = np.divmod(pairs, max(n, 1))
        indptr = np.zeros(len(terms) + 1, dtype=np.int64)
        np.cumsum(np.bincount(term, minlength=len(terms)), out=indptr[1:])

        # rank-bm25's expression, operation for operation, so each term's contribution is the same float
        k1, b = params.k1, params.b
        dl = lengths[doc]
        idf = stats.idf(terms, params)
        data = idf[term] * (tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / stats.avgdl)))

        weights = sp.csr_array((data, doc.astype(np.int32), indptr), shape=(len(terms), n))
        return cls(
            analyzer=analyzer or Analyzer(),
            params=params,
            stats=stats.summary(),
            doc_start=doc_start,
            doc_ids=np.array(list(doc_ids), dtype=object),
            doc_lengths=lengths.astype(np.int32),
            terms=terms,
            weights=weights,
        )

    # -- searching -----------------------------------------------------------------------------

    def search(self, queries: Sequence[Sequence[str]], k: int = 100, *, batch_size: int = 256) -> list[SearchResult]:
        """Top-k documents of each query (a list of terms from this shard's analyzer)."""
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        results: list[SearchResult] = []
        for start in range(0, len(queries), batch_size):
            results.extend(self._search_batch(queries[start : start + batch_size], k))
        return results

    def search_text(self, questions: Sequence[str], k: int = 100, *, batch_size: int = 256) -> list[SearchResult]:
        """Analyze the questions with the shard's analyzer, then `search`; empty results say why."""
        analyzed = [self.analyzer.analyze_with_reason(q) for q in questions]
        results = self.search([terms for terms, _ in analyzed], k, batch_size=batch_size)
        return [r if why is None else _empty(why) for r, (_, why) in zip(results, analyzed)]

    def score_all(self, queries: Sequence[Sequence[str]]) -> np.ndarray:
        """Every document's score for every query, dense (queries x documents): for checks and re-ranking."""
        matrix, _ = self._query_matrix(queries)
        return (matrix @ self.weights).toarray()

    def _query_matrix(self, queries: Sequence[Sequence[str]]) -> tuple[sp.csr_array, np.ndarray]:
        """Sparse (queries x terms) matrix of token counts; and how many known tokens each query has."""
        rows = self.term_rows
        columns = np.array([rows.get(t, -1) for tokens in queries for t in tokens], dtype=np.int64)
        query_of = np.repeat(np.arange(len(queries)), [len(tokens) for tokens in queries])
        known = columns >= 0
        # duplicates are summed: a token written twice gets count 2, as rank-bm25 counts it twice
        matrix = sp.csr_array(
            (np.ones(int(known.sum())), (query_of[known], columns[known])), shape=(len(queries), len(self.terms))
        )
        return matrix, np.bincount(query_of[known], minlength=len(queries))

    def _search_batch(self, queries: Sequence[Sequence[str]], k: int) -> list[SearchResult]:
        matrix, known = self._query_matrix(queries)
        scores = matrix @ self.weights  # CSR: row q holds the documents sharing a term with query q
        indptr, docs, values = scores.indptr, scores.indices, scores.data
        results = []
        for q, tokens in enumerate(queries):
            if not known[q]:
                results.append(_empty(UNKNOWN_TERMS if len(tokens) else NO_TERMS))
                continue
            row_docs = docs[indptr[q] : indptr[q + 1]]
            row_scores = values[indptr[q] : indptr[q + 1]]
            best = _top_k(row_scores, row_docs, k)
            local = row_docs[best]
            results.append(SearchResult(self.doc_ids[local].tolist(), row_scores[best], local + np.int64(self.doc_start)))
        return results

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

    def save(self, uri: str, s3: storage.S3Settings | None = None) -> dict:
        """Write the shard under `uri` (a folder; local or s3://); returns the manifest written.

        Files: terms.parquet (term), docs.parquet (doc_id, length), indptr.npy (int64),
        doc_index.npy (int32), weights.npy (float64) and, written last, manifest.json: format,
        analyzer fingerprint and settings, BM25 params, corpus stats summary, doc range, and
        `files: {name: {bytes, sha256}}`.
        """
        fs, root = storage.resolve(uri, s3)
        fs.create_dir(root, recursive=True)
        blobs = {
            "terms.parquet": _parquet_bytes(pa.table({"term": pa.array(self.terms, pa.string())})),
            "docs.parquet": _parquet_bytes(
                pa.table({"doc_id": pa.array(self.doc_ids.tolist(), pa.string()), "length": self.doc_lengths})
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
    def load(cls, uri: str, analyzer: Analyzer | None = None, s3: storage.S3Settings | None = None) -> "BM25Shard":
        """Read a saved shard. With `analyzer`, refuse a shard built with another one
        (`AnalyzerMismatchError`); without, use the analyzer the manifest records.

        A missing or damaged file raises `ShardFileError` naming it.
        """
        fs, root = storage.resolve(uri, s3)
        manifest_path = posixpath.join(root, MANIFEST)
        try:
            manifest = json.loads(_read(fs, manifest_path))
        except (ValueError, UnicodeDecodeError) as e:
            raise ShardFileError(f"BM25 shard manifest {manifest_path} is not valid JSON: {e}") from None
        if manifest.get("format") != FORMAT or manifest.get("format_version") != FORMAT_VERSION:
            raise ShardFileError(
                f"{manifest_path} is not a {FORMAT} v{FORMAT_VERSION} manifest "
                f"(format={manifest.get('format')!r}, version={manifest.get('format_version')!r})"
            )
        recorded = manifest["analyzer"]
        if analyzer is not None:
            analyzer.check_same(recorded["fingerprint"], what=f"the BM25 shard at {uri}")
        else:
            analyzer = Analyzer.from_settings(recorded["settings"])
            analyzer.check_same(recorded["fingerprint"], what=f"the BM25 shard at {uri}")

        def blob(name: str) -> bytes:
            path = posixpath.join(root, name)
            expected = manifest["files"].get(name)
            if expected is None:
                raise ShardFileError(f"BM25 shard manifest {manifest_path} does not list {name}")
            data = _read(fs, path)
            if len(data) != expected["bytes"] or hashlib.sha256(data).hexdigest() != expected["sha256"]:
                raise ShardFileError(
                    f"BM25 shard file {path} is damaged: {len(data)} bytes, checksum differs from the manifest's "
                    f"({expected['bytes']} bytes); rebuild the shard"
                )
            return data

        def array(name: str, dtype) -> np.ndarray:
            try:
                arr = np.load(io.BytesIO(blob(name)), allow_pickle=False)
            except ShardFileError:
                raise
            except Exception as e:  # a file written wrongly but with a matching checksum
                raise ShardFileError(f"BM25 shard file {posixpath.join(root, name)} cannot be read: {e}") from None
            if arr.dtype != dtype or arr.ndim != 1:
                raise ShardFileError(f"BM25 shard file {posixpath.join(root, name)} holds {arr.dtype}[{arr.ndim}d], expected {dtype}[1d]")
            return arr

        terms = pq.read_table(pa.BufferReader(blob("terms.parquet"))).column("term").to_pylist()
        docs = pq.read_table(pa.BufferReader(blob("docs.parquet")))
        indptr = array("indptr.npy", np.int64)
        doc_index = array("doc_index.npy", np.int32)
        data = array("weights.npy", np.float64)
        shard = manifest["shard"]
        n = docs.num_rows
        if (
            n != shard["num_docs"]
            or len(terms) != shard["num_terms"]
            or len(indptr) != len(terms) + 1
            or indptr[-1] != len(doc_index)
            or len(doc_index) != len(data)
            or (len(doc_index) and (doc_index.min() < 0 or doc_index.max() >= n))
        ):
            raise ShardFileError(f"BM25 shard at {uri}: its arrays do not fit together or with {manifest_path}")
        p = manifest["params"]
        return cls(
            analyzer=analyzer,
            params=BM25Params(p["k1"], p["b"], p["epsilon"]),
            stats=manifest["stats"],
            doc_start=shard["doc_start"],
            doc_ids=docs.column("doc_id").to_numpy(zero_copy_only=False).astype(object),
            doc_lengths=docs.column("length").to_numpy().astype(np.int32),
            terms=terms,
            weights=sp.csr_array((data, doc_index, indptr), shape=(len(terms), n)),
        )


def _parquet_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def _npy_bytes(arr: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, arr, allow_pickle=False)
    return out.getvalue()


def _read(fs: pafs.FileSystem, path: str) -> bytes:
    try:
        with fs.open_input_stream(path) as f:
            return f.readall()
    except FileNotFoundError:
        raise ShardFileError(f"BM25 shard file {path} is missing") from None
    except OSError as e:
        if fs.get_file_info(path).type == pafs.FileType.NotFound:
            raise ShardFileError(f"BM25 shard file {path} is missing") from None
        raise ShardFileError(f"BM25 shard file {path} cannot be read: {e}") from None


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
    if all(isinstance(q, str) for q in queries):
        return merge_topk([shard.search_text(list(queries), k) for shard in shards], k)
    return merge_topk([shard.search(queries, k) for shard in shards], k)
