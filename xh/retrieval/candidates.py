"""Candidate assembly: a question -> the documents its evidence graph is built from (paper §3, A.1).

    retriever = Retriever.load(index, tables, RetrieveConfig())          # Locations (or URIs)
    rows = retriever.candidates(["q1"], ["In which city was the founder of Arden Works born?"])

Three sources, each a row of the `candidates` table (`xh.schemas.CANDIDATES`):

    ir   BM25 top `ir_candidates` (paper: 100) over the sharded index; graphs keep the first `ir_keep` (2)
    el   CMNS entity links: the top `el_per_surface` (1) docs per linked surface form
    exp  documents linked to or from the kept ir and el docs, top `expansion_keep` (15)

`ranker` says what ordered each row. Without a re-ranker: `bm25` (ir, and exp ranked by BM25 against
the question), `commonness` (el), `links` (exp of a question with no BM25 terms). With one
(`RetrieveConfig.reranker`, a folder written by `workflows.rerank`), every row says
`reranker` and its `score` is the cross-encoder's logit:

    ir   all `ir_candidates` BM25 documents re-ordered by the re-ranker (graphs keep its top `ir_keep`)
    el   per surface, the `el_rerank_candidates` docs of highest commonness, re-ordered; top
         `el_per_surface` kept
    exp  the neighbours' `expansion_rerank_pool` best by BM25, re-ordered; top `expansion_keep` kept

With a path re-ranker (`RetrieveConfig.path_reranker`, trained with `rerank.paths=true`), the ir
documents, in the order above, get the best-scoring pair of their first `path_top` moved to the
front (`xh.retrieval.rerank.best_path_first`), so that the `ir_keep` = 2 documents a graph keeps are
the pair that reads best together (a bridge question's second paragraph often shares no word with
the question); those ir rows say `paths`.

With a path scorer (`RetrieveConfig.path_scorer`, `xh.retrieval.paths`, trained by `xh retrieve
paths`), the pair is chosen from the first `path_top` ir documents and the documents linked to or
from them, on BM25, link and entity-link features: the pair goes first among the ir rows (its second
document may come from the links, so the ir rows are then one more than `ir_candidates`), both with
the pair's score, and says `paths`; expansion neighbours are then ranked by the path scorer too, as
the second document of a pair with either document of the chosen pair (`path_expansion`; their rows
say `paths`). It needs no text, and is the better of the two (docs/results/retrieval.md).

The knobs are the `retrieve` section of the config (`xh.config.RetrieveConfig`, defaults as in the
paper); `Retriever.load` maps the index, linker and link graph from the node's one copy
(`xh.retrieval.shared`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from xh import schemas
from xh.config import ConfigError, RetrieveConfig
from xh.retrieval.bm25 import BM25Shard, search_shards
from xh.retrieval.entity_linking import EntityLinker
from xh.retrieval.expansion import LinkGraph
from xh.retrieval.paths import (
    PathCandidates,
    PathScorer,
    QuestionPaths,
    link_directions,
    pair_features,
    path_candidates_batch,
)
from xh.retrieval.shared import node_state, string_keys
from xh.storage.store import Location, located

# Neighbours of one document the path scorer considers: a hub page has 100,000s of in-links.
PATH_LINK_POOL = 200
# Terms x documents that one slice of a shard crosses in `Retriever.term_weights_batch` (at most as many
# weights come back, most of them another query's, dropped).
BATCH_WEIGHT_CELLS = 1 << 21


class Passages:
    """The paragraph text of every doc, for the re-ranker: doc id -> "Title. paragraph"."""

    def __init__(self, docs: pa.Table):
        self._row = {doc_id: i for i, doc_id in enumerate(docs["doc_id"].to_pylist())}
        self._titles, self._texts = docs["title"], docs["text"]

    @classmethod
    def load(cls, tables: Location | str) -> Passages:
        fs, root = located(tables).fs_path()
        columns = ["doc_id", "title", "text"]
        return cls(pq.read_table(f"{root}/docs", filesystem=fs, schema=schemas.DOCS, columns=columns))

    def __call__(self, doc_ids: list[str]) -> list[str]:
        from xh.retrieval.rerank import passage_text

        rows = [self._row[d] for d in doc_ids]
        return [passage_text(self._titles[r].as_py(), self._texts[r].as_py()) for r in rows]


class DocPositions:
    """Doc id -> (shard, column) over all shards, in 16 bytes a document (a dict of them took an order of
    magnitude more: a query actor at millions of documents held more in it than in the BM25 weights).
    Ids are found by a 64-bit key (sorted, binary search; the same in every process, so a node computes
    the arrays once and its processes map them, `xh.retrieval.shared`) and checked against the shard's
    own id, so two ids sharing a key cost a comparison more, never a wrong document."""

    def __init__(self, shards: Sequence[BM25Shard], arrays: dict[str, np.ndarray] | None = None):
        self.shards = shards
        if arrays is None:
            ids = [_all_ids(s) for s in shards]
            keys = np.concatenate([string_keys(i) for i in ids] or [np.zeros(0, np.uint64)])
            where = np.concatenate([np.full(len(i), k, np.int32) for k, i in enumerate(ids)] or [[]])
            cols = np.concatenate([np.arange(len(i), dtype=np.int32) for i in ids] or [[]])
            order = np.argsort(keys, kind="stable")
            arrays = {"keys": keys[order], "where": where[order].astype(np.int32), "cols": cols[order].astype(np.int32)}
        self.keys, self.where, self.cols = arrays["keys"], arrays["where"], arrays["cols"]

    def find(self, doc_ids: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(shard, column) per id; shard -1 for an id in no shard."""
        where, cols = np.full(len(doc_ids), -1, np.int32), np.zeros(len(doc_ids), np.int32)
        if not len(doc_ids) or not len(self.keys):
            return where, cols
        keys = string_keys(doc_ids)
        starts = np.searchsorted(self.keys, keys).tolist()
        for i, (doc_id, k) in enumerate(zip(doc_ids, starts)):
            key = keys[i]
            while k < len(self.keys) and self.keys[k] == key:
                shard, col = int(self.where[k]), int(self.cols[k])
                if _id_at(self.shards[shard], col) == doc_id:
                    where[i], cols[i] = shard, col
                    break
                k += 1
        return where, cols


