"""Candidate assembly: a question -> the documents its evidence graph is built from (paper §3, A.1).

    retriever = Retriever.load(index_uri, tables_uri, RetrieveConfig())
    rows = retriever.candidates(["q1"], ["In which city was the founder of Arden Works born?"])

Three sources, each a row of the `candidates` table (`xh.schemas.CANDIDATES`):

    ir   BM25 top `ir_candidates` (paper: 100) over the sharded index; graphs keep the first `ir_keep` (2)
    el   CMNS entity links: the top `el_per_surface` (1) docs per linked surface form
    exp  documents linked to or from the kept ir and el docs, ranked by BM25 against the question,
         top `expansion_keep` (15)

`ranker` says what ordered each source: `bm25`, `commonness`, or `links` (expansion without a
scorer). A trained re-ranker would replace BM25's order for ir and exp; until one exists (see the
issue note in the README), BM25 and commonness order are used and the rows say so.

The index lives under one URI: `manifest.json` (analyzer, corpus stats, shards and their doc
ranges) and one folder per shard (`xh.retrieval.bm25`).
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass

import numpy as np

from xh.retrieval.bm25 import BM25Shard, search_shards
from xh.retrieval.entity_linking import EntityLinker
from xh.retrieval.expansion import LinkGraph
from xh.storage import S3Settings, join, open_input

INDEX_MANIFEST = "manifest.json"


@dataclass(frozen=True)
class RetrievalSettings:
    """The knobs of candidate assembly (`RetrieveConfig` carries them from YAML)."""

    ir_candidates: int = 100
    ir_keep: int = 2
    el_per_surface: int = 1
    el_max_ngram: int = 6
    el_min_commonness: float = 0.0
    expansion_keep: int = 15
    expansion_max_neighbours: int = 2000  # hub pages: only this many neighbours reach the scorer


def load_index(index_uri: str, s3: S3Settings | None = None) -> list[BM25Shard]:
    """All shards of an index, checked to be parts of one index (same analyzer and corpus stats)."""
    manifest_uri = join(index_uri, INDEX_MANIFEST)
    try:
        with open_input(manifest_uri, s3) as f:
            manifest = json.loads(f.read())
    except FileNotFoundError:
        raise FileNotFoundError(f"no BM25 index at {index_uri} (missing {INDEX_MANIFEST}): build it with `xh retrieve index`") from None
    shards = [BM25Shard.load(join(index_uri, shard["path"]), s3=s3) for shard in manifest["shards"]]
    for shard in shards:
        shard.analyzer.check_same(manifest["analyzer"]["fingerprint"], what=f"the index manifest of {index_uri}")
    return shards


class Retriever:
    """What one query actor holds, loaded once: the BM25 shards, the entity linker, the link graph."""

    def __init__(self, shards: list[BM25Shard], linker: EntityLinker, graph: LinkGraph, settings: RetrievalSettings):
        self.shards, self.linker, self.graph, self.settings = shards, linker, graph, settings
        self.linker.per_surface = settings.el_per_surface
        self.linker.max_ngram = settings.el_max_ngram
        self.linker.min_commonness = settings.el_min_commonness
        # doc id -> (shard, column), to score given documents for expansion
        self._where = {
            doc_id: (s, col) for s, shard in enumerate(shards) for col, doc_id in enumerate(shard.doc_ids.tolist())
        }

    @classmethod
    def load(cls, index_uri: str, tables_uri: str, settings: RetrievalSettings, s3: S3Settings | None = None):
        return cls(load_index(index_uri, s3), EntityLinker.load(tables_uri, s3=s3), LinkGraph.load(tables_uri, s3=s3), settings)

    def score_docs(self, terms: list[str], doc_ids: list[str]) -> np.ndarray:
        """BM25 scores of the given documents for one analyzed query (0 for documents not indexed)."""
        scores = np.zeros(len(doc_ids), dtype=np.float64)
        for s, shard in enumerate(self.shards):
            picks = [(i, self._where[d][1]) for i, d in enumerate(doc_ids) if self._where.get(d, (-1,))[0] == s]
            rows = [shard.term_rows[t] for t in terms if t in shard.term_rows]
            if not picks or not rows:
                continue
            at, cols = zip(*picks)
            # repeated query terms count again, as in rank-bm25's sum over query tokens
            sub = shard.weights[rows][:, list(cols)]
            scores[list(at)] = np.asarray(sub.sum(axis=0)).ravel()
        return scores

    def candidates(self, qids: list[str], questions: list[str]) -> list[dict]:
        """Candidate rows (ir, el, exp) for a batch of questions."""
        settings = self.settings
        analyzed = [self.shards[0].analyzer.analyze(q) for q in questions]
        ir_results = search_shards(self.shards, analyzed, k=settings.ir_candidates)
        links = self.linker.link_batch(questions)
        rows: list[dict] = []
        for qid, terms, ir, linked in zip(qids, analyzed, ir_results, links):
            for rank, (doc_id, score) in enumerate(zip(ir.doc_ids, ir.scores.tolist())):
                rows.append(_row(qid, doc_id, "ir", score, rank, "bm25"))
            linked = sorted(linked, key=lambda link: (-link.score, link.start))
            for rank, link in enumerate(linked):
                rows.append(_row(qid, link.doc_id, "el", link.score, rank, "commonness", link.surface))
            seeds = list(dict.fromkeys([*ir.doc_ids[: settings.ir_keep], *(link.doc_id for link in linked)]))
            if not seeds:
                continue
            expansion = self.graph.expand(
                seeds,
                question_scorer=(lambda ids, terms=terms: self.score_docs(terms, list(ids))) if terms else None,
                top_k=settings.expansion_keep,
                max_candidates=settings.expansion_max_neighbours,
            )
            ranker = "bm25" if expansion.ranking == "scorer" else "links"
            for doc in expansion.docs:
                rows.append(_row(qid, doc.doc_id, "exp", float(doc.score), doc.rank - 1, ranker))
        return rows


def _row(qid: str, doc_id: str, source: str, score: float, rank: int, ranker: str, surface: str | None = None) -> dict:
    return {"qid": qid, "doc_id": doc_id, "source": source, "score": float(score), "rank": rank, "ranker": ranker,
            "surface": surface}  # fmt: skip


def shard_path(k: int) -> str:
    return posixpath.join("shards", f"shard-{k:05d}")
