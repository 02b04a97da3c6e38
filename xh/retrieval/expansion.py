"""Hyperlink expansion: the documents linked to or from the ones a question already has.

Transformer-XH's HotpotQA graphs add D_exp = "documents linked to or from" the kept retrieval and
entity-linking documents, re-ranked, top 15. `LinkGraph` holds the `links` table as a graph in both
directions and answers, for a set of seed docs, their neighbours and how they are connected.

Usage::

    graph = LinkGraph.load("runs/demo/tables")               # reads <root>/links
    graph.neighbours(["413"])                                  # every neighbour, with its anchors
    # [Neighbour(doc_id='190', direction='out', connections=1, links=1, out_anchors=('Lake Melholm',),
    #            in_anchors=()), Neighbour(doc_id='560', ...)]
    expansion = graph.expand(["413", "2"], question_scorer=bm25_scores, top_k=15)
    expansion.ranking                                          # "scorer" ("connections" with no scorer)
    [(d.doc_id, d.score, d.rank, d.direction) for d in expansion.docs]

The rules:

- A neighbour is a doc that a seed links to ("out"), that links to a seed ("in"), or both ("both").
  Seeds themselves, links to missing pages (`missing` / null `target_doc_id`) and self-links are
  left out; seed ids the graph does not know have no neighbours.
- Anchors: `out_anchors` are the texts with which seeds link to the neighbour (how the seeds name
  it: what the paper puts in a node's text), `in_anchors` those with which it links to a seed;
  each distinct, in edge order (source doc id, then as in the links table).
- Ranking. With a `question_scorer` (a callable mapping a list of doc ids to as many scores, e.g.
  BM25 of each doc against the question) neighbours are ranked by that score, highest first. Without
  one, by the fallback order: number of distinct seeds connected to (the `score` reported), then
  docs a seed links to before docs that only link to a seed (a page names what it is about; the
  in-links of a popular page are many and mostly unrelated), then number of links with the seeds,
  then doc id (as a string). The fallback order also breaks ties between equal scorer scores, so
  either ranking is deterministic. Ranks start at 1.
- `max_candidates` (default: none) caps how many neighbours reach the scorer, cut in the fallback
  order: real Wikipedia has hub pages with 100,000s of in-links, too many to score per question.

Storage: doc ids are mapped to int32 indices (in sorted doc-id order, found by bisection); each link
is one edge in arrays sorted by source (source, target and anchor code, int32), with CSR offsets for
out-links and an int32 permutation for in-links: 16 bytes per link, plus 16 per doc and the distinct
anchor strings and doc ids. A query touches only its seeds' edges, never a neighbour's, so hub seeds
are the slow case. Its measured size and speed: docs/results.md.

No Ray here: a Ray driver builds one `LinkGraph` per actor (`load` once, then `expand` per question).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from xh import schemas
from xh.retrieval.arrays import sorted_codes
from xh.storage.store import Location, located

__all__ = ["LinkGraph", "Neighbour", "ExpandedDoc", "Expansion", "QuestionScorer"]

# Maps candidate doc ids to one score each (same order); higher is better.
QuestionScorer = Callable[[list[str]], Sequence[float]]

OUT, IN, BOTH = "out", "in", "both"


class Neighbour(NamedTuple):
    """A doc linked to or from the seeds."""

    doc_id: str
    direction: str  # "out" (a seed links to it), "in" (it links to a seed) or "both"
    connections: int  # distinct seeds it is linked with
    links: int  # links between it and the seeds, both directions
    out_anchors: tuple[str, ...]  # anchor texts of seed -> it links
    in_anchors: tuple[str, ...]  # anchor texts of it -> seed links


class ExpandedDoc(NamedTuple):
    """One row of an expansion: a candidate for D_exp."""

    doc_id: str
    score: float  # the scorer's score, or the number of connected seeds
    rank: int  # 1 = best
    direction: str
    out_anchors: tuple[str, ...]
    in_anchors: tuple[str, ...]


class Expansion(NamedTuple):
    docs: list[ExpandedDoc]  # the top_k, best first
    ranking: str  # "scorer" or "connections" (the fallback order)
    num_neighbours: int  # neighbours found before the cut to top_k


class _Found(NamedTuple):
    """Neighbours of a seed set as parallel arrays (doc indices, in increasing order), and the seeds' edges."""

    nodes: np.ndarray
    has_out: np.ndarray
    has_in: np.ndarray
    connections: np.ndarray
    links: np.ndarray
    out_edges: np.ndarray  # edge ids of seed -> x links
    out_nodes: np.ndarray  # their x
    in_edges: np.ndarray  # edge ids of x -> seed links
    in_nodes: np.ndarray  # their x