def _all_ids(shard) -> list[str]:
    ids = shard.doc_ids
    return ids.to_pylist() if isinstance(ids, pa.Array) else ids.tolist()


def _id_at(shard, col: int) -> str:
    found = shard.doc_ids[col]
    return found.as_py() if isinstance(found, pa.Scalar) else found


def stored_weights(shard: BM25Shard, rows: np.ndarray, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The weight stored at each (term row, shard column) pair, and whether one is: found by binary search in
    the row's postings (documents ascending), so no posting list is copied (a frequent term's list holds
    a fair share of the shard's documents: slicing whole rows made working memory grow with N)."""
    values, found = np.zeros(len(rows), np.float64), np.zeros(len(rows), bool)
    indptr, indices, data = shard.weights.indptr, shard.weights.indices, shard.weights.data
    order = np.argsort(rows, kind="stable")
    distinct, starts = np.unique(rows[order], return_index=True)
    bounds = np.append(starts, len(order))
    for row, a, b in zip(distinct.tolist(), bounds[:-1].tolist(), bounds[1:].tolist()):
        lo, hi = int(indptr[row]), int(indptr[row + 1])
        at = order[a:b]
        where = np.searchsorted(indices[lo:hi], cols[at])
        hit = where < hi - lo
        hit[hit] = indices[lo:hi][where[hit]] == cols[at][hit]
        values[at[hit]] = data[lo + where[hit]]
        found[at[hit]] = True
    return values, found


def shard_term_entries(shard: BM25Shard, terms: list[list[str]], cols: np.ndarray, doc_query: np.ndarray) -> tuple:
    """The weights of each query's terms in its own documents of one shard, as arrays (query, the term's index
    in the query, the document's index in `cols`, weight): `cols` are shard columns, `doc_query` the query
    each belongs to (non-decreasing). Only stored weights come back (a term absent from a document has none)."""
    rows_of = shard.term_rows
    known = [(q, i, rows_of[t]) for q, query in enumerate(terms) for i, t in enumerate(query) if t in rows_of]
    if not len(cols) or not known:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty, np.zeros(0, np.float64)
    term_query, term_index, rows = (np.array(column, np.int64) for column in zip(*known))
    # each term with each document of its own query: (term, document position) pairs
    first = np.searchsorted(doc_query, term_query, side="left")
    counts = np.searchsorted(doc_query, term_query, side="right") - first
    term_of = np.repeat(np.arange(len(rows)), counts)
    position = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts) + np.repeat(first, counts)
    values, found = stored_weights(shard, rows[term_of], np.asarray(cols, np.int64)[position])
    term_of = term_of[found]
    return term_query[term_of], term_index[term_of], position[found].astype(np.int64), values[found]


