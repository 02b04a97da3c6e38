"""Training batches from graph rows: made ahead of the step, in few shapes (`train.batching`).

    layout = BatchLayout.of(cfg)                        # graphs: collate; tokens: packed rows [R, T]
    with GraphEncoder(tokenizer, cfg.model.max_node_tokens, cfg.train.encode_processes) as encoder:
        batches = Prefetcher(layout.batches(encoder.map(chunks_of_rows), skip=k, limit=n), pin_memory=cuda)
        for batch in in_lockstep(batches, device) if layout.packed else batches:
            stats.add(batch)                            # BatchStats: shapes, real / computed tokens
    plan = step_plan(cfg, train_ds, num_train_graphs)   # on the driver: graph batches, or plan_token_batches

- `graphs`: `train.batch_graphs` graphs a batch (one chunk of rows each), `collate`d: every node is
  padded to the batch's longest node, so the encoder's [N, L] shape changes with nearly every batch.
- `tokens`: whole graphs, in stream order (`fill_rows`), packed into R = batch_tokens // T rows of
  T = max_node_tokens rounded up to a multiple of 64 (`xh.model.packing.pack`): the encoder sees one
  shape [R, T] (a graph too large for R rows alone gets rows of its own), and the node-major tensors
  the heads read are padded to a multiple of 64 tokens as well. Batches hold different numbers of
  graphs, so workers can run out at different batches: `in_lockstep` ends an epoch on every worker
  when one has none left (DDP's all-reduces must pair up), and the driver plans the steps from the
  packing of a sample (`plan_token_batches`).

Tokenizing happens in the prefetch thread (or `train.encode_processes` worker processes), not in the step.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial

import torch

from xh.config import ConfigError, XHConfig
from xh.graph.encoded import EncodedGraph
from xh.model.batch import GraphBatch, collate
from xh.model.packing import fill_rows, pack, round_up
from xh.train.worker import StepPlan, plan_steps

LENGTH_MULTIPLE = 64  # token lengths are padded to multiples of this: few shapes, each a whole number of tiles


@dataclass(frozen=True)
class BatchLayout:
    packed: bool
    batch_graphs: int  # graphs: graphs a batch
    rows: int  # tokens: encoder rows a batch
    row_tokens: int  # tokens: tokens a row

    @classmethod
    def of(cls, cfg: XHConfig) -> BatchLayout:
        row_tokens = round_up(cfg.model.max_node_tokens, LENGTH_MULTIPLE)
        rows = cfg.train.batch_tokens // row_tokens
        if cfg.train.batching == "tokens" and rows == 0:
            raise ConfigError(
                f"train.batch_tokens={cfg.train.batch_tokens} is less than one row of {row_tokens} tokens "
                f"(model.max_node_tokens={cfg.model.max_node_tokens} rounded up to {LENGTH_MULTIPLE})"
            )
        return cls(cfg.train.batching == "tokens", cfg.train.batch_graphs, rows, row_tokens)

    def make(self, graphs: Sequence[EncodedGraph]) -> GraphBatch:
        """One batch of these graphs in this layout."""
        if not self.packed:
            return collate(graphs)
        return pack(graphs, self.row_tokens, rows=self.rows, length_multiple=LENGTH_MULTIPLE)

    def eval_batcher(self):
        """How dev evaluation batches its graphs: packed like training (row count a multiple of 8), or collated."""
        if not self.packed:
            return collate
        return partial(pack, row_tokens=self.row_tokens, row_multiple=8, length_multiple=LENGTH_MULTIPLE)

    def groups(self, graphs: Iterable[list[EncodedGraph]]) -> Iterator[list[EncodedGraph]]:
        """Chunks of encoded graphs -> the graphs of each batch (graphs: a chunk is a batch)."""
        if not self.packed:
            return iter(graphs)
        return fill_rows(itertools.chain.from_iterable(graphs), self.rows, self.row_tokens)

    def batches(
        self, encoded: Iterable[list[EncodedGraph]], skip: int = 0, limit: int | None = None
    ) -> Iterator[GraphBatch]:
        """Batches from chunks of encoded graphs (`xh.graph.encode.GraphEncoder.map`): the first `skip`
        are left out (a resumed epoch), and at most `limit` are made."""
        for index, graphs in enumerate(self.groups(encoded)):
            if limit is not None and index >= limit:
                return
            if index >= skip:
                yield self.make(graphs)


@dataclass
class BatchStats:
    """What the encoder computed over some batches: distinct input shapes, real and computed tokens."""

    shapes: set = field(default_factory=set)
    real_tokens: int = 0
    computed_tokens: int = 0
    batches: int = 0

    def add(self, batch: GraphBatch) -> None:
        self.shapes.add(batch.encoder_shape)
        self.real_tokens += batch.num_real_tokens
        self.computed_tokens += math.prod(batch.encoder_shape)
        self.batches += 1

    @property
    def real_token_fraction(self) -> float:
        return self.real_tokens / max(self.computed_tokens, 1)


def in_lockstep(items: Iterable, device: torch.device) -> Iterator:
    """`items` while every DDP worker still has one: each worker says whether it has a next item (one
    all-reduce), and all stop at the first item some worker lacks. Without a process group: `items`."""
    import torch.distributed as dist

    items = iter(items)
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        yield from items
        return
    while True:
        item = next(items, None)
        have = torch.tensor([int(item is not None)], device=device)
        dist.all_reduce(have, op=dist.ReduceOp.MIN)
        if not int(have.item()):
            return
        yield item


def plan_token_batches(sample: Sequence[EncodedGraph], num_graphs: int, cfg: XHConfig) -> StepPlan:
    """The step plan of `batching=tokens`: batches an epoch estimated from the packing of `sample` (graphs in
    stream order: graphs per full batch), so that every worker has about that many; `in_lockstep` ends
    an epoch early if some worker has fewer."""
    layout = BatchLayout.of(cfg)
    groups = list(layout.groups([list(sample)]))
    if len(groups) > 1:  # the last batch is partly empty: the full ones say how many graphs fit
        graphs_per_batch = sum(len(g) for g in groups[:-1]) / (len(groups) - 1)
    else:  # the whole sample fits one batch: scale by tokens
        graphs_per_batch = len(sample) * layout.rows * layout.row_tokens / max(1, sum(g.num_tokens for g in sample))
    per_worker = int(num_graphs // cfg.train.workers / graphs_per_batch)
    return plan_steps(
        per_worker * cfg.train.workers,
        workers=cfg.train.workers,
        batch_size=1,
        grad_accum=cfg.train.grad_accum,
        epochs=cfg.train.epochs,
        max_steps=cfg.train.max_steps,
        unit=f"token batches ({num_graphs} graphs at about {graphs_per_batch:.1f} a batch)",
    )


def step_plan(cfg: XHConfig, train_ds, num_train: int, sample_size: int = 256) -> StepPlan:
    """The run's step plan: `batch_graphs` graphs a batch, or with `batching=tokens` the plan of how the first
    `sample_size` training graphs of the Ray dataset `train_ds` pack (`plan_token_batches`) alone:
    `batch_graphs` does not apply there, so it must not refuse a run."""
    if cfg.train.batching == "tokens":
        from xh.graph.encode import encode_graphs
        from xh.model.xh import load_tokenizer

        tokenizer = load_tokenizer(cfg.model.backbone)
        rows = train_ds.take_batch(min(sample_size, num_train), batch_format="pyarrow").to_pylist()
        return plan_token_batches(encode_graphs(rows, tokenizer, cfg.model.max_node_tokens), num_train, cfg)
    return plan_steps(
        num_train,
        workers=cfg.train.workers,
        batch_size=cfg.train.batch_graphs,
        grad_accum=cfg.train.grad_accum,
        epochs=cfg.train.epochs,
        max_steps=cfg.train.max_steps,
        unit="graphs",
    )
