"""Task heads on top of the XH encoder, and their losses.

    heads = HotpotHeads(hidden_size=384, dropout=0.1)
    out = heads(hidden_states, batch)          # dict of logits (float32)
    losses = heads.losses(out, batch)          # {"node": ..., "span": ..., ...}, only terms with labels

HotpotQA (`HotpotHeads`):
- node relevance: Linear on the final hub -> node_logits [N]; BCE against `node_relevance` (the nodes
  holding supporting facts), plus cross-entropy over each graph's nodes towards the answer node
  (answer_spans row 0): decoding takes the span from the top node, and for a bridge question both
  supporting nodes are relevant, so the BCE alone would not say which of them holds the answer
  (the original release trained this head on the answer node, `is_ans`).
- answer span: Linear on every token -> start/end logits [N, L], masked to paragraph tokens (question,
  anchors and padding get MASKED); cross-entropy on the answer node's row (answer_spans row 0).
- answer type (span / yes / no): Linear on the graph's hubs pooled with the softmax of node_logits over
  the graph (the relevant nodes speak for the graph) -> [G, 3]; cross-entropy against `answer_type`.
- supporting sentences: Linear on the mean of each sentence's token states -> [N, S] (S = most sentences
  of a node in the batch; MASKED where a node has no such sentence); BCE against `sentence_labels`.

FEVER (`FeverHeads`):
- node importance p(s|τ): softmax over the graph's nodes of node_logits (Linear on the hub).
- per-node label distribution p(y|τ): Linear on the hub -> label_logits [N, 3].
- claim distribution p(y) = Σ_τ p(s|τ) p(y|τ), kept in log space: claim_log_probs [G, 3] =
  logsumexp_τ(log p(s|τ) + log p(y|τ)). Claim loss = NLL of the gold label under that mixture (the
  original release applied cross-entropy to these probabilities, a second softmax; not here).
  Evidence loss = BCE of node_logits against `node_relevance` (gold evidence sentences), as the release.

Labels of -1 are ignored; a loss term whose labels are all unknown is left out of the dict.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from xh.model.batch import GraphBatch
from xh.model.scatter import segment_log_softmax, segment_logsumexp, segment_softmax, segment_sum

MASKED = -1e4  # logit of positions that may not be chosen; finite so that bf16 and softmax stay well-defined


def _linear(in_features: int, out_features: int, initializer_range: float) -> nn.Linear:
    layer = nn.Linear(in_features, out_features)
    nn.init.normal_(layer.weight, std=initializer_range)  # BERT's head initialisation
    nn.init.zeros_(layer.bias)
    return layer


class HotpotHeads(nn.Module):
    def __init__(self, hidden_size: int, dropout: float = 0.1, initializer_range: float = 0.02):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.node = _linear(hidden_size, 1, initializer_range)
        self.span = _linear(hidden_size, 2, initializer_range)
        self.answer_type = _linear(hidden_size, 3, initializer_range)
        self.sentence = _linear(hidden_size, 1, initializer_range)

    def forward(self, hidden: torch.Tensor, batch: GraphBatch) -> dict[str, torch.Tensor]:
        n, length, _ = hidden.shape
        graphs = batch.num_graphs
        hub = self.dropout(hidden[:, 0])
        node_logits = self.node(hub).squeeze(-1).float()

        start_logits, end_logits = self.span(self.dropout(hidden)).float().unbind(-1)
        start_logits = start_logits.masked_fill(~batch.paragraph_mask, MASKED)
        end_logits = end_logits.masked_fill(~batch.paragraph_mask, MASKED)

        node_weights = segment_softmax(node_logits, batch.node_graph, graphs)
        pooled = segment_sum(node_weights.unsqueeze(-1) * hub.float(), batch.node_graph, graphs)
        answer_type_logits = self.answer_type(pooled.to(hidden.dtype)).float()

        # Sentence vectors: mean of their tokens' states, gathered into slots node * S + sentence.
        s = batch.sentence_labels.shape[1]
        in_sentence = batch.sentence_ids >= 0
        slots = (torch.arange(n, device=hidden.device).unsqueeze(1) * s + batch.sentence_ids)[in_sentence]
        sums = segment_sum(hidden[in_sentence].float(), slots, n * s)
        counts = torch.bincount(slots, minlength=n * s)
        means = sums / counts.clamp(min=1).unsqueeze(-1)
        sentence_mask = (counts > 0).view(n, s)
        sentence_logits = self.sentence(self.dropout(means).to(hidden.dtype)).float().view(n, s)
        sentence_logits = sentence_logits.masked_fill(~sentence_mask, MASKED)
        return {
            "node_logits": node_logits,
            "start_logits": start_logits,
            "end_logits": end_logits,
            "answer_type_logits": answer_type_logits,
            "sentence_logits": sentence_logits,
            "sentence_mask": sentence_mask,
        }

    @staticmethod
    def losses(out: dict[str, torch.Tensor], batch: GraphBatch) -> dict[str, torch.Tensor]:
        losses: dict[str, torch.Tensor] = {}
        known = batch.node_relevance >= 0
        if known.any():
            losses["node"] = F.binary_cross_entropy_with_logits(
                out["node_logits"][known], batch.node_relevance[known].float()
            )
        has_span = batch.answer_node >= 0
        if has_span.any():
            rows = batch.answer_node[has_span]
            # the answer node ranks first among its graph's nodes (decoding reads the span there)
            log_p = segment_log_softmax(out["node_logits"], batch.node_graph, batch.num_graphs)
            answer_node_nll = -log_p[rows].mean()
            losses["node"] = losses["node"] + answer_node_nll if "node" in losses else answer_node_nll
            start = F.cross_entropy(out["start_logits"][rows], batch.answer_start[has_span])
            end = F.cross_entropy(out["end_logits"][rows], batch.answer_end[has_span])
            losses["span"] = (start + end) / 2
        known = batch.answer_type >= 0
        if known.any():
            losses["answer_type"] = F.cross_entropy(out["answer_type_logits"][known], batch.answer_type[known])
        # A labelled sentence whose tokens were all truncated away has no vector: it is not scored.
        known = (batch.sentence_labels >= 0) & out["sentence_mask"]
        if known.any():
            losses["sentence"] = F.binary_cross_entropy_with_logits(
                out["sentence_logits"][known], batch.sentence_labels[known].float()
            )
        return losses


class FeverHeads(nn.Module):
    def __init__(self, hidden_size: int, dropout: float = 0.1, initializer_range: float = 0.02, num_labels: int = 3):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.node = _linear(hidden_size, 1, initializer_range)
        self.label = _linear(hidden_size, num_labels, initializer_range)

    def forward(self, hidden: torch.Tensor, batch: GraphBatch) -> dict[str, torch.Tensor]:
        hub = self.dropout(hidden[:, 0])
        node_logits = self.node(hub).squeeze(-1).float()
        label_logits = self.label(hub).float()
        log_importance = segment_log_softmax(node_logits, batch.node_graph, batch.num_graphs)
        claim_log_probs = segment_logsumexp(
            log_importance.unsqueeze(-1) + label_logits.log_softmax(-1), batch.node_graph, batch.num_graphs
        )
        return {
            "node_logits": node_logits,
            "label_logits": label_logits,
            "importance": log_importance.exp(),
            "claim_log_probs": claim_log_probs,
        }

    @staticmethod
    def losses(out: dict[str, torch.Tensor], batch: GraphBatch) -> dict[str, torch.Tensor]:
        losses: dict[str, torch.Tensor] = {}
        known = batch.claim_label >= 0
        if known.any():
            losses["claim"] = F.nll_loss(out["claim_log_probs"][known], batch.claim_label[known])
        known = batch.node_relevance >= 0
        if known.any():
            losses["evidence"] = F.binary_cross_entropy_with_logits(
                out["node_logits"][known], batch.node_relevance[known].float()
            )
        return losses
