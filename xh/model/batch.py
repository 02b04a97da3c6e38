"""Stack several `EncodedGraph`s into one padded batch of tensors for `XHModel`.

    batch = collate([graph_a, graph_b])           # nodes of both graphs, padded to the longest node
    batch = batch.to("cuda")
    batch.num_graphs, batch.num_real_tokens       # 2, tokens that are not padding

    for indices in pack_batches(graphs, max_padded_tokens=8192):   # graph indices per batch
        batch = collate([graphs[i] for i in indices])

Nodes of all graphs are rows of one [N, L] tensor (L = the longest node in the batch: dynamic
padding); `node_graph[i]` is the graph of node i, and `edges` are shifted to batch-global row indices,
so hop attention (a softmax per destination node) never crosses graphs, and in-sequence attention is
per row anyway. Labels are -1 where unknown, as in `EncodedGraph`; per-graph labels have one entry
per graph, with the answer span (answer_spans row 0) turned into a batch-global node index.

Bad input is refused with a one-line `ValueError` naming the graph: an edge or span pointing
outside its graph, arrays of a node that disagree in length, a token's sentence beyond num_sentences.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields

import numpy as np
import torch

from xh.graph.encoded import EncodedGraph


@dataclass
class GraphBatch:
    # Per node (N rows, L = longest node in the batch):
    input_ids: torch.Tensor  # int64 [N, L]; padding = 0 (masked out anyway)
    attention_mask: torch.Tensor  # int64 [N, L]; 1 on real tokens
    token_type_ids: torch.Tensor  # int64 [N, L]
    paragraph_mask: torch.Tensor  # bool [N, L]; where a span may start or end
    sentence_ids: torch.Tensor  # int64 [N, L]; paragraph sentence of a token, -1 elsewhere
    node_graph: torch.Tensor  # int64 [N]; graph index of each node (0..G-1)
    edges: torch.Tensor  # int64 [2, E]; (src, dst) batch-global node indices
    graph_offsets: torch.Tensor  # int64 [G + 1]; the nodes of graph g are rows graph_offsets[g]:graph_offsets[g+1]
    num_sentences: torch.Tensor  # int64 [N]
    # Labels, -1 where unknown:
    node_relevance: torch.Tensor  # int64 [N]
    node_has_answer: torch.Tensor  # int64 [N]
    sentence_labels: torch.Tensor  # int64 [N, S]; S = max num_sentences in the batch (at least 1)
    answer_node: torch.Tensor  # int64 [G]; batch-global node of answer_spans row 0
    answer_start: torch.Tensor  # int64 [G]; token position in that node
    answer_end: torch.Tensor  # int64 [G]; inclusive
    answer_type: torch.Tensor  # int64 [G]
    question_type: torch.Tensor  # int64 [G]
    claim_label: torch.Tensor  # int64 [G]
    # Edge mode typed: each edge's type (xh.graph.typed.EDGE_TYPES), -1 for edges of graphs without types.
    edge_types: torch.Tensor  # int64 [E]
    # Host-side, never moved: labelled entries per loss term (`label_counts`), so that the losses divide by
    # them and leave out terms without labels with no read-back from the device. None: count from tensors.
    label_counts: dict[str, int] | None = field(default=None, kw_only=True)
    real_tokens: int | None = field(default=None, kw_only=True)  # host-side too, as counted at collate
    # The hop graph's mask, made on the host with the batch (`xh.model.hop.HopGraph.of_batch`): bool [N, N],
    # allowed[d, s] when node d's hub attends to node s's (a self-loop for a node without in-edges), and
    # bool [N] for those nodes. None: built from `edges` on the device.
    hop_allowed: torch.Tensor | None = field(default=None, kw_only=True)
    hop_lonely: torch.Tensor | None = field(default=None, kw_only=True)
    # What the heads and losses read that depends on the batch alone (`head_constants`), made on the host
    # with the batch so that the step computes none of it. None: made from the tensors, on their device.
    constants: dict[str, torch.Tensor] | None = field(default=None, kw_only=True)

    @property
    def num_graphs(self) -> int:
        return int(self.graph_offsets.numel() - 1)

    @property
    def num_nodes(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_real_tokens(self) -> int:
        return self.real_tokens if self.real_tokens is not None else int(self.attention_mask.sum())

    @property
    def encoder_shape(self) -> tuple[int, int]:
        """[rows, tokens] the encoder computes: here one row per node (`xh.model.packing` packs several)."""
        return tuple(self.input_ids.shape)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> GraphBatch:
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> GraphBatch:
        return self._map(lambda t: t.pin_memory())

    def _map(self, fn) -> GraphBatch:
        """A batch of fn(tensor) per tensor field and per tensor of a dict field (other fields as they are)."""

        def mapped(value):
            if isinstance(value, dict):
                return {key: mapped(v) for key, v in value.items()}
            return fn(value) if isinstance(value, torch.Tensor) else value

        return type(self)(**{f.name: mapped(getattr(self, f.name)) for f in fields(self)})

    def head_constants(self) -> dict[str, torch.Tensor]:
        """`constants`, or made from the tensors on their device for a batch made without them."""
        return self.constants if self.constants is not None else head_constants(self)

    def counts(self) -> dict[str, int]:
        """`label_counts`, or counted from the tensors (a read-back from a device) for a batch made without it."""
        if self.label_counts is not None:
            return self.label_counts
        return count_labels(
            {name: getattr(self, name).cpu().numpy() for name in LABEL_FIELDS}, self.sentence_ids.cpu().numpy()
        )


LABEL_FIELDS = ("node_relevance", "answer_node", "answer_type", "claim_label", "sentence_labels")


def count_labels(labels: dict[str, np.ndarray], sentence_ids: np.ndarray) -> dict[str, int]:
    """Labelled entries of each loss term. A labelled sentence counts only if some of its tokens survived
    truncation (it has no vector otherwise)."""
    sentences = labels["sentence_labels"]
    has_tokens = np.zeros(sentences.shape, bool)
    node, _ = np.nonzero(sentence_ids >= 0)
    has_tokens[node, sentence_ids[sentence_ids >= 0]] = True
    return {
        "node": int((labels["node_relevance"] >= 0).sum()),
        "span": int((labels["answer_node"] >= 0).sum()),
        "answer_type": int((labels["answer_type"] >= 0).sum()),
        "sentence": int(((sentences >= 0) & has_tokens).sum()),
        "claim": int((labels["claim_label"] >= 0).sum()),
    }


def head_constants(batch: GraphBatch) -> dict[str, torch.Tensor]:
    """The masks, label targets and weights the heads and losses read (`xh.model.heads`), all functions of
    the batch alone. `collate` makes them on the host: a dozen operators a step fewer. Loss weights are
    1/count on labelled entries (0 elsewhere), so a masked sum is the mean over the labelled ones."""
    counts = batch.counts()
    graphs = torch.arange(batch.num_graphs, device=batch.node_graph.device)
    s = batch.sentence_labels.shape[1]
    member = batch.sentence_ids.unsqueeze(1) == torch.arange(s, device=graphs.device).view(1, s, 1)  # [N, S, L]
    tokens = member.sum(-1, keepdim=True)
    sentence_mask = tokens.squeeze(-1) > 0
    sentence_known = (batch.sentence_labels >= 0) & sentence_mask
    return {
        "graph_member": batch.node_graph.unsqueeze(0) == graphs.unsqueeze(1),  # bool [G, N]
        "span_blocked": ~batch.paragraph_mask.unsqueeze(-1),  # bool [N, L, 1]: no span starts or ends there
        "sentence_weights": member / tokens.clamp(min=1),  # float [N, S, L]: a sentence's mean over its tokens
        "sentence_mask": sentence_mask,  # bool [N, S]: the node has tokens of that sentence
        "sentence_blocked": ~sentence_mask,
        "relevance_target": batch.node_relevance.clamp(min=0).float(),
        "relevance_weight": (batch.node_relevance >= 0).float() / max(counts["node"], 1),
        "sentence_target": batch.sentence_labels.clamp(min=0).float(),
        "sentence_weight": sentence_known.float() / max(counts["sentence"], 1),
        "span_targets": span_targets(batch),  # [N, 2]
    }


def span_targets(batch: GraphBatch) -> torch.Tensor:
    """int64 [N, 2]: the answer's start and end on each graph's answer node, -1 on every other node."""
    n = batch.num_nodes
    rows = torch.where(batch.answer_node >= 0, batch.answer_node, n)  # graphs without an answer: a spare row
    targets = torch.full((n + 1, 2), -1, dtype=torch.long, device=rows.device)
    return targets.index_copy_(0, rows, torch.stack([batch.answer_start, batch.answer_end], -1))[:n]


def _check(graph: EncodedGraph) -> None:
    n = graph.num_nodes
    if n == 0:
        raise ValueError(f"graph {graph.qid!r} has no nodes")
    for i, ids in enumerate(graph.input_ids):
        where = f"graph {graph.qid!r} node {i}"
        lengths = {len(ids), len(graph.token_type_ids[i]), len(graph.paragraph_mask[i]), len(graph.sentence_ids[i])}
        if len(lengths) != 1 or len(ids) == 0:
            raise ValueError(f"{where}: token arrays are empty or disagree in length {sorted(lengths)}")
        if graph.sentence_ids[i].size and graph.sentence_ids[i].max() >= graph.num_sentences[i]:
            raise ValueError(f"{where}: a token's sentence is beyond num_sentences={graph.num_sentences[i]}")
    edges = np.asarray(graph.edges).reshape(-1, 2)
    if edges.size and (edges.min() < 0 or edges.max() >= n):
        raise ValueError(f"graph {graph.qid!r}: an edge points outside its {n} nodes")
    if graph.edge_types is not None and len(graph.edge_types) != len(edges):
        raise ValueError(f"graph {graph.qid!r}: {len(graph.edge_types)} edge types for {len(edges)} edges")
    spans = np.asarray(graph.answer_spans).reshape(-1, 3)
    if len(spans) and spans[0, 0] >= 0:
        node, start, end = (int(x) for x in spans[0])
        if node >= n or not (0 <= start <= end < len(graph.input_ids[node])):
            raise ValueError(f"graph {graph.qid!r}: answer span {spans[0].tolist()} is outside its node")
        if not (graph.paragraph_mask[node][start] and graph.paragraph_mask[node][end]):
            raise ValueError(f"graph {graph.qid!r}: answer span {spans[0].tolist()} is not on paragraph tokens")


def hop_mask(edges: np.ndarray, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """(allowed [N, N], lonely [N]) of edges [E, 2] (src, dst), as `HopGraph.build` makes them."""
    allowed = np.zeros((num_nodes, num_nodes), bool)
    allowed[edges[:, 1], edges[:, 0]] = True
    lonely = ~allowed.any(1)
    allowed[lonely, lonely] = True  # boolean index on both axes: the diagonal entries of those nodes
    return allowed, lonely


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def token_places(sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For items of these sizes laid end to end (a node's tokens, say): each element's item and its
    position within the item."""
    item = np.repeat(np.arange(len(sizes)), sizes)
    return item, np.arange(len(item)) - np.repeat(np.cumsum(sizes) - sizes, sizes)


