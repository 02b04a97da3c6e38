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

Labels of -1 are ignored. Every term is computed for every batch, as the mean over the labelled entries:
a sum weighted by 1/count (BCE; weights made on the host by `collate`), or the loss function's own mean
(cross-entropy, NLL), chosen by the count on the host (`GraphBatch.label_counts`); a sum when there are
none. So a term without labels is exactly 0 and still keeps its parameters in the autograd graph (DDP needs
every parameter in every step), nothing waits for the device, no division runs of its own, and `losses`
lists only the terms the batch has labels for.

Per-graph reductions (the node softmax of a graph, pooling, FEVER's mixture) are dense: a [G, N] matrix
of each graph's nodes, where the masked entries weigh exactly 0, and one softmax or product over it,
instead of scatters per segment: a few kernels whatever the graph sizes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from xh.model.batch import GraphBatch
from xh.model.encoder import cast, dropout

MASKED = -1e4  # logit of positions that may not be chosen; finite so that bf16 and softmax stay well-defined


def _linear(in_features: int, out_features: int, initializer_range: float) -> nn.Linear:
    layer = nn.Linear(in_features, out_features)
    nn.init.normal_(layer.weight, std=initializer_range)  # BERT's head initialisation
    nn.init.zeros_(layer.bias)
    return layer


def graph_log_softmax(node_logits: torch.Tensor, batch: GraphBatch) -> torch.Tensor:
    """[N] -> [G, N]: log-softmax over each graph's nodes; another graph's nodes get the lowest finite
    value (exactly 0 after exp, never NaN in a product with 0)."""
    member = batch.head_constants()["graph_member"]
    return torch.where(member, node_logits, torch.finfo(node_logits.dtype).min).log_softmax(-1)


def node_log_softmax(log_p: torch.Tensor, batch: GraphBatch) -> torch.Tensor:
    """[G, N] of `graph_log_softmax` -> [N]: each node's entry in its own graph's row."""
    return log_p.gather(0, batch.node_graph.unsqueeze(0)).squeeze(0)


def weighted_bce(logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy summed with weights 1/count on the labelled entries (`head_constants`): their
    mean, 0 when there are none."""
    return F.binary_cross_entropy_with_logits(logits, target, weight=weight, reduction="sum")


def mean_ce(logits: torch.Tensor, labels: torch.Tensor, count: int) -> torch.Tensor:
    """Cross-entropy averaged over the `count` labels that are not -1; 0 when there are none. The loss
    divides by its own count of labels (the same number), so no division runs of its own, either way."""
    return F.cross_entropy(logits, labels, ignore_index=-1, reduction="mean" if count else "sum")


def mean_nll(log_p: torch.Tensor, labels: torch.Tensor, count: int) -> torch.Tensor:
    """`mean_ce` of log-probabilities."""
    return F.nll_loss(log_p, labels, ignore_index=-1, reduction="mean" if count else "sum")


def present(terms: dict[str, torch.Tensor], counts: dict[str, int], kinds: dict[str, tuple]) -> dict[str, torch.Tensor]:
    """The terms whose labels the batch has (`kinds`: term -> the label counts that say so)."""
    return {name: value for name, value in terms.items() if any(counts[kind] for kind in kinds[name])}


class HotpotHeads(nn.Module):
    # the label count that says a batch has a term (node: relevance, or an answer node to rank first)
    KINDS = {"node": ("node", "span"), "span": ("span",), "answer_type": ("answer_type",), "sentence": ("sentence",)}

    def __init__(self, hidden_size: int, dropout: float = 0.1, initializer_range: float = 0.02):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.node = _linear(hidden_size, 1, initializer_range)
        self.span = _linear(hidden_size, 2, initializer_range)
        self.answer_type = _linear(hidden_size, 3, initializer_range)
        self.sentence = _linear(hidden_size, 1, initializer_range)

    def forward(self, hidden: torch.Tensor, batch: GraphBatch) -> dict[str, torch.Tensor]:
        tokens = dropout(self.dropout, hidden)
        # span scores over the tokens, node scores over the hubs: two products, where one over the tokens
        # for both cost two concatenations and, in backward, a gradient per view of its output
        span_logits = cast(self.span(tokens), torch.float32).masked_fill(batch.head_constants()["span_blocked"], MASKED)
        hubs = tokens[:, 0]
        node_logits = cast(self.node(hubs), torch.float32).squeeze(-1)
        node_log_p = graph_log_softmax(node_logits, batch)  # [G, N]
        # the graph's hubs pooled with the softmax of node_logits over the graph (relevant nodes speak for it)
        pooled = node_log_p.exp() @ cast(hubs, torch.float32)
        answer_type_logits = cast(self.answer_type(pooled), torch.float32)
        sentence_logits, sentence_mask = self.sentences(hidden, batch)
        return {
            "node_logits": node_logits,
            "start_logits": span_logits[..., 0],
            "end_logits": span_logits[..., 1],
            "answer_type_logits": answer_type_logits,
            "sentence_logits": sentence_logits,
            "sentence_mask": sentence_mask,
            "node_log_p": node_log_p,
            "span_logits": span_logits,
        }

    def sentences(self, hidden: torch.Tensor, batch: GraphBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Sentence logits [N, S] from the mean of each sentence's token states (one batched product of
        the batch's [N, S, L] token weights), MASKED where a node has no such sentence, and that mask."""
        constants = batch.head_constants()
        means = cast(constants["sentence_weights"], hidden.dtype) @ hidden
        logits = cast(self.sentence(dropout(self.dropout, means)), torch.float32).squeeze(-1)
        return logits.masked_fill(constants["sentence_blocked"], MASKED), constants["sentence_mask"]

    @classmethod
    def losses(cls, out: dict[str, torch.Tensor], batch: GraphBatch) -> dict[str, torch.Tensor]:
        return present(cls.terms(out, batch), batch.counts(), cls.KINDS)

    @staticmethod
    def terms(out: dict[str, torch.Tensor], batch: GraphBatch) -> dict[str, torch.Tensor]:
        """Every term, 0 where the batch has no labels for it."""
        counts, constants = batch.counts(), batch.head_constants()
        node_log_p = out.get("node_log_p")
        if node_log_p is None:  # outputs made elsewhere (tests change node_logits)
            node_log_p = graph_log_softmax(out["node_logits"], batch)
        relevance = weighted_bce(out["node_logits"], constants["relevance_target"], constants["relevance_weight"])
        # the answer node ranks first among its graph's nodes (decoding reads the span there)
        answer_node = mean_nll(node_log_p, batch.answer_node, counts["span"])
        # start and end on each graph's answer node: [N, L, 2] against [N, 2] positions, -1 (none) on the
        # other nodes (no gather of the answer rows: two operators fewer, forward and backward)
        span_logits = out.get("span_logits")
        if span_logits is None:  # outputs made elsewhere
            span_logits = torch.stack([out["start_logits"], out["end_logits"]], -1)
        return {
            "node": relevance + answer_node,
            # start and end of each answer: 2 x counts["span"] labels
            "span": mean_ce(span_logits, constants["span_targets"], counts["span"]),
            "answer_type": mean_ce(out["answer_type_logits"], batch.answer_type, counts["answer_type"]),
            "sentence": weighted_bce(
                out["sentence_logits"], constants["sentence_target"], constants["sentence_weight"]
            ),
        }


class FeverHeads(nn.Module):
    KINDS = {"claim": ("claim",), "evidence": ("node",)}

    def __init__(self, hidden_size: int, dropout: float = 0.1, initializer_range: float = 0.02, num_labels: int = 3):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.node = _linear(hidden_size, 1, initializer_range)
        self.label = _linear(hidden_size, num_labels, initializer_range)

    def forward(self, hidden: torch.Tensor, batch: GraphBatch) -> dict[str, torch.Tensor]:
        hub = dropout(self.dropout, hidden[:, 0])
        # node importance and per-node labels in one product: [N, 1 + labels]
        weight, bias = torch.cat([self.node.weight, self.label.weight]), torch.cat([self.node.bias, self.label.bias])
        logits = cast(F.linear(hub, weight, bias), torch.float32)
        node_logits, label_logits = logits[:, 0], logits[:, 1:]
        log_importance = graph_log_softmax(node_logits, batch)  # [G, N]
        # p(y) = Σ_τ p(s|τ) p(y|τ) in log space, over each graph's nodes
        claim_log_probs = (log_importance.unsqueeze(-1) + label_logits.log_softmax(-1)).logsumexp(1)
        return {
            "node_logits": node_logits,
            "label_logits": label_logits,
            "importance": node_log_softmax(log_importance, batch).exp(),
            "claim_log_probs": claim_log_probs,
        }

    @classmethod
    def losses(cls, out: dict[str, torch.Tensor], batch: GraphBatch) -> dict[str, torch.Tensor]:
        return present(cls.terms(out, batch), batch.counts(), cls.KINDS)

    @staticmethod
    def terms(out: dict[str, torch.Tensor], batch: GraphBatch) -> dict[str, torch.Tensor]:
        counts, constants = batch.counts(), batch.head_constants()
        return {
            "claim": mean_nll(out["claim_log_probs"], batch.claim_label, counts["claim"]),
            "evidence": weighted_bce(out["node_logits"], constants["relevance_target"], constants["relevance_weight"]),
        }
