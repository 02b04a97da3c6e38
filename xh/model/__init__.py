"""The Transformer-XH model: hop attention over any BERT-family encoder, task heads, batching, decoding.

from xh.model.xh import XHModel
from xh.model.batch import collate
from xh.model.decode import decode
model = XHModel.from_backbone(cfg.model)
batch = collate(graphs)                       # graphs: EncodedGraph (xh.graph.encode)
batch = pack(graphs, row_tokens=512)          # or: nodes packed into fixed-length rows (xh.model.packing)
out = model(batch)                            # out.loss, out.losses, logits
predictions = decode(graphs, batch, out, cfg.model.max_answer_tokens)
"""
