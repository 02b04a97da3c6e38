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

The model (`PathScorer`): the features standardised, one hidden layer (16 ReLU units), one score per
pair; trained listwise (`PathScorer.fit`: a softmax over each question's pairs, the gold pair the
target, full-batch Adam), which takes seconds on a CPU, and scores ~100 pairs a question in
microseconds with numpy. What it needs is what a query actor holds anyway: the BM25 shards (scores
and term weights of any document), the link graph and the entity linker; no text, no GPU. The
retriever also ranks expansion neighbours with it, as pairs with the chosen pair's documents.

Its recall against BM25 on the real HotpotQA sample (`bench/rerank.py --path-scorer`) and the
ablations: docs/results.md.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from xh.jsonfiles import InputFileError
from xh.storage import S3Settings, join, open_input, open_output

__all__ = [
    "FEATURES",
    "PathCandidates",
    "PathScorer",
    "PathScorerFileError",
    "pair_features",
    "path_candidates",
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


def path_candidates(
    ir_ids: Sequence[str],
    term_weights: Callable[[list[str]], np.ndarray],
    links: Callable[[str], dict[str, str]],
    named: set[str],
    *,
    top: int,
    neighbours: int,
) -> PathCandidates:
    """The pairs of one question and their features.

    `ir_ids`: the ir documents in BM25's order; `term_weights(ids)`: the BM25 weight of each analyzed
    question term in each document, (terms, docs), 0 where absent; `links(a)`: a's neighbours in the
    link graph, doc id -> "out" (a links to it), "in" or "both"; `named`: the documents the question's
    entity links name.
    """
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
        # a's `neighbours` linked documents of highest BM25 (the sort is stable: link order breaks ties)
        kept = sorted((b for b in linked[a] if b not in in_top), key=lambda b: -bm25[b])[:neighbours]
        pairs += [(a, b) for b in [*first, *kept] if b != a]
    return PathCandidates(pairs, pair_features(pairs, ir_ids, top, weights, docs, linked, named))


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

    def save(self, uri: str, s3: S3Settings | None = None) -> str:
        """Writes `<uri>/path_scorer.json`; returns its URI. A scorer `load` would refuse (a training that
        diverged to NaN) is not written."""
        target = join(uri, SCORER_FILE)
        text = self.to_json()
        try:
            self._from_content(json.loads(text))
        except ValueError as e:
            raise ValueError(f"not saving the path scorer to {target}: {e}") from None
        with open_output(target, s3) as out:
            out.write(text.encode())
        return target

    @classmethod
    def load(cls, uri: str, s3: S3Settings | None = None) -> PathScorer:
        """From a folder holding path_scorer.json (local or s3://), checked: a file that is not JSON, names
        other features, or holds weights of the wrong shape or not finite (a NaN would rank every pair
        alike) is a `PathScorerFileError`, one line naming the file."""
        target = join(uri, SCORER_FILE)
        try:
            with open_input(target, s3) as stream:
                raw = stream.read()
        except FileNotFoundError:
            raise FileNotFoundError(
                f"no path scorer at {uri} (no {SCORER_FILE}): train one with `xh retrieve paths`"
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
