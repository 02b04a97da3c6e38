"""GESA's typed edges of an evidence graph (edge mode `typed`): which relation joins two nodes.

The evidence-graph analogues of GESA's SENT-BASED / MATCH / PLC edges (Foolad & Kiani 2023), `EDGE_TYPES`:

    hyperlink          A -> B for a hyperlink from A to B (A's text mentions B: GESA's MATCH edge)
    reverse_hyperlink  B -> A for that hyperlink, when B does not link to A as well
    co_retrieved       between two nodes the question itself retrieved (sources ir / el, or the distractor
                       setting's context): both came from the question, like GESA's PLC edges
    comparison         every ordered pair of a comparison question's nodes
    self               every node to itself: the softmax may keep what the hub has

    typed = typed_edges(row["edges"], [n["source"] for n in row["nodes"]], row["question_type"])
    edge_type = edge_type_ids(typed)                  # int64 [E], indices into EDGE_TYPES

Graph building writes the types beside the edges (`xh.graph.hotpot`), graph encoding turns them into
indices (`xh.graph.encode`) and the typed hop attention of `xh.model.gesa` learns one vector per type.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import numpy as np

EDGE_TYPES = ("hyperlink", "reverse_hyperlink", "co_retrieved", "comparison", "self")
# Node sources of documents the question itself proposed (BM25, entity links; distractor: its context).
QUESTION_SOURCES = frozenset({"ir", "el", "context"})


def typed_edges(edges: Iterable, sources: list[str], question_type: str) -> list[dict]:
    """The typed edges `{src, dst, type}` of one graph row, sorted, one type per ordered pair.

    `edges`: the row's hyperlink edges (`{src, dst}` dicts or (src, dst) pairs, edge mode `hyperlink`);
    `sources`: each node's source (ir / el / exp / context); `question_type`: bridge or comparison.
    A comparison question's pairs are all `comparison` (its row's edges are fully connected by the
    paper's rule and say nothing about hyperlinks). Each pair gets the first type that applies in
    the order hyperlink, reverse_hyperlink, co_retrieved; every node gets a `self` loop.
    """
    n = len(sources)
    pairs = [(e["src"], e["dst"]) if isinstance(e, dict) else tuple(e) for e in edges]
    if any(not (0 <= s < n and 0 <= d < n) for s, d in pairs):
        raise ValueError(f"an edge points outside the graph's {n} nodes")
    types: dict[tuple[int, int], str] = {}
    if question_type == "comparison":
        types.update(dict.fromkeys(itertools.permutations(range(n), 2), "comparison"))
    else:
        links = {(int(s), int(d)) for s, d in pairs if s != d}
        types.update(dict.fromkeys(links, "hyperlink"))
        for s, d in sorted(links):
            types.setdefault((d, s), "reverse_hyperlink")
        asked = [i for i, source in enumerate(sources) if source in QUESTION_SOURCES]
        for pair in itertools.permutations(asked, 2):
            types.setdefault(pair, "co_retrieved")
    types.update({(i, i): "self" for i in range(n)})
    return [{"src": s, "dst": d, "type": t} for (s, d), t in sorted(types.items())]


def edge_type_ids(typed: Iterable[dict]) -> np.ndarray:
    """int64 [E]: the index in EDGE_TYPES of each typed edge's type."""
    return np.array([EDGE_TYPES.index(e["type"]) for e in typed], np.int64)
