"""The Transformer-XH model: hop attention over any BERT-family encoder, task heads, batching, decoding.

from xh.model import XHModel, collate, decode
model = XHModel.from_backbone(cfg.model)
batch = collate(graphs)                       # graphs: EncodedGraph (xh.graph.encode)
batch = pack(graphs, row_tokens=512)          # or: nodes packed into fixed-length rows (xh.model.packing)
out = model(batch)                            # out.loss, out.losses, logits
predictions = decode(graphs, batch, out, cfg.model.max_answer_tokens)
"""

from xh.model.batch import GraphBatch, collate, pack_batches
from xh.model.decode import decode
from xh.model.hop import HopGraph, HopStep
from xh.model.packing import PackedBatch, pack
from xh.model.xh import XHModel, XHOutput, load_tokenizer

__all__ = [
    "GraphBatch",
    "HopGraph",
    "HopStep",
    "PackedBatch",
    "XHModel",
    "XHOutput",
    "collate",
    "decode",
    "load_tokenizer",
    "pack",
    "pack_batches",
]
