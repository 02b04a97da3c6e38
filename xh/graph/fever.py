"""FEVER evidence graphs: a claim -> its top 5 evidence sentences, fully connected (paper §4, FEVER).

    from xh.inputs.claims import read_fever_claims
    from xh.graph.fever import FeverGraphBuilder, FeverGraphSettings

    claims, bad = read_fever_claims("world/fever/claims.jsonl")
    builder = FeverGraphBuilder.load("runs/demo/tables", FeverGraphSettings(gold_evidence=True))
    graphs, quarantined = builder.build(claims)           # rows of xh.schemas.GRAPHS and QUARANTINE

or for one batch without keeping the builder: `build_fever_graphs(claims, docs_table, settings)`.
A Ray Data actor builds a `FeverGraphBuilder` once (it holds the page index) and calls `build` per batch.

How a claim's nodes are chosen:

1. Candidate pages: BM25 over the docs' "title. text" (top `bm25_pages`), then the pages whose title,
   or title without its "(disambiguator)", is written in the claim (`title_pages_per_surface` per
   surface form, longest match wins: `xh.retrieval.entity_linking.EntityLinker` over titles only).
2. Their non-empty sentences are ranked by BM25 of the claim against "title sentence", with the
   statistics of that pool of sentences (as FEVER's baseline fits TF-IDF on the retrieved pages);
   ties keep page order, then line order. With a `reranker` (`xh.retrieval.sentences`), BM25's best
   `rerank_pool` are re-ordered by the cross-encoder. The top `max_nodes` (5) are the retrieved sentences.
3. Training graphs (`gold_evidence=True`): the gold sentences come first (the first evidence group
   whose sentences are all in the corpus, then the other groups' sentences that are), retrieved
   ones fill up to `max_nodes`. A SUPPORTS / REFUTES claim with no complete group in the corpus is
   quarantined with the reason; NOT ENOUGH INFO claims have no gold and get retrieved sentences.
   Without `gold_evidence` every graph is retrieved sentences only, labelled where gold is known.

What a graph row holds (`xh.schemas.GRAPHS`, task "fever", edge_mode "full"):

    question      the claim
    claim_label   SUPPORTS / REFUTES / NOT ENOUGH INFO, null for new claims
    supporting_facts  the gold sentences of every group, flattened, as (title, line); null when unknown
    evidence      the claim's gold groups as in CLAIMS (page ids), what the FEVER score needs; null when unknown
    nodes[i]      doc_id = FEVER page id, title, sentences = [the sentence], anchors = [title],
                  line = the sentence's line in its page, source = "evidence" (put there as gold) or
                  "retrieved", score = its BM25 score in the pool (null for gold not in the pool),
                  is_evidence = in some gold group (false for NOT ENOUGH INFO, null when unknown),
                  supporting_sentences = [0] / [] likewise
    edges         every ordered pair (src, dst), src != dst

so `xh.graph.encode` reads it as any graph: node text `[CLS] claim [SEP] title [SEP] sentence [SEP]`.
Records in = graphs + quarantined: a claim with no sentence to offer (no term in the corpus and no
title in the claim) is quarantined too, and evaluation must count it as a miss.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from xh import schemas
from xh.inputs.claims import REFUTES, SUPPORTS
from xh.retrieval.analyzer import Analyzer
from xh.retrieval.bm25 import BM25Shard, CorpusStats, search_shards
from xh.retrieval.entity_linking import EntityLinker
from xh.storage.store import Location, located
from xh.wiki.titles import normalize_title

__all__ = [
    "FeverGraphSettings",
    "EvidenceSentence",
    "FeverGraphBuilder",
    "build_fever_graph",
    "build_fever_graphs",
    "holds_gold_group",
    "evidence_recall",
    "sentence_training_examples",
]

QUARANTINE_SOURCE = "graphs/fever"


@dataclass(frozen=True)
class FeverGraphSettings:
    max_nodes: int = 5  # evidence sentences per graph (paper: 5, FEVER's scorer reads at most 5)
    bm25_pages: int = 5  # pages BM25 retrieves per claim
    title_pages_per_surface: int = 3  # pages kept per title written in the claim ("Paris", "Paris (film)", ...)
    gold_evidence: bool = False  # training graphs: gold sentences first; verifiable claims without gold quarantined
    index_titles: bool = True  # BM25 over "title. text" (as the retrieve stage's index)
    reranker: str | None = None  # a cross-encoder folder (xh.retrieval.sentences): re-orders BM25's best sentences
    rerank_pool: int = 20  # BM25's best sentences the re-ranker re-orders

    def __post_init__(self) -> None:
        if self.max_nodes < 1 or self.bm25_pages < 0 or self.title_pages_per_surface < 0:
            raise ValueError(f"FeverGraphSettings: max_nodes >= 1 and page counts >= 0 required, got {self}")


class EvidenceSentence(NamedTuple):
    """One candidate node: sentence `line` of page `doc_id`."""

    doc_id: str
    title: str
    line: int
    sentence: str
    source: str  # "evidence" (gold, put there for training) or "retrieved"
    score: float | None  # BM25 score in the claim's sentence pool; None for gold sentences outside the pool


def build_fever_graph(claim: dict, sentences: Sequence[EvidenceSentence], gold: set[tuple[str, int]] | None) -> dict:
    """One GRAPHS row from a CLAIMS row and its chosen sentences, in node order.

    `gold` is the set of (doc_id, line) of every gold evidence sentence (empty for NOT ENOUGH INFO),
    or None when the claim's evidence is unknown; it labels `is_evidence`.
    """
    if not sentences:
        raise ValueError(f"claim {claim['qid']}: a graph needs at least one sentence")
    nodes = []
    for s in sentences:
        is_evidence = None if gold is None else (s.doc_id, s.line) in gold
        nodes.append(
            {
                "doc_id": s.doc_id,
                "title": s.title,
                "sentences": [s.sentence.strip()],  # the docs table keeps HotpotQA's leading space
                "anchors": [s.title],
                "source": s.source,
                "score": s.score,
                "line": s.line,
                "answer_spans": None,
                "supporting_sentences": None if is_evidence is None else ([0] if is_evidence else []),
                "is_evidence": is_evidence,
            }
        )
    n = len(nodes)
    return {
        "qid": claim["qid"],
        "task": "fever",
        "question": claim["claim"],
        "question_type": None,
        "question_type_source": None,
        "answer": None,
        "answer_type": None,
        "claim_label": claim.get("label"),
        "supporting_facts": _supporting_facts(claim.get("evidence")),
        "nodes": nodes,
        "edges": [{"src": i, "dst": j} for j in range(n) for i in range(n) if i != j],
        "edge_mode": "full",
        "evidence": claim.get("evidence"),
    }


def _supporting_facts(evidence: list | None) -> list[dict] | None:
    if evidence is None:
        return None
    flat = {(normalize_title(s["page"]), s["line"]): None for group in evidence for s in group}
    return [{"title": title, "sent": line} for title, line in flat]


class FeverGraphBuilder:
    """What one graph-building actor holds: the pages (titles, sentences), their BM25 index, a title matcher."""

    def __init__(self, docs: pa.Table, settings: FeverGraphSettings):
        """`docs`: a DOCS table (doc_id, title, sentences at least); its pages are indexed here."""
        self.settings = settings
        self.doc_ids: list[str] = docs["doc_id"].to_pylist()
        self.titles: list[str] = docs["title"].to_pylist()
        self.sentences: list[list[str]] = docs["sentences"].to_pylist()
        self._row = {doc_id: i for i, doc_id in enumerate(self.doc_ids)}
        # Evidence names pages by FEVER id; a docs table from another dump format is met through the title.
        self._row_of_title: dict[str, int] = {}
        for i, title in enumerate(self.titles):
            self._row_of_title.setdefault(title, i)
        self.analyzer = Analyzer()
        self.page_index = [self._build_page_index()]
        empty_anchors = schemas.ANCHORS.empty_table()
        self.title_linker = EntityLinker.from_tables(
            empty_anchors, docs.select(["doc_id", "title"]), per_surface=max(settings.title_pages_per_surface, 1)
        )
        self.reranker = None
        if settings.reranker:
            from xh.retrieval.rerank import CrossEncoder

            self.reranker = CrossEncoder.load(settings.reranker).eval()

    @classmethod
    def load(cls, tables: str | Location, settings: FeverGraphSettings) -> FeverGraphBuilder:
        """Read `<tables>/docs` (local or s3://) and index it."""
        fs, root = located(tables).join("docs").fs_path()
        try:
            docs = pq.read_table(root, filesystem=fs, schema=schemas.DOCS, columns=["doc_id", "title", "sentences"])
        except FileNotFoundError:
            raise FileNotFoundError(
                f"no docs table under {tables}: run `xh wiki process --format fever` first"
            ) from None
        if not docs.num_rows:
            raise FileNotFoundError(f"the docs table under {tables} is empty")
        return cls(docs, settings)

    def _build_page_index(self) -> BM25Shard:
        texts = ["".join(s) for s in self.sentences]
        if self.settings.index_titles:
            texts = [f"{t}. {x}" for t, x in zip(self.titles, texts)]
        tokens = self.analyzer.analyze_batch(texts)
        return BM25Shard.build(self.doc_ids, tokens, CorpusStats.from_token_lists(tokens), analyzer=self.analyzer)

    # --- one batch ---------------------------------------------------------------------------

    def build(self, claims: Sequence[dict], positions: Sequence[int] | None = None) -> tuple[list[dict], list[dict]]:
        """CLAIMS rows -> (GRAPHS rows, QUARANTINE rows); every claim lands in exactly one.

        A quarantine row's position is `positions[k]` for claim k (default: k); its raw is the claim row.
        """
        positions = range(len(claims)) if positions is None else positions
        graphs, quarantined = [], []
        candidates = self.candidate_pages([c["claim"] for c in claims])
        for claim, position, (pages, why_none) in zip(claims, positions, candidates, strict=True):
            try:
                gold_rows, gold = self._gold(claim)
                retrieved = self.rank_sentences(claim["claim"], pages)
                chosen = self._choose(gold_rows, retrieved)
                if not chosen:
                    raise _Unusable(f"no evidence sentences: {why_none or 'the candidate pages have no text'}")
                graphs.append(build_fever_graph(claim, chosen, gold))
            except _Unusable as e:
                raw = json.dumps(claim, ensure_ascii=False)[: schemas.RAW_LIMIT]
                quarantined.append({"source": QUARANTINE_SOURCE, "position": position, "reason": str(e), "raw": raw})
        return graphs, quarantined

    def candidate_pages(self, claims: Sequence[str]) -> list[tuple[list[int], str | None]]:
        """Per claim: candidate page rows (BM25 first, then title matches; no repeats), and when
        there are none, why (the BM25 search's reason)."""
        settings = self.settings
        bm25 = (
            search_shards(self.page_index, list(claims), k=settings.bm25_pages)
            if settings.bm25_pages
            else [None] * len(claims)
        )
        linked = self.title_linker.link_batch(claims) if settings.title_pages_per_surface else [[]] * len(claims)
        out = []
        for hits, links in zip(bm25, linked):
            ids = [*(hits.doc_ids if hits is not None else []), *(link.doc_id for link in links)]
            rows = list(dict.fromkeys(self._row[d] for d in ids if d in self._row))
            why = None if rows else (hits.reason if hits is not None and hits.reason else "no page matches the claim")
            out.append((rows, why))
        return out

    def rank_sentences(self, claim: str, pages: Sequence[int]) -> list[EvidenceSentence]:
        """The non-empty sentences of `pages`, best first by BM25 of the claim against "title sentence",
        with the statistics of this pool; ties in page order, then line order."""
        pool = [(p, line) for p in pages for line, s in enumerate(self.sentences[p]) if s.strip()]
        if not pool:
            return []
        terms = self.analyzer.analyze(claim)
        tokens = self.analyzer.analyze_batch(f"{self.titles[p]} {self.sentences[p][line]}" for p, line in pool)
        scores = np.zeros(len(pool))
        if terms and any(tokens):
            shard = BM25Shard.build(
                [str(i) for i in range(len(pool))], tokens, CorpusStats.from_token_lists(tokens), analyzer=self.analyzer
            )
            scores = shard.score_all([terms])[0]
        ranked = []
        for i in np.argsort(-scores, kind="stable").tolist():
            p, line = pool[i]
            sentence = self.sentences[p][line]
            ranked.append(
                EvidenceSentence(self.doc_ids[p], self.titles[p], line, sentence, "retrieved", float(scores[i]))
            )
        if self.reranker is not None:
            from xh.retrieval.sentences import rerank_sentences

            ranked = rerank_sentences(self.reranker, claim, ranked, self.settings.rerank_pool)
        return ranked

    def _gold(self, claim: dict) -> tuple[list[tuple[int, int]], set[tuple[str, int]] | None]:
        """(the gold sentences to put first, as (page row, line); the set of every gold (doc_id, line)).

        Gold sentences are put first only with `gold_evidence`; then a verifiable claim whose
        groups all miss a sentence from the corpus raises `_Unusable` with the first problem.
        """
        evidence = claim.get("evidence")
        if evidence is None:
            return [], None
        located = [[self._locate(s["page"], s["line"]) for s in group] for group in evidence]
        problems = [where for group in located for where in group if isinstance(where, str)]
        found = [[where for where in group if not isinstance(where, str)] for group in located]
        gold = {(self.doc_ids[p], line) for group in found for p, line in group}
        if not self.settings.gold_evidence:
            return [], gold
        complete = [group for group, asked in zip(found, located) if len(group) == len(asked)]
        if claim.get("label") in (SUPPORTS, REFUTES) and not complete:
            raise _Unusable(f"gold evidence missing from the corpus: {problems[0]}")
        ordered = (complete[0] if complete else []) + [where for group in found for where in group]
        return list(dict.fromkeys(ordered)), gold

    def _locate(self, page: str, line: int) -> tuple[int, int] | str:
        """(page row, line) of a gold sentence, or why it is not in the corpus."""
        row = self._row.get(page)
        if row is None:
            row = self._row_of_title.get(normalize_title(page))
        if row is None:
            return f"page {page!r} is not in the docs table"
        sentences = self.sentences[row]
        if line >= len(sentences) or not sentences[line].strip():
            return f"line {line} of {page!r} is not in the page ({len(sentences)} lines)"
        return row, line

    def _choose(self, gold_rows: list[tuple[int, int]], retrieved: list[EvidenceSentence]) -> list[EvidenceSentence]:
        limit = self.settings.max_nodes
        score_of = {(s.doc_id, s.line): s.score for s in retrieved}
        chosen = []
        for p, line in gold_rows[:limit]:
            doc_id = self.doc_ids[p]
            chosen.append(
                EvidenceSentence(
                    doc_id, self.titles[p], line, self.sentences[p][line], "evidence", score_of.get((doc_id, line))
                )
            )
        taken = {(s.doc_id, s.line) for s in chosen}
        chosen += [s for s in retrieved if (s.doc_id, s.line) not in taken][: limit - len(chosen)]
        return chosen


class _Unusable(Exception):
    """A claim no graph can be built for; the message is the quarantine reason."""


def build_fever_graphs(
    claims: Sequence[dict], docs: pa.Table, settings: FeverGraphSettings = FeverGraphSettings()
) -> tuple[list[dict], list[dict]]:
    """One batch of CLAIMS rows -> (GRAPHS rows, QUARANTINE rows), indexing `docs` on the spot.

    An actor that serves many batches builds `FeverGraphBuilder(docs, settings)` once instead.
    """
    return FeverGraphBuilder(docs, settings).build(claims)


def holds_gold_group(graph: dict, claim: dict) -> bool | None:
    """Whether the graph's nodes hold every sentence of some gold group (FEVER's evidence condition);
    None for claims without gold sentences (NOT ENOUGH INFO, unknown). Pages meet by title, so that
    FEVER page ids meet docs read from any dump format."""
    if claim.get("label") not in (SUPPORTS, REFUTES) or not claim.get("evidence"):
        return None
    held = {(n["title"], n["line"]) for n in graph["nodes"]}
    return any(all((normalize_title(s["page"]), s["line"]) in held for s in group) for group in claim["evidence"])


def evidence_recall(graphs: Sequence[dict], claims: Sequence[dict]) -> dict:
    """Share of SUPPORTS / REFUTES claims whose graph holds a whole gold group (a claim without a
    graph, quarantined, is a miss), and the distribution of nodes per graph."""
    graph_of = {g["qid"]: g for g in graphs}
    verdicts = [holds_gold_group(graph_of.get(c["qid"], {"nodes": []}), c) for c in claims]
    verifiable = [v for v in verdicts if v is not None]
    sizes = [len(g["nodes"]) for g in graphs]
    return {
        "verifiable_claims": len(verifiable),
        "evidence_recall": sum(verifiable) / len(verifiable) if verifiable else None,
        "graphs": len(graphs),
        "nodes_per_graph": {"mean": float(np.mean(sizes)), "min": min(sizes), "max": max(sizes)} if sizes else None,
    }


def sentence_training_examples(
    claims: str | Location,
    tables: str | Location,
    negatives_per_positive: int = 3,
    seed: int = 13,
    max_claims: int | None = None,
) -> list:
    """Claim-sentence training pairs of the sentence re-ranker (`rerank.claims`): a FEVER claims file
    over the docs under `tables` (`xh.retrieval.sentences.sentence_examples`)."""
    from xh.inputs.claims import read_fever_claims
    from xh.retrieval.sentences import sentence_examples

    rows, _ = read_fever_claims(claims)
    builder = FeverGraphBuilder.load(tables, FeverGraphSettings())
    return sentence_examples(rows[:max_claims], builder, negatives_per_positive, seed)
