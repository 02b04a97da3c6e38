"""Path scoring: the two documents a HotpotQA question reads together, chosen from retrieval's own signals.

    scorer = PathScorer.load("runs/demo/models/path-scorer")     # one small JSON file
    retriever = Retriever.load(index, tables, RetrieveConfig(path_scorer="runs/demo/models/path-scorer"))

A bridge question names its first paragraph and reaches the second through it ("the director of
The Hour of Armore": the second page shares few words with the question but is linked from the
first), so ranking documents one by one keeps the wrong second one; a comparison question names
both. The paper keeps BM25's top 2 re-ranked by BERT (§3); here the pair is chosen at once.

Candidates (`path_candidates`): ordered pairs (a, b), a among the first `top` ir documents, b another
of them or a document linked to or from a (the links table, either direction; the `neighbours` best
by BM25 per a). Each pair gets `FEATURES` (`pair_features`): for a and for b, BM25 over that of
BM25's first document, 1 / (1 + rank in BM25's ir list), whether it is in the first `top`, whether the question's
entity links name it, and the share of the question's terms it contains; for the pair, whether a
links to b and b to a, and the share of the question's terms in a or b.

A query actor computes them per batch of questions (`path_candidates_batch`): the links of every
question's first documents in one vectorised pass over the graph's edges (`link_directions`), the term
weights of every question's documents in one slice of each shard (`Retriever.term_weights_batch`), and
each question's features from per-document arrays gathered per pair (`pair_features`), never pair by
pair in Python.

The model (`PathScorer`): the features standardised, one hidden layer (16 ReLU units), one score per
pair; trained listwise (`PathScorer.fit`: a softmax over each question's pairs, the gold pair the
target, full-batch Adam), which takes seconds on a CPU, and scores ~100 pairs a question in
microseconds with numpy. What it needs is what a query actor holds anyway: the BM25 shards (scores
and term weights of any document), the link graph and the entity linker; no text, no GPU. The
retriever also ranks expansion neighbours with it, as pairs with the chosen pair's documents (their
links and weights read from the batch's where it has them). `PathScorer.load` checks the file: JSON,
this code's feature list, the weights' shapes and finite values.

Its recall against BM25 on the real HotpotQA sample (`bench/rerank.py --path-scorer`) and the
ablations: docs/results/retrieval.md.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xh.storage.jsonfiles import InputFileError
from xh.storage.store import Location, located

__all__ = [
    "FEATURES",
    "PathCandidates",
    "PathScorer",
    "PathScorerFileError",
    "QuestionPaths",
    "link_directions",
    "pair_features",
    "path_candidates",
    "path_candidates_batch",
    "SCORER_FILE",
]

SCORER_FILE = "path_scorer.json"
_PER_DOC = ("bm25", "rank", "top", "named", "terms")
FEATURES = (
    *(f"a_{f}" for f in _PER_DOC),
    *(f"b_{f}" for f in _PER_DOC),
    "a_links_b",
    "b_links_a",
    "pair_terms",
)


class PathCandidates(NamedTuple):
    pairs: list[tuple[str, str]]  # (first, second) doc ids
    features: np.ndarray  # (len(pairs), len(FEATURES)) float32


class QuestionPaths(NamedTuple):
    """One question's pairs and what they were computed from, which the expansion's pairs reuse."""

    candidates: PathCandidates
    docs: list[str]  # the documents weighed: the first `top` ir documents, then their linked ones
    weights: np.ndarray  # (terms, docs): each question term's BM25 weight in each
    linked: dict[str, dict[str, str]]  # each first document's link neighbours (at most `pool`) and direction
    pool: int  # the most neighbours asked for per first document

    def neighbours(self, doc_id: str, limit: int) -> dict[str, str] | None:
        """`doc_id`'s first `limit` neighbours (as `LinkGraph.directions` lists them) where `linked` holds
        them; None where it does not (not a first document, or cut at `pool` below `limit`)."""
        found = self.linked.get(doc_id)
        if found is None or (len(found) >= self.pool and limit > self.pool):
            return None
        return found if len(found) <= limit else dict(list(found.items())[:limit])

    def weights_of(self, docs: Sequence[str], term_weights: Callable[[list[str]], np.ndarray]) -> np.ndarray:
        """(terms, docs) weights of `docs`: those weighed already copied, only the others asked for."""
        column = {d: i for i, d in enumerate(self.docs)}
        missing = [d for d in docs if d not in column]
        if not missing:
            return self.weights[:, [column[d] for d in docs]]
        more = term_weights(missing)
        column |= {d: len(self.docs) + i for i, d in enumerate(missing)}
        return np.concatenate([self.weights, more], axis=1)[:, [column[d] for d in docs]]


def path_candidates(
    ir_ids: Sequence[str],
    term_weights: Callable[[list[str]], np.ndarray],
    links: Callable[[str], dict[str, str]],
    named: set[str],
    *,
    top: int,
    neighbours: int,
) -> PathCandidates:
    """The pairs of one question and their features (`path_candidates_batch` for one question).

    `ir_ids`: the ir documents in BM25's order; `term_weights(ids)`: the BM25 weight of each analyzed
    question term in each document, (terms, docs), 0 where absent; `links(a)`: a's neighbours in the
    link graph, doc id -> "out" (a links to it), "in" or "both"; `named`: the documents the question's
    entity links name.
    """
    return path_candidates_batch(
        [ir_ids],
        lambda docs: [term_weights(docs[0])],
        lambda ids: [links(a) for a in ids],
        [named],
        top=top,
        neighbours=neighbours,
    )[0].candidates


def path_candidates_batch(
    ir_lists: Sequence[Sequence[str]],
    term_weights: Callable[[list[list[str]]], list[np.ndarray]],
    links: Callable[[list[str]], list[dict[str, str]]],
    named: Sequence[set[str]],
    *,
    top: int,
    neighbours: int,
    pool: int = 0,
) -> list[QuestionPaths]:
    """The pairs of a batch of questions and their features, with one call of `links` (every first
    document's neighbours) and one of `term_weights` (each question's documents, (terms, docs) per
    question) for the whole batch; `pool`: the `limit` that `links` cuts each neighbour list at."""
    firsts = [list(dict.fromkeys(ir_ids[:top])) for ir_ids in ir_lists]
    found = iter(links([a for first in firsts for a in first]))
    linked = [{a: next(found) for a in first} for first in firsts]
    docs = []
    for first, near in zip(firsts, linked):
        in_top = set(first)
        docs.append(first + list(dict.fromkeys(b for a in first for b in near[a] if b not in in_top)))
    weights = term_weights(docs) if docs else []
    out = []
    for ir_ids, first, near, doc_list, w, names in zip(ir_lists, firsts, linked, docs, weights, named):
        if not first:
            out.append(QuestionPaths(PathCandidates([], np.zeros((0, len(FEATURES)), np.float32)), [], w, {}, pool))
            continue
        in_top, column = set(first), {d: i for i, d in enumerate(doc_list)}
        bm25 = dict(zip(doc_list, w.sum(axis=0).tolist()))
        pairs, a_cols, b_cols, codes = [], [], [], []
        for i, a in enumerate(first):
            # a's `neighbours` linked documents of highest BM25 (the sort is stable: link order breaks ties)
            kept = sorted((b for b in near[a] if b not in in_top), key=lambda b: -bm25[b])[:neighbours]
            others = [*first[:i], *first[i + 1 :], *kept]  # the first documents are docs' first columns
            pairs += [(a, b) for b in others]
            a_cols += [i] * len(others)
            b_cols += [*range(i), *range(i + 1, len(first)), *(column[b] for b in kept)]
            codes += [_DIRECTION.get(near[a].get(b), 0) for b in others]
        features = _features(
            np.array(a_cols, np.intp),
            np.array(b_cols, np.intp),
            np.array(codes, np.int8),
            ir_ids,
            top,
            w,
            doc_list,
            names,
        )
        out.append(QuestionPaths(PathCandidates(pairs, features), doc_list, w, near, pool))
    return out


def pair_features(
    pairs: Sequence[tuple[str, str]],
    ir_ids: Sequence[str],
    top: int,
    weights: np.ndarray,
    docs: Sequence[str],
    linked: dict[str, dict[str, str]],
    named: set[str],
) -> np.ndarray:
    """`FEATURES` of given (a, b) pairs of one question. `weights`: (terms, docs) BM25 weights of `docs`,
    which hold every document of the pairs; `linked[a]`: a's link neighbours and their direction. A
    document's BM25 is taken over the question's best, BM25's first ir document."""
    column = {d: i for i, d in enumerate(docs)}
    a = np.array([column[a] for a, _ in pairs], np.intp)
    b = np.array([column[b] for _, b in pairs], np.intp)
    codes = np.array([_DIRECTION.get(linked.get(x, {}).get(y), 0) for x, y in pairs], np.int8)
    return _features(a, b, codes, ir_ids, top, weights, docs, named)


