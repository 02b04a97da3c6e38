"""Token packing: the nodes of a batch laid end to end in rows of one fixed length, so that the encoder
computes few padding tokens and sees few distinct shapes.

    batch = pack(graphs, row_tokens=512, row_multiple=4)    # PackedBatch: collate(graphs) plus the row layout
    inputs = encoder_inputs(batch, backbone)                # what the backbone is called with: [R, T] rows
    hidden = node_states(batch, backbone(**inputs).last_hidden_state)   # [N, L, H], laid out as collate's
    graph = HopGraph.build(batch.edges, batch.num_nodes, graph_offsets=batch.graph_offsets,
                           hubs=hub_positions(batch))       # where each node's hub sits among the rows

    for graphs in fill_rows(graph_stream, rows=32, row_tokens=512):   # whole graphs, up to 32 rows each
        batch = pack(graphs, row_tokens=512, rows=32)                 # every batch [32, 512] (the last may be too)

Why. `collate` pads every node to the batch's longest node: on real HotpotQA distractor graphs, whose
node lengths vary widely, most of the computed tokens are padding, and batches come in many shapes (a
GPU pays for each new one; the figures: docs/results/training.md, training layouts). Here
the nodes are placed into rows of `row_tokens` tokens by first-fit decreasing; a row holds as many
nodes as fit, and the number of rows is rounded up to a multiple of `row_multiple` (or fixed with
`rows`), so the encoder sees [R, T] shapes from a small set whatever the node lengths.

Exactness. Each node keeps its own position ids (0, 1, ... from its hub), its token types, and a
block-diagonal attention mask lets a token attend only to tokens of its own node, so every node's
states are those the unpacked batch computes, up to float summation order (masked keys weigh exactly
0). The padding at the end of a row attends only to itself (a row of queries with no key allowed
would give NaN, which would then leak through the masked products). Graphs stay whole in a batch and
hop attention runs over hubs picked from the rows by position (`hub_positions`), so it is unchanged.

The mask is built on the device from the small [R, T] segment ids: boolean for `sdpa`, additive for
`eager` (the two attention functions transformers' BERT-family encoders use); absolute position
embeddings offset as RoBERTa's (padding_idx + 1) are handled. `flash_attention_2` takes no mask: refused.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields

import numpy as np
import torch
from torch import nn

from xh.graph.encoded import EncodedGraph
from xh.model.batch import GraphBatch, collate, round_up, token_places


@dataclass
class PackedBatch(GraphBatch):
    """A `GraphBatch` (node-major tensors for the heads and losses) plus the rows the encoder reads."""

    # Per row (R rows of T tokens):
    row_input_ids: torch.Tensor  # int64 [R, T]; padding = 0
    row_token_type_ids: torch.Tensor  # int64 [R, T]
    row_position_ids: torch.Tensor  # int64 [R, T]; each node counts from 0 at its hub
    row_segments: torch.Tensor  # int64 [R, T]; the node of a token, -1 - r on row r's padding
    # Per node: where its tokens sit in the flattened rows [R * T]:
    token_index: torch.Tensor  # int64 [N, L]; 0 beyond the node's length

    @property
    def encoder_shape(self) -> tuple[int, int]:
        return tuple(self.row_input_ids.shape)


def first_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Bins of item indices: longest item first, each into the first bin with room (ties keep input order).

    Items of one length are placed together: one pass over the bins, each taking as many of them as
    its room holds, which is where first fit would put them one by one. Nodes come in few lengths when
    they are short (many truncated alike), so a batch of hundreds of them costs a pass over the bins a
    length, not one an item: this runs several times a batch in the training process's own thread."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    if order and lengths[order[0]] > capacity:
        raise ValueError(f"an item of {lengths[order[0]]} does not fit a bin of {capacity}")
    bins: list[list[int]] = []
    room: list[int] = []
    for size, run in itertools.groupby(order, key=lengths.__getitem__):
        items = list(run)
        placed = 0
        for b, free in enumerate(room):
            if free >= size:
                count = min(free // size if size else len(items), len(items) - placed)
                bins[b] += items[placed : placed + count]
                room[b] = free - count * size
                placed += count
                if placed == len(items):
                    break
        while placed < len(items):
            count = min(capacity // size if size else len(items), len(items) - placed)
            bins.append(items[placed : placed + count])
            room.append(capacity - count * size)
            placed += count
    return bins


def pack(
    graphs: Sequence[EncodedGraph],
    row_tokens: int,
    row_multiple: int = 1,
    rows: int | None = None,
    length_multiple: int = 1,
) -> PackedBatch:
    """`collate(graphs)` plus the nodes packed into rows of `row_tokens` tokens (see the module docstring).

    Rows: as many as first-fit decreasing needs, rounded up to a multiple of `row_multiple`; with `rows`,
    exactly that many when the nodes fit (`fill_rows` chooses graphs that do; only a graph too large
    for `rows` on its own gets more, and a shape of its own). `length_multiple`: of the node-major
    tensors the heads read (`collate`'s)."""
    batch = collate(graphs, length_multiple)
    lengths = [len(ids) for g in graphs for ids in g.input_ids]
    if max(lengths) > row_tokens:
        raise ValueError(f"a node of {max(lengths)} tokens does not fit rows of row_tokens={row_tokens}")
    placement = first_fit_decreasing(lengths, row_tokens)
    num_rows = round_up(len(placement), row_multiple)
    if rows is not None and len(placement) <= rows:
        num_rows = rows

    # Each node's first flat index in the [R * T] rows, then every token's, for all nodes at once (a
    # batch of short nodes has hundreds); the tokens themselves are read from collate's [N, L] arrays.
    node_start = [0] * len(lengths)
    for r, row_nodes in enumerate(placement):
        start = r * row_tokens
        for n in row_nodes:
            node_start[n] = start
            start += lengths[n]
    node, position = token_places(np.asarray(lengths, np.int64))
    flat = np.asarray(node_start, np.int64)[node] + position

    input_ids = np.zeros((num_rows, row_tokens), np.int64)
    token_types = np.zeros((num_rows, row_tokens), np.int64)
    positions = np.zeros((num_rows, row_tokens), np.int64)
    segments = np.repeat(-1 - np.arange(num_rows, dtype=np.int64)[:, None], row_tokens, axis=1)
    token_index = np.zeros(tuple(batch.input_ids.shape), np.int64)
    input_ids.flat[flat] = batch.input_ids.numpy()[node, position]
    token_types.flat[flat] = batch.token_type_ids.numpy()[node, position]
    positions.flat[flat] = position
    segments.flat[flat] = node
    token_index[node, position] = flat
    return PackedBatch(
        **{f.name: getattr(batch, f.name) for f in fields(batch)},
        row_input_ids=torch.from_numpy(input_ids),
        row_token_type_ids=torch.from_numpy(token_types),
        row_position_ids=torch.from_numpy(positions),
        row_segments=torch.from_numpy(segments),
        token_index=torch.from_numpy(token_index),
    )


def fill_rows(
    graphs: Iterable[EncodedGraph], rows: int, row_tokens: int, lookahead: int = 4
) -> Iterator[list[EncodedGraph]]:
    """Group a stream of graphs into batches whose nodes fit `rows` rows of `row_tokens` (first-fit decreasing).

    Graphs stay whole and keep their stream order, except that when the next graph does not fit, up to
    `lookahead` later ones are tried before the batch is closed (the skipped ones lead the next batch).
    A graph too large for `rows` rows on its own gets a batch of its own (`pack` then needs more rows).

    A batch's run of consecutive graphs is found by galloping (a few packings of the whole candidate
    batch) rather than one packing per graph: that quadratic cost made batching, in the training
    process's own thread, slower than a GPU step.
    """
    filler = _RowFiller(iter(graphs), rows, row_tokens)
    while True:
        good = filler.longest_run()
        filler.take(good)
        filler.available(lookahead + 1)
        if not filler.waiting:
            break
        # the next graph does not fit: one of the few after it may (each tried on its own, in order)
        for k, graph in enumerate(filler.waiting[1 : lookahead + 1], start=1):
            candidate = filler.lengths + node_lengths(graph)
            if filler.fits(candidate):
                filler.batch.append(filler.waiting.pop(k))
                filler.lengths = candidate
                break
        else:  # nothing in the window fits: close the batch
            yield filler.batch
            filler.batch, filler.lengths = [], []
    if filler.batch:
        yield filler.batch


def node_lengths(graph: EncodedGraph) -> list[int]:
    return [len(ids) for ids in graph.input_ids]


@dataclass
class _RowFiller:
    """`fill_rows`'s state: the batch being filled, its node lengths, and the graphs read ahead."""

    stream: Iterator[EncodedGraph]
    rows: int
    row_tokens: int
    batch: list[EncodedGraph] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    waiting: list[EncodedGraph] = field(default_factory=list)

    def fits(self, lengths: list[int]) -> bool:
        capacity = self.rows * self.row_tokens
        return sum(lengths) <= capacity and len(first_fit_decreasing(lengths, self.row_tokens)) <= self.rows

    def available(self, count: int) -> int:
        """Read ahead until `count` graphs wait, or the stream ends; how many of them there are."""
        while len(self.waiting) < count:
            graph = next(self.stream, None)
            if graph is None:
                break
            self.waiting.append(graph)
        return min(count, len(self.waiting))

    def run_of(self, count: int) -> list[int]:
        """The batch's node lengths with the first `count` waiting graphs."""
        return self.lengths + [n for g in self.waiting[:count] for n in node_lengths(g)]

    def take(self, count: int) -> None:
        for graph in self.waiting[:count]:
            self.lengths += node_lengths(graph)
        self.batch += self.waiting[:count]
        del self.waiting[:count]

    def longest_run(self) -> int:
        """How many of the waiting graphs, in order, fit beside the batch (an empty batch takes one).

        Runs whose tokens exceed the rows' capacity cannot fit, so the search starts from the longest
        run within it, which first-fit decreasing nearly always packs, and gallops down from there."""
        capacity = self.rows * self.row_tokens
        good = 0 if self.batch else min(1, self.available(1))
        total = sum(self.run_of(good))
        bad = good
        while self.available(bad + 1) > bad:
            total += sum(node_lengths(self.waiting[bad]))
            bad += 1
            if total > capacity:
                break
        else:  # the stream ends within capacity: all of it may fit
            if bad == good or self.fits(self.run_of(bad)):
                return bad
        step = 1
        while bad - step > good:  # gallop down: the answer is nearly always within a graph or two
            if self.fits(self.run_of(bad - step)):
                good = bad - step
                break
            bad, step = bad - step, step * 2
        while bad - good > 1:  # run_of(good) fits, run_of(bad) does not
            middle = (good + bad) // 2
            good, bad = (middle, bad) if self.fits(self.run_of(middle)) else (good, middle)
        return good


def fill_rows_one_at_a_time(
    graphs: Iterable[EncodedGraph], rows: int, row_tokens: int, lookahead: int = 4
) -> Iterator[list[EncodedGraph]]:
    """`fill_rows`'s rule written plainly, one packing per graph: each graph in order joins the batch if
    the batch with it still packs into `rows`; if not, the first of the next `lookahead` that does; else
    the batch closes. The reference `fill_rows` must equal (tests) and the baseline `bench/train_input.py`
    measures it against."""
    batch: list[EncodedGraph] = []
    lengths: list[int] = []
    waiting: list[EncodedGraph] = []
    stream = iter(graphs)
    while True:
        while len(waiting) <= lookahead and (graph := next(stream, None)) is not None:
            waiting.append(graph)
        if not waiting:
            break
        for k, graph in enumerate(waiting):
            candidate = lengths + [len(ids) for ids in graph.input_ids]
            if not batch or len(first_fit_decreasing(candidate, row_tokens)) <= rows:
                batch.append(waiting.pop(k))
                lengths = candidate
                break
        else:
            yield batch
            batch, lengths = [], []
    if batch:
        yield batch


def hub_positions(batch: GraphBatch) -> torch.Tensor:
    """Flat positions of each node's hub in the encoder's token grid (`collate`'s: the start of each row)."""
    if isinstance(batch, PackedBatch):
        return batch.token_index[:, 0]
    rows, length = batch.input_ids.shape
    return torch.arange(rows, device=batch.input_ids.device) * length


def encoder_inputs(
    batch: GraphBatch, backbone: nn.Module, use_token_types: bool = True
) -> dict[str, torch.Tensor | None]:
    """Keyword arguments for `backbone(...)`: `collate`'s [N, L] node rows, or a packed batch's [R, T] rows."""
    if not isinstance(batch, PackedBatch):
        return {
            "input_ids": batch.input_ids,
            "attention_mask": batch.attention_mask,
            "token_type_ids": batch.token_type_ids if use_token_types else None,
        }
    implementation = getattr(backbone.config, "_attn_implementation", "eager")
    segments = batch.row_segments
    same_node = (segments.unsqueeze(-1) == segments.unsqueeze(-2)).unsqueeze(1)  # [R, 1, T(query), T(key)]
    if implementation == "sdpa":
        mask = same_node
    elif implementation == "eager":
        mask = torch.where(same_node, 0.0, torch.finfo(torch.float32).min)  # added to the scores
    else:
        raise ValueError(f"packed batches need attn_implementation 'sdpa' or 'eager', not {implementation!r}")
    # RoBERTa-style embeddings number positions from padding_idx + 1; BERT's from 0.
    padding_idx = getattr(getattr(backbone, "embeddings", None), "padding_idx", None)
    offset = 0 if padding_idx is None else padding_idx + 1
    return {
        "input_ids": batch.row_input_ids,
        "attention_mask": mask,
        "token_type_ids": batch.row_token_type_ids if use_token_types else None,
        "position_ids": batch.row_position_ids + offset if offset else batch.row_position_ids,  # an operator less
    }


def node_states(batch: GraphBatch, hidden: torch.Tensor) -> torch.Tensor:
    """The encoder's output as [N, L, H] node rows, as the heads read them.

    Beyond a node's length the rows hold copies of some token's state: like `collate`'s padding states,
    every head masks them out."""
    if not isinstance(batch, PackedBatch):
        return hidden
    return hidden.flatten(0, 1).index_select(0, batch.token_index.flatten()).view(*batch.token_index.shape, -1)