class Retriever:
    """What one query actor holds, loaded once: the BM25 shards, the entity linker, the link graph,
    and, when `settings.reranker` names one, the re-ranker with the docs' texts."""

    def __init__(
        self,
        shards: list[BM25Shard],
        linker: EntityLinker,
        graph: LinkGraph,
        settings: RetrieveConfig,
        reranker=None,
        passages: Passages | None = None,
        path_reranker=None,
        path_scorer=None,
        positions: DocPositions | None = None,
        searcher=None,
    ):
        if path_reranker is not None and path_scorer is not None:
            raise ConfigError("retrieve.path_reranker and retrieve.path_scorer are alternatives: set one")
        if (reranker is None and path_reranker is None) != (passages is None):
            raise ValueError("a re-ranker needs the docs' passages, and passages need a re-ranker")
        self.shards, self.linker, self.graph, self.settings = shards, linker, graph, settings
        self.reranker, self.passages, self.path_reranker = reranker, passages, path_reranker
        self.path_scorer = path_scorer
        self.linker.per_surface = settings.el_rerank_candidates if reranker is not None else settings.el_per_surface
        self.linker.max_ngram = settings.el_max_ngram
        self.linker.min_commonness = settings.el_min_commonness
        # BM25 on the shards' own actors (`xh.retrieval.fanout.FanoutShards`): `shards` then give the analyzer
        # and their count only, the actors score them and look their weights up
        self.searcher = searcher
        # doc id -> (shard, column), to score given documents for expansion
        self._where = positions if positions is not None else DocPositions(shards)

    @classmethod
    def load(
        cls,
        index: Location | str,
        tables: Location | str,
        settings: RetrieveConfig,
        cache_dir: str | None = None,
        searcher=None,
    ):
        """The retriever of an index and its tables. The shards, linker, link graph and doc lookup are mapped
        from the node's layout (`xh.retrieval.shared`, built by the first process that needs it, in
        `cache_dir` or the node's default): every process of a node shares one copy. With a `searcher`
        (`xh.retrieval.fanout.FanoutShards`), BM25 runs on the shard actors instead."""
        index, tables = located(index), located(tables)
        store = index.store  # the rankers a setting names are reached as the index is
        reranker = path_reranker = None
        if settings.reranker or settings.path_reranker:  # imported only then: it brings torch into the process
            from xh.retrieval.rerank import CrossEncoder

            reranker = CrossEncoder.load(store.at(settings.reranker)) if settings.reranker else None
            path_reranker = CrossEncoder.load(store.at(settings.path_reranker)) if settings.path_reranker else None
        passages = Passages.load(tables) if reranker or path_reranker else None
        state = node_state(index, tables, cache_dir)
        return cls(
            state.shards,
            state.linker,
            state.graph,
            settings,
            reranker,
            passages,
            path_reranker,
            PathScorer.load(store.at(settings.path_scorer)) if settings.path_scorer else None,
            positions=DocPositions(state.shards, state.positions),
            searcher=searcher,
        )

    @property
    def ranker(self) -> str:
        """What orders the candidates: "reranker" or "bm25 / commonness"."""
        return "reranker" if self.reranker is not None else "bm25 / commonness"

    def score_docs(self, terms: list[str], doc_ids: list[str]) -> np.ndarray:
        """BM25 scores of the given documents for one analyzed query (0 for documents not indexed)."""
        # repeated query terms count again, as in rank-bm25's sum over query tokens
        return self.term_weights(terms, doc_ids).sum(axis=0)

    def term_weights(self, terms: list[str], doc_ids: list[str]) -> np.ndarray:
        """(terms, docs): each query term's BM25 weight in each document, 0 where absent or not indexed."""
        if self.searcher is not None:
            return self._term_weights_block([terms], [doc_ids])[0]
        weights = np.zeros((len(terms), len(doc_ids)), dtype=np.float64)
        where, cols = self._where.find(doc_ids)
        for s, shard in enumerate(self.shards):
            at = np.flatnonzero(where == s)
            known = [(i, shard.term_rows[t]) for i, t in enumerate(terms) if t in shard.term_rows]
            if not len(at) or not known:
                continue
            term_at, rows = (np.array(column, np.int64) for column in zip(*known))
            values, _ = stored_weights(shard, np.repeat(rows, len(at)), np.tile(cols[at].astype(np.int64), len(rows)))
            weights[np.ix_(term_at, at)] = values.reshape(len(rows), len(at))
        return weights

    def term_weights_batch(self, terms: list[list[str]], doc_ids: list[list[str]]) -> list[np.ndarray]:
        """`term_weights` of many queries, each with its own documents: one lookup of the documents and one
        slice of each shard for a block of queries, instead of one per query. A block's slice crosses all
        its terms with all its documents, so blocks are cut at `BATCH_WEIGHT_CELLS` of those."""
        out, start, cells = [], 0, (0, 0)
        for end, (t, d) in enumerate(zip(terms, doc_ids)):
            grown = (cells[0] + len(t), cells[1] + len(d))
            if end > start and grown[0] * grown[1] > BATCH_WEIGHT_CELLS:
                out += self._term_weights_block(terms[start:end], doc_ids[start:end])
                start, grown = end, (len(t), len(d))
            cells = grown
        return out + self._term_weights_block(terms[start:], doc_ids[start:])

    def _term_weights_block(self, terms: list[list[str]], doc_ids: list[list[str]]) -> list[np.ndarray]:
        sizes = [(len(t), len(d)) for t, d in zip(terms, doc_ids)]
        starts = np.cumsum([0, *(t * d for t, d in sizes)])
        flat = np.zeros(int(starts[-1]), dtype=np.float64)
        widths = np.array([d for _, d in sizes], np.int64)
        where, cols = self._where.find([d for ids in doc_ids for d in ids])
        doc_query = np.repeat(np.arange(len(sizes)), widths)
        doc_col = np.arange(len(where)) - np.repeat(np.cumsum(widths) - widths, widths)
        ats = [np.flatnonzero(where == s) for s in range(len(self.shards))]
        requests = [(s, cols[at], doc_query[at]) for s, at in enumerate(ats) if len(at)]
        if self.searcher is not None:  # the shards' own actors look their weights up
            found = self.searcher.term_entries(terms, requests)
        else:
            found = [shard_term_entries(self.shards[s], terms, c, dq) for s, c, dq in requests]
        for (s, _, _), (q, i, c, values) in zip(requests, found):
            flat[starts[q] + i * widths[q] + doc_col[ats[s]][c]] = values
        return [flat[starts[q] : starts[q + 1]].reshape(t, d) for q, (t, d) in enumerate(sizes)]

    def path_candidates(self, terms: list[str], ir_ids: list[str], named: set[str]) -> PathCandidates:
        """The pairs the path scorer chooses among for one question (`xh.retrieval.paths.path_candidates`)."""
        return self._question_paths([terms], [ir_ids], [named])[0].candidates

    def _question_paths(self, analyzed: list[list[str]], ir_lists: list[list[str]], named: list[set[str]]):
        """A batch's path candidates, computed together (`xh.retrieval.paths.path_candidates_batch`)."""
        return path_candidates_batch(
            ir_lists,
            lambda docs: self.term_weights_batch(analyzed, docs),
            lambda ids: link_directions(self.graph, ids, PATH_LINK_POOL),
            named,
            top=self.settings.path_top,
            neighbours=self.settings.path_neighbours,
            pool=PATH_LINK_POOL,
        )

    def rerank_scores(self, question: str, doc_ids: list[str]) -> np.ndarray:
        """The re-ranker's logits of the docs for the question."""
        if not doc_ids:
            return np.zeros(0, dtype=np.float64)
        return self.reranker.score(question, self.passages(doc_ids), batch_size=self.settings.rerank_batch_size)

    def _search(self, questions: list[str]) -> tuple[list[list[str]], list, list[list]]:
        """Per question: its analyzed terms, its BM25 top `ir_candidates`, its entity links."""
        analyzed = [self.shards[0].analyzer.analyze(q) for q in questions]
        return (
            analyzed,
            self.searcher.search(analyzed, k=self.settings.ir_candidates)
            if self.searcher is not None
            else search_shards(self.shards, analyzed, k=self.settings.ir_candidates),
            self.linker.link_batch(questions),
        )

    def question_paths(self, questions: list[str]) -> list[PathCandidates]:
        """Each question's path candidates as `candidates` scores them: training data for a path scorer."""
        analyzed, ir_results, links = self._search(questions)
        named = [{link.doc_id for link in linked} for linked in links]
        return [
            found.candidates for found in self._question_paths(analyzed, [list(ir.doc_ids) for ir in ir_results], named)
        ]

    def candidates(self, qids: list[str], questions: list[str]) -> list[dict]:
        """Candidate rows (ir, el, exp) for a batch of questions."""
        analyzed, ir_results, links = self._search(questions)
        ir_lists = [list(ir.doc_ids) for ir in ir_results]
        paths = [None] * len(qids)
        if self.path_scorer is not None and self.path_reranker is None:  # the batch's pairs, all at once
            paths = self._question_paths(analyzed, ir_lists, [{link.doc_id for link in linked} for linked in links])
        rows: list[dict] = []
        for qid, question, terms, ir_ids, ir, linked, found in zip(
            qids, questions, analyzed, ir_lists, ir_results, links, paths
        ):
            rows += self._question_rows(qid, question, terms, ir_ids, ir.scores.tolist(), linked, found)
        return rows

    def _question_rows(
        self, qid, question, terms, ir_ids, ir_scores, linked, paths: QuestionPaths | None
    ) -> list[dict]:
        settings, rerank = self.settings, self.reranker is not None
        # the path scorer reads BM25's order and every entity link, as it was trained on
        bm25_ids, named, pair = ir_ids, {link.doc_id for link in linked}, None
        if rerank:
            # one pass of the cross-encoder over both sources' documents
            scores = self.rerank_scores(question, [*ir_ids, *(link.doc_id for link in linked)])
            ir_scores, el_scores = scores[: len(ir_ids)].tolist(), scores[len(ir_ids) :].tolist()
            order = sorted(range(len(ir_ids)), key=lambda i: -ir_scores[i])  # stable: BM25 order breaks ties
            ir_ids, ir_scores = [ir_ids[i] for i in order], [ir_scores[i] for i in order]
            linked = _best_per_surface(linked, el_scores, settings.el_per_surface)
        else:
            linked = sorted(linked, key=lambda link: (-link.score, link.start))
        ir_ranker, el_ranker = ("reranker", "reranker") if rerank else ("bm25", "commonness")
        if self.path_reranker is not None and len(ir_ids) > 1:
            from xh.retrieval.rerank import best_path_first

            order = best_path_first(
                self.path_reranker,
                question,
                self.passages(ir_ids[: settings.path_top]),
                settings.path_top,
                settings.rerank_batch_size,
            )
            order += range(len(order), len(ir_ids))  # the ones past path_top, as they were
            ir_ids, ir_scores, ir_ranker = [ir_ids[i] for i in order], [ir_scores[i] for i in order], "paths"
        elif self.path_scorer is not None:
            candidates = paths.candidates
            if candidates.pairs:
                scores = self.path_scorer.score(candidates.features)
                best = int(np.argmax(scores))
                pair = candidates.pairs[best]  # also what expansion neighbours are paired with
                rest = [(d, s) for d, s in zip(ir_ids, ir_scores) if d not in pair]
                ir_ids = [*pair, *(d for d, _ in rest)]
                ir_scores = [float(scores[best])] * 2 + [s for _, s in rest]
                ir_ranker = "paths"
        rows = [_row(qid, d, "ir", score, rank, ir_ranker) for rank, (d, score) in enumerate(zip(ir_ids, ir_scores))]
        rows += [
            _row(qid, link.doc_id, "el", link.score, rank, el_ranker, link.surface) for rank, link in enumerate(linked)
        ]
        seeds = list(dict.fromkeys([*ir_ids[: settings.ir_keep], *(link.doc_id for link in linked)]))
        if not seeds:
            return rows
        scorer, exp_ranker = None, "links"
        if terms and pair is not None and settings.path_expansion:
            scorer, exp_ranker = (
                (lambda ids: self._path_neighbours(terms, bm25_ids, named, pair, list(ids), paths)),
                "paths",
            )
        elif terms and rerank:
            scorer, exp_ranker = (lambda ids: self._rerank_neighbours(question, terms, list(ids))), "reranker"
        elif terms:
            scorer, exp_ranker = (lambda ids: self.score_docs(terms, list(ids))), "bm25"
        expansion = self.graph.expand(
            seeds,
            question_scorer=scorer,
            top_k=settings.expansion_keep,
            max_candidates=settings.expansion_max_neighbours,
        )
        if expansion.ranking != "scorer":
            exp_ranker = "links"
        rows += [_row(qid, doc.doc_id, "exp", float(doc.score), doc.rank - 1, exp_ranker) for doc in expansion.docs]
        return rows

    def _path_neighbours(
        self,
        terms: list[str],
        bm25_ids: list[str],
        named: set[str],
        pair: tuple[str, str],
        doc_ids: list[str],
        paths: QuestionPaths,
    ) -> np.ndarray:
        """Expansion neighbours scored by the path scorer as the second document of a pair with either
        document of the chosen pair, the better of the two. The links and weights the pairs were chosen
        with are read again, not looked up again."""
        settings, limit = self.settings, self.settings.expansion_max_neighbours
        links = {}
        for a in pair:
            known = paths.neighbours(a, limit)
            links[a] = known if known is not None else self.graph.directions(a, limit)
        pairs = [(a, n) for n in doc_ids for a in pair]
        docs = list(dict.fromkeys([*bm25_ids[:1], *pair, *doc_ids]))
        weights = paths.weights_of(docs, lambda ids: self.term_weights(terms, ids))
        features = pair_features(pairs, bm25_ids, settings.path_top, weights, docs, links, named)
        return self.path_scorer.score(features).reshape(len(doc_ids), len(pair)).max(axis=1)

    def _rerank_neighbours(self, question: str, terms: list[str], doc_ids: list[str]) -> np.ndarray:
        """Re-ranker logits for BM25's best `expansion_rerank_pool` neighbours, -inf for the others."""
        pool = max(self.settings.expansion_rerank_pool, self.settings.expansion_keep)
        bm25 = self.score_docs(terms, doc_ids)
        best = np.argsort(-bm25, kind="stable")[:pool]  # stable: the expansion's fallback order breaks ties
        scores = np.full(len(doc_ids), -np.inf)
        scores[best] = self.rerank_scores(question, [doc_ids[i] for i in best])
        return scores


def _best_per_surface(linked: list, scores: list[float], keep: int) -> list:
    """Entity links re-scored by the re-ranker: the best `keep` per surface (by position), best first overall."""
    by_surface: dict[tuple[int, int], list] = {}
    for link, score in zip(linked, scores):
        by_surface.setdefault((link.start, link.end), []).append(link._replace(score=float(score)))
    kept = [
        link for group in by_surface.values() for link in sorted(group, key=lambda candidate: -candidate.score)[:keep]
    ]
    return sorted(kept, key=lambda link: (-link.score, link.start))


def _row(qid: str, doc_id: str, source: str, score: float, rank: int, ranker: str, surface: str | None = None) -> dict:
    return {
        "qid": qid,
        "doc_id": doc_id,
        "source": source,
        "score": float(score),
        "rank": rank,
        "ranker": ranker,
        "surface": surface,
    }