def place_tokens(graphs: Sequence[EncodedGraph], sizes: np.ndarray, length: int) -> dict[str, np.ndarray]:
    """Every node's token arrays as rows [N, length], padded: one concatenation per field, scattered to
    (node, position) for all nodes at once (a batch of short nodes has hundreds of nodes)."""
    n = len(sizes)
    node, position = token_places(sizes)

    def tokens(name: str) -> np.ndarray:
        return np.concatenate([a for g in graphs for a in getattr(g, name)])

    arrays = {
        "input_ids": np.zeros((n, length), np.int64),
        "attention_mask": np.zeros((n, length), np.int64),
        "token_type_ids": np.zeros((n, length), np.int64),
        "paragraph_mask": np.zeros((n, length), bool),
        "sentence_ids": np.full((n, length), -1, np.int64),
    }
    arrays["attention_mask"][node, position] = 1
    for name in ("input_ids", "token_type_ids", "paragraph_mask", "sentence_ids"):
        arrays[name][node, position] = tokens(name)
    return arrays


def collate(graphs: Sequence[EncodedGraph], length_multiple: int = 1) -> GraphBatch:
    """Stack graphs into one batch: nodes as rows padded to the longest node (rounded up to a multiple of
    `length_multiple`, so that batches come in few shapes), edges batch-global."""
    if not graphs:
        raise ValueError("collate needs at least one graph")
    for graph in graphs:
        _check(graph)
    sizes = np.array([len(ids) for g in graphs for ids in g.input_ids], np.int64)
    n = len(sizes)
    length = round_up(int(sizes.max()), length_multiple)
    max_sentences = max(1, max(int(s) for g in graphs for s in g.num_sentences))

    token_arrays = place_tokens(graphs, sizes, length)
    labels = [
        np.asarray(g.sentence_labels[i] if i < len(g.sentence_labels) else (), np.int64)[:max_sentences]
        for g in graphs
        for i in range(g.num_nodes)
    ]
    sentence_labels = np.full((n, max_sentences), -1, np.int64)
    label_node, label_position = token_places(np.array([len(a) for a in labels], np.int64))
    sentence_labels[label_node, label_position] = np.concatenate([np.zeros(0, np.int64), *labels])

    offsets = np.cumsum([0] + [g.num_nodes for g in graphs])
    edges = [np.asarray(g.edges, np.int64).reshape(-1, 2) + offsets[k] for k, g in enumerate(graphs)]
    answer = np.full((len(graphs), 3), -1, np.int64)
    for k, g in enumerate(graphs):
        spans = np.asarray(g.answer_spans, np.int64).reshape(-1, 3)
        if len(spans) and spans[0, 0] >= 0:
            answer[k] = (spans[0, 0] + offsets[k], spans[0, 1], spans[0, 2])

    def per_node(name: str) -> torch.Tensor:
        return torch.from_numpy(np.concatenate([np.asarray(getattr(g, name), np.int64).reshape(-1) for g in graphs]))

    def per_graph(name: str) -> np.ndarray:
        return np.array([int(getattr(g, name)) for g in graphs], dtype=np.int64)

    node_relevance = np.concatenate([np.asarray(g.node_relevance, np.int64).reshape(-1) for g in graphs])
    graph_labels = {name: per_graph(name) for name in ("answer_type", "question_type", "claim_label")}
    label_counts = count_labels(
        {"node_relevance": node_relevance, "answer_node": answer[:, 0], "sentence_labels": sentence_labels}
        | graph_labels,
        token_arrays["sentence_ids"],
    )

    batch = GraphBatch(
        input_ids=torch.from_numpy(token_arrays["input_ids"]),
        attention_mask=torch.from_numpy(token_arrays["attention_mask"]),
        token_type_ids=torch.from_numpy(token_arrays["token_type_ids"]),
        paragraph_mask=torch.from_numpy(token_arrays["paragraph_mask"]),
        sentence_ids=torch.from_numpy(token_arrays["sentence_ids"]),
        node_graph=torch.from_numpy(np.repeat(np.arange(len(graphs)), [g.num_nodes for g in graphs])),
        edges=torch.from_numpy(np.concatenate(edges).T.copy()),
        graph_offsets=torch.from_numpy(offsets.astype(np.int64)),
        num_sentences=per_node("num_sentences"),
        node_relevance=torch.from_numpy(node_relevance),
        node_has_answer=per_node("node_has_answer"),
        sentence_labels=torch.from_numpy(sentence_labels),
        answer_node=torch.from_numpy(answer[:, 0].copy()),
        answer_start=torch.from_numpy(answer[:, 1].copy()),
        answer_end=torch.from_numpy(answer[:, 2].copy()),
        answer_type=torch.from_numpy(graph_labels["answer_type"]),
        question_type=torch.from_numpy(graph_labels["question_type"]),
        claim_label=torch.from_numpy(graph_labels["claim_label"]),
        edge_types=torch.from_numpy(
            np.concatenate(
                [
                    np.full(len(e), -1, np.int64) if g.edge_types is None else np.asarray(g.edge_types, np.int64)
                    for g, e in zip(graphs, edges)
                ]
            )
        ),
        label_counts=label_counts,
        real_tokens=int(sizes.sum()),
        **dict(zip(("hop_allowed", "hop_lonely"), map(torch.from_numpy, hop_mask(np.concatenate(edges), n)))),
    )
    batch.constants = head_constants(batch)
    return batch


def pack_batches(graphs: Sequence[EncodedGraph], max_padded_tokens: int) -> list[list[int]]:
    """Group graphs into batches whose padded size (nodes × longest node) stays within a token budget.

    Graphs are taken longest node first, so that graphs of similar lengths share a batch and little
    padding is wasted; a graph larger than the budget on its own gets a batch of its own.
    Returns graph indices per batch; every graph appears exactly once.
    """
    order = sorted(range(len(graphs)), key=lambda k: -max(len(ids) for ids in graphs[k].input_ids))
    batches: list[list[int]] = []
    current: list[int] = []
    nodes = longest = 0
    for k in order:
        g_nodes, g_longest = graphs[k].num_nodes, max(len(ids) for ids in graphs[k].input_ids)
        if current and (nodes + g_nodes) * max(longest, g_longest) > max_padded_tokens:
            batches.append(current)
            current, nodes, longest = [], 0, 0
        current.append(k)
        nodes, longest = nodes + g_nodes, max(longest, g_longest)
    if current:
        batches.append(current)
    return batches