_DIRECTION = {"out": 1, "in": 2, "both": 3}  # bit 1: a links to b, bit 2: b links to a


def _features(
    a: np.ndarray,
    b: np.ndarray,
    codes: np.ndarray,
    ir_ids: Sequence[str],
    top: int,
    weights: np.ndarray,
    docs: Sequence[str],
    named: set[str],
) -> np.ndarray:
    """`pair_features` of pairs given as the columns of their documents in `weights` / `docs` and their
    link direction codes (`_DIRECTION`): each document's features once, then gathered per pair."""
    features = np.zeros((len(a), len(FEATURES)), np.float32)
    if not len(a):
        return features
    rank = {d: i for i, d in reversed(list(enumerate(ir_ids)))}
    in_top = set(ir_ids[:top])
    bm25 = weights.sum(axis=0)
    present = weights > 0
    num_terms = max(1, weights.shape[0])
    first = next((i for i, d in enumerate(docs) if d == ir_ids[0]), None) if ir_ids else None
    best = float(bm25[first]) if first is not None else float(bm25.max(initial=0.0))
    best = max(best, 1e-9)
    per_doc = np.empty((len(docs), len(_PER_DOC)))
    per_doc[:, 0] = bm25 / best
    per_doc[:, 1] = 1.0 / (1 + np.array([rank.get(d, len(ir_ids)) for d in docs], np.int64))
    per_doc[:, 2] = [d in in_top for d in docs]
    per_doc[:, 3] = [d in named for d in docs]
    per_doc[:, 4] = present.sum(axis=0) / num_terms
    width = len(_PER_DOC)
    features[:, :width] = per_doc[a]
    features[:, width : 2 * width] = per_doc[b]
    features[:, 2 * width] = codes & 1
    features[:, 2 * width + 1] = codes >> 1
    features[:, 2 * width + 2] = (present[:, a] | present[:, b]).sum(axis=0) / num_terms
    return features