class LinkGraph:
    """The hyperlink graph of a corpus, both directions, over int32 doc indices."""

    def __init__(
        self,
        doc_ids: pa.Array,
        edge_src: np.ndarray,
        edge_dst: np.ndarray,
        edge_anchor: np.ndarray,
        anchors: pa.Array,
        offsets: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    ) -> None:
        # Edges are sorted by source; out-links of doc i are edges out_offsets[i]:out_offsets[i+1].
        self.doc_ids = doc_ids  # index -> doc id, sorted (UTF-8 byte order = str order): found by bisection
        self.edge_src, self.edge_dst, self.edge_anchor = edge_src, edge_dst, edge_anchor
        self.anchors = anchors  # anchor code -> text
        if offsets is not None:  # (out_offsets, in_edges, in_offsets) computed once per node (xh.retrieval.shared)
            self.out_offsets, self.in_edges, self.in_offsets = offsets
            return
        n = len(doc_ids)
        self.out_offsets = np.zeros(n + 1, np.int64)
        np.cumsum(np.bincount(edge_src, minlength=n), out=self.out_offsets[1:])
        # In-links of doc i: edges in_edges[in_offsets[i]:in_offsets[i+1]].
        self.in_edges = np.argsort(edge_dst, kind="stable").astype(np.int32)
        self.in_offsets = np.zeros(n + 1, np.int64)
        np.cumsum(np.bincount(edge_dst, minlength=n), out=self.in_offsets[1:])

    # --- building ----------------------------------------------------------------------------

    @classmethod
    def from_table(cls, links: pa.Table) -> LinkGraph:
        """Build from a `links` table (src_doc_id, target_doc_id, anchor, missing; see xh.schemas.LINKS)."""
        found = pc.and_(pc.invert(pc.fill_null(links["missing"], True)), pc.is_valid(links["target_doc_id"]))
        found = pc.and_(found, pc.not_equal(links["src_doc_id"], links["target_doc_id"]))
        links = links.filter(pc.fill_null(found, False))
        src, dst = links["src_doc_id"].combine_chunks(), links["target_doc_id"].combine_chunks()
        codes, doc_ids = sorted_codes(pa.chunked_array([src, dst], pa.string()))
        edge_src, edge_dst = codes[: len(src)], codes[len(src) :]
        anchor_codes = pc.dictionary_encode(links["anchor"].combine_chunks())
        edge_anchor = anchor_codes.indices.to_numpy(zero_copy_only=False).astype(np.int32)
        order = np.argsort(edge_src, kind="stable")  # keep the table's order within a source
        return cls(doc_ids, edge_src[order], edge_dst[order], edge_anchor[order], anchor_codes.dictionary)

    @classmethod
    def load(cls, tables: Location | str) -> LinkGraph:
        """Read `<tables>/links` (local or s3://)."""
        fs, root = located(tables).fs_path()
        columns = ["src_doc_id", "target_doc_id", "anchor", "missing"]
        return cls.from_table(pq.read_table(f"{root}/links", filesystem=fs, schema=schemas.LINKS, columns=columns))

    # --- size --------------------------------------------------------------------------------

    @property
    def num_docs(self) -> int:
        return len(self.doc_ids)

    @property
    def num_links(self) -> int:
        return len(self.edge_src)

    @property
    def nbytes(self) -> int:
        arrays = (self.edge_src, self.edge_dst, self.edge_anchor, self.out_offsets, self.in_edges, self.in_offsets)
        return sum(a.nbytes for a in arrays) + self.doc_ids.nbytes + self.anchors.nbytes

    # --- queries -----------------------------------------------------------------------------

    def index_of(self, doc_ids: Sequence[str]) -> np.ndarray:
        """The index of each doc id, or -1 for ids with no links (a binary search each)."""
        out = np.full(len(doc_ids), -1, np.int64)
        for k, doc_id in enumerate(doc_ids):
            i = bisect.bisect_left(self.doc_ids, doc_id, key=_as_py)
            if i < len(self.doc_ids) and self.doc_ids[i].as_py() == doc_id:
                out[k] = i
        return out

    def neighbours(self, seeds: Sequence[str]) -> list[Neighbour]:
        """Every neighbour of the seeds, in doc-id order, with direction and anchors."""
        seed_idx = self._seed_indices(seeds)
        found = self._find(seed_idx)
        return [self._neighbour(found, k) for k in range(len(found.nodes))]

    def directions(self, doc_id: str, limit: int) -> dict[str, str]:
        """One doc's neighbours -> "out" (it links to them), "in" or "both", without anchors: what a path
        scorer reads for each of a question's first documents. Out-links first, then in-links, each in
        edge order, at most `limit` (a hub has 100,000s of in-links)."""
        idx = int(self.index_of([doc_id])[0])
        if idx < 0:
            return {}
        outs = list(dict.fromkeys(self.edge_dst[self._out_edges(idx)].tolist()))[:limit]
        ins = self.edge_src[self._in_edges(idx)]
        # plain Python for the usual few links; numpy where a hub's in-links run to 100,000s
        back = set(np.asarray(outs)[np.isin(outs, ins)].tolist()) if len(ins) > 1000 else set(outs) & set(ins.tolist())
        found = {n: BOTH if n in back else OUT for n in outs}
        for start in range(0, len(ins), 4 * limit):
            if len(found) >= limit:
                break
            for n in ins[start : start + 4 * limit].tolist():
                if n not in found:
                    found[n] = IN
                    if len(found) >= limit:
                        break
        ids = self.doc_ids.take(pa.array(list(found), pa.int64())).to_pylist()
        return dict(zip(ids, found.values()))

    def expand(
        self,
        seeds: Sequence[str],
        question_scorer: QuestionScorer | None = None,
        top_k: int = 15,
        max_candidates: int | None = None,
    ) -> Expansion:
        """The `top_k` best neighbours of the seeds (see "Ranking" in the module docstring)."""
        seed_idx = self._seed_indices(seeds)
        found = self._find(seed_idx)
        # Fallback order: connections desc, out-linked first, links desc, doc id asc (ids sort like indices).
        fallback = np.lexsort((found.nodes, -found.links, ~found.has_out, -found.connections))
        if max_candidates is not None:
            fallback = fallback[:max_candidates]
        if question_scorer is None:
            order, scores, ranking = fallback, found.connections.astype(np.float64), "connections"
        else:
            scores = np.full(len(found.nodes), np.nan)
            candidates = self.doc_ids.take(pa.array(found.nodes[fallback], pa.int64())).to_pylist()
            given = np.asarray(question_scorer(candidates), dtype=np.float64)
            if given.shape != (len(fallback),):
                raise ValueError(f"question_scorer returned {given.shape} scores for {len(fallback)} doc ids")
            scores[fallback] = given
            # Stable sort on -score keeps the fallback order among equal scores.
            order, ranking = fallback[np.argsort(-given, kind="stable")], "scorer"
        docs = []
        for rank, k in enumerate(order[:top_k], start=1):
            n = self._neighbour(found, int(k))
            docs.append(ExpandedDoc(n.doc_id, float(scores[k]), rank, n.direction, n.out_anchors, n.in_anchors))
        return Expansion(docs, ranking, len(found.nodes))

    # --- internals ---------------------------------------------------------------------------

    def _seed_indices(self, seeds: Sequence[str]) -> np.ndarray:
        idx = self.index_of(list(dict.fromkeys(seeds)))
        return np.unique(idx[idx >= 0])

    def _out_edges(self, i: int) -> np.ndarray:
        return np.arange(self.out_offsets[i], self.out_offsets[i + 1])

    def _in_edges(self, i: int) -> np.ndarray:
        return self.in_edges[self.in_offsets[i] : self.in_offsets[i + 1]]

    def _find(self, seed_idx: np.ndarray) -> _Found:
        """Neighbours of the seeds, with direction flags and connection counts."""
        empty = np.empty(0, np.int64)
        out_edges, in_edges, per_seed = [empty], [empty], [empty]
        for s in seed_idx:
            out_edges.append(self._out_edges(s))
            in_edges.append(self._in_edges(s))
            per_seed.append(_unique(np.concatenate([self.edge_dst[out_edges[-1]], self.edge_src[in_edges[-1]]]))[0])
        out_edges, in_edges = np.concatenate(out_edges), np.concatenate(in_edges)
        outs, ins = self.edge_dst[out_edges], self.edge_src[in_edges]
        nodes, links = _unique(np.concatenate([outs, ins]))
        keep = ~np.isin(nodes, seed_idx)
        nodes, links = nodes[keep], links[keep]
        linked_seeds, connections = _unique(np.concatenate(per_seed))
        return _Found(
            nodes=nodes,
            has_out=np.isin(nodes, outs),
            has_in=np.isin(nodes, ins),
            connections=connections[np.searchsorted(linked_seeds, nodes)] if len(nodes) else empty,
            links=links,
            out_edges=out_edges,
            out_nodes=outs,
            in_edges=in_edges,
            in_nodes=ins,
        )

    def _neighbour(self, found: _Found, k: int) -> Neighbour:
        node = found.nodes[k]
        direction = BOTH if found.has_out[k] and found.has_in[k] else OUT if found.has_out[k] else IN
        # Anchors from the seeds' own edges: a neighbour may be a hub with millions of links.
        out_edges = found.out_edges[found.out_nodes == node]
        in_edges = found.in_edges[found.in_nodes == node]
        return Neighbour(
            doc_id=self.doc_ids[int(node)].as_py(),
            direction=direction,
            connections=int(found.connections[k]),
            links=int(found.links[k]),
            out_anchors=self._anchor_texts(self.edge_anchor[np.sort(out_edges)]),
            in_anchors=self._anchor_texts(self.edge_anchor[np.sort(in_edges)]),
        )

    def _anchor_texts(self, codes: np.ndarray) -> tuple[str, ...]:
        return tuple(self.anchors[int(c)].as_py() for c in dict.fromkeys(codes.tolist()))


def _unique(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct values and their counts (sorting beats numpy 2's hashing np.unique here)."""
    values = np.sort(values)
    starts = np.flatnonzero(np.concatenate(([True], values[1:] != values[:-1]))) if len(values) else values
    return values[starts], np.diff(np.append(starts, len(values)))


def _as_py(scalar: pa.Scalar):
    return scalar.as_py()