def link_directions(graph, doc_ids: Sequence[str], limit: int) -> list[dict[str, str]]:
    """`graph.directions(d, limit)` (`xh.retrieval.expansion.LinkGraph`) of each doc, the same dicts in
    the same order, computed over all their edges at once. A doc with more in-links than `4 * limit` (a
    hub) goes through `directions` itself, which reads a hub's in-links a chunk at a time."""
    idx = _index_in(graph.doc_ids, doc_ids)
    out: list[dict[str, str]] = [{} for _ in doc_ids]
    in_count = np.where(idx >= 0, graph.in_offsets[idx + 1] - graph.in_offsets[np.maximum(idx, 0)], 0)
    for k in np.flatnonzero((idx >= 0) & (in_count > 4 * limit)).tolist():
        out[k] = graph.directions(doc_ids[k], limit)
    at = np.flatnonzero((idx >= 0) & (in_count <= 4 * limit))
    if not len(at):
        return out
    seeds = idx[at]
    n = np.int64(graph.num_docs)

    def edges(offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(owner, position) of each seed's edges in `offsets`' order, seed by seed."""
        begin, count = offsets[seeds], offsets[seeds + 1] - offsets[seeds]
        owner = np.repeat(np.arange(len(seeds)), count)
        return owner, np.arange(count.sum()) - np.repeat(np.cumsum(count) - count - begin, count)

    out_owner, out_edge = edges(graph.out_offsets)
    in_owner, in_at = edges(graph.in_offsets)
    out_key = out_owner * n + graph.edge_dst[out_edge]
    in_key = in_owner * n + graph.edge_src[graph.in_edges[in_at]]
    # each seed's distinct out-links in edge order (np.unique's first occurrences, put back in order)
    out_key = out_key[np.sort(np.unique(out_key, return_index=True)[1])]
    out_rank = _rank_within(out_key // n)
    outs = np.bincount(out_key // n, minlength=len(seeds))
    both = np.isin(out_key, in_key)
    in_key = in_key[np.sort(np.unique(in_key, return_index=True)[1])]
    in_key = in_key[~np.isin(in_key, out_key)]
    in_rank = _rank_within(in_key // n) + outs[in_key // n]
    key = np.concatenate([out_key[out_rank < limit], in_key[in_rank < limit]])
    kind = np.concatenate(
        [np.where(both, "both", "out")[out_rank < limit], np.full(int((in_rank < limit).sum()), "in")]
    )
    order = np.argsort(key // n, kind="stable")  # seed by seed, out-links before in-links
    key, kind = key[order], kind[order].tolist()
    ids = graph.doc_ids.take(pa.array(key % n, pa.int64())).to_pylist()
    ends = np.cumsum(np.bincount(key // n, minlength=len(seeds))).tolist()
    start = 0
    for k, end in zip(at.tolist(), ends):
        out[k] = dict(zip(ids[start:end], kind[start:end]))
        start = end
    return out


def _index_in(sorted_ids: pa.Array, ids: Sequence[str]) -> np.ndarray:
    """The index of each id in `sorted_ids` (distinct, in str order), -1 where absent: `LinkGraph.index_of`
    with one binary search for all the ids, Arrow comparing the strings, instead of one search each."""
    if not len(sorted_ids) or not len(ids):
        return np.full(len(ids), -1, np.int64)
    query = pa.array(ids, pa.string())
    lo, hi = np.zeros(len(ids), np.int64), np.full(len(ids), len(sorted_ids), np.int64)
    while (active := lo < hi).any():
        mid = np.where(active, (lo + hi) // 2, 0)
        # UTF-8 byte order, which is str order
        less = np.asarray(pc.less(sorted_ids.take(pa.array(mid)), query), bool)
        lo, hi = np.where(active & less, mid + 1, lo), np.where(active & ~less, mid, hi)
    at = np.minimum(lo, len(sorted_ids) - 1)
    same = np.asarray(pc.equal(sorted_ids.take(pa.array(at)), query), bool)
    return np.where((lo < len(sorted_ids)) & same, lo, -1)


def _rank_within(owner: np.ndarray) -> np.ndarray:
    """Position of each entry among the entries of its owner (`owner` sorted)."""
    if not len(owner):
        return owner
    first = np.r_[0, np.flatnonzero(owner[1:] != owner[:-1]) + 1]
    return np.arange(len(owner)) - np.repeat(first, np.diff(np.r_[first, len(owner)]))


@dataclass
class PathScorer:
    """Standardised features -> ReLU hidden layer -> a score per pair (numpy at scoring time)."""

    mean: np.ndarray
    std: np.ndarray
    w1: np.ndarray  # (features, hidden)
    b1: np.ndarray
    w2: np.ndarray  # (hidden,)
    b2: float
    metrics: dict | None = None  # what training measured, saved with it

    def score(self, features: np.ndarray) -> np.ndarray:
        hidden = np.maximum(((features - self.mean) / self.std) @ self.w1 + self.b1, 0.0)
        return hidden @ self.w2 + self.b2

    def best_pair(self, candidates: PathCandidates) -> tuple[str, str] | None:
        """The highest-scoring pair; the first on ties (retrieval's order); None without pairs."""
        if not candidates.pairs:
            return None
        return candidates.pairs[int(np.argmax(self.score(candidates.features)))]

    @classmethod
    def fit(
        cls,
        groups: Sequence[PathCandidates],
        gold: Sequence[set[str]],
        *,
        hidden: int = 16,
        epochs: int = 300,
        lr: float = 0.01,
        weight_decay: float = 1e-4,
        seed: int = 13,
    ) -> PathScorer:
        """Listwise training: per question, a softmax over its pairs with both orders of the gold pair
        as the target. Questions whose pairs hold no gold pair teach nothing and are left out."""
        import torch

        usable = []
        for candidates, pair in zip(groups, gold):
            target = np.fromiter((set(p) == pair for p in candidates.pairs), np.float32, len(candidates.pairs))
            if target.any():
                usable.append((candidates.features, target / target.sum()))
        if not usable:
            raise ValueError("no question has its gold pair among its candidates: nothing to learn from")
        everything = np.concatenate([f for f, _ in usable])
        mean, std = everything.mean(axis=0), everything.std(axis=0) + 1e-6
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(len(FEATURES), hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))
        optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
        # one padded batch of all questions: a full pass is one step
        width = max(len(t) for _, t in usable)
        features = torch.zeros(len(usable), width, len(FEATURES))
        targets = torch.zeros(len(usable), width)
        mask = torch.zeros(len(usable), width, dtype=torch.bool)
        for i, (f, t) in enumerate(usable):
            features[i, : len(t)] = torch.from_numpy((f - mean) / std)
            targets[i, : len(t)] = torch.from_numpy(t)
            mask[i, : len(t)] = True
        for _ in range(epochs):
            logits = model(features).squeeze(-1).masked_fill(~mask, float("-inf"))
            loss = -(torch.log_softmax(logits, dim=1).masked_fill(~mask, 0.0) * targets).sum(dim=1).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        first, last = model[0], model[2]
        return cls(
            mean=mean,
            std=std,
            w1=first.weight.detach().numpy().T.copy(),
            b1=first.bias.detach().numpy().copy(),
            w2=last.weight.detach().numpy()[0].copy(),
            b2=float(last.bias.detach()[0]),
            metrics={"questions": len(groups), "usable": len(usable), "loss": float(loss.detach()), "seed": seed},
        )

    def to_json(self) -> str:
        """What `save` writes: the feature names, the weights and the training figures."""
        content = {
            "features": list(FEATURES),
            **{k: getattr(self, k).tolist() for k in ("mean", "std", "w1", "b1", "w2")},
            "b2": self.b2,
            "metrics": self.metrics or {},
        }
        return json.dumps(content)

    def save(self, where: Location | str) -> str:
        """Writes `<where>/path_scorer.json`; returns its URI. A scorer `load` would refuse (a training that
        diverged to NaN) is not written."""
        target = located(where).join(SCORER_FILE)
        text = self.to_json()
        try:
            self._from_content(json.loads(text))
        except ValueError as e:
            raise ValueError(f"not saving the path scorer to {target}: {e}") from None
        target.write_bytes(text.encode())
        return target.uri

    @classmethod
    def load(cls, where: Location | str) -> PathScorer:
        """From a folder holding path_scorer.json (local or s3://), checked: a file that is not JSON, names
        other features, or holds weights of the wrong shape or not finite (a NaN would rank every pair
        alike) is a `PathScorerFileError`, one line naming the file."""
        where = located(where)
        target = where.join(SCORER_FILE)
        try:
            raw = target.read_bytes()
        except FileNotFoundError:
            raise FileNotFoundError(
                f"no path scorer at {where} (no {SCORER_FILE}): train one with `xh retrieve paths`"
            ) from None
        try:
            content = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise PathScorerFileError(f"{target}: not a path scorer, not JSON ({e})") from None
        try:
            return cls._from_content(content)
        except ValueError as e:
            raise PathScorerFileError(f"{target}: not a usable path scorer: {e}") from None

    @classmethod
    def _from_content(cls, content) -> PathScorer:
        """The scorer a parsed file describes; ValueError saying what is wrong otherwise."""
        if not isinstance(content, dict):
            raise ValueError(f"a JSON object expected, found {type(content).__name__}")
        if content.get("features") != list(FEATURES):
            raise ValueError(f"trained on other features: {content.get('features')} (this code's: {list(FEATURES)})")
        missing = [k for k in ("mean", "std", "w1", "b1", "w2", "b2") if k not in content]
        if missing:
            raise ValueError(f"no {', '.join(missing)}")
        arrays = {}
        for key in ("mean", "std", "w1", "b1", "w2", "b2"):
            try:
                with np.errstate(over="ignore"):  # what float32 cannot hold reads as infinity: refused below
                    arrays[key] = np.asarray(content[key], np.float64).astype(np.float32)
            except (TypeError, ValueError):
                raise ValueError(f"{key} is not an array of numbers") from None
            if not np.isfinite(arrays[key]).all():
                raise ValueError(f"{key} holds non-finite values (NaN or infinity)")
        if arrays["b1"].ndim != 1 or not len(arrays["b1"]):
            raise ValueError(f"b1 has shape {arrays['b1'].shape}, expected (hidden units,)")
        hidden = len(arrays["b1"])
        expected = {
            "mean": (len(FEATURES),),
            "std": (len(FEATURES),),
            "w1": (len(FEATURES), hidden),
            "b1": (hidden,),
            "w2": (hidden,),
            "b2": (),
        }
        for key, shape in expected.items():
            if arrays[key].shape != shape:
                raise ValueError(f"{key} has shape {arrays[key].shape}, expected {shape} ({len(FEATURES)} features)")
        if (arrays["std"] <= 0).any():
            raise ValueError("std holds values <= 0")
        b2 = float(arrays.pop("b2"))
        metrics = content.get("metrics")
        return cls(**arrays, b2=b2, metrics=metrics if isinstance(metrics, dict) else None)


class PathScorerFileError(InputFileError):
    """A path scorer file that cannot be used, in one line naming it."""
