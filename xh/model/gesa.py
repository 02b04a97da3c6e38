"""GESA-style typed hop attention: Transformer-XH's hop step with relation labels on the edges.

GESA (Foolad & Kiani 2023, Eq. 1) adds a learned relative-position vector r_ij, chosen by the *type* of
relation between tokens i and j, to the key of each attention score, and gives entity-to-entity
attention a query projection of its own, initialised from the pretrained W^Q:

    a_ij = softmax_j( x_i W^Q_e2e · (x_j W^K + r_ij) / √d ),   y_i = Σ_j a_ij x_j W^V          (GESA Eq. 1)

Here the "entities" are the node hubs of an evidence graph (GESA runs on LUKE's entity tokens; no LUKE
checkpoint reaches these machines), the entity graph is the evidence graph, and the attention is
XH's hop attention (XH Eq. 7) with typed edges; the hub is then fused as in XH Eq. 8:

    score_e = q_dst · (k_src + r_type(e)) / √d            per head, for every edge e = (src -> dst)
    ĥ_τ     = Σ_{e into τ} softmax_e(score_e) v_src        softmax over each destination's in-edges
    hub_τ  ← Linear([h_τ ; ĥ_τ])                           XH Eq. 8; all other tokens unchanged (Eq. 9)

Edge types (`EDGE_TYPES`: hyperlink, reverse_hyperlink, co_retrieved, comparison, self) are the graph's
(`xh.graph.typed`): graph building writes them beside the edges; here each type gets a learned vector.

    graph = TypedHopGraph.build(edges, edge_type, num_nodes=N)            # edge_type: xh.graph.typed.edge_type_ids            # edges [2, E] (src, dst)
    step = GESAHopStep(hidden_size=384, heads=12)
    step.copy_pretrained(**self_attention_projections(layer))             # W^Q_e2e (and W^K, W^V) from BERT
    hidden = step(hidden, graph)                                          # [N, L, H] -> [N, L, H]

With every type vector zero and the same q/k/v/fusion weights, `GESAHopStep` computes exactly what
`HopStep(variant="paper")` computes (tested). The type vectors start at zero: before training, the
typed step is XH's attention with these q/k/v.

Optionally the in-node token attention also gets relation labels between each hub and its node's
tokens (GESA's w2e / e2w labels): `relation_attention(q, k, v, labels, relations)` is one layer's
attention with `q_i · (k_j + r_label(ij))`; `hub_relation_labels` derives the labels from a batch
(question / anchor / paragraph tokens), `hub_label_matrix` spreads them over row and column 0, and
`use_hub_relations(backbone, HubRelations(...), layers)` makes a transformers backbone run it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from xh.graph.typed import EDGE_TYPES
from xh.model.hop import HopGraph, fusion_layer
from xh.model.packing import PackedBatch
from xh.model.scatter import segment_softmax, segment_sum

# Relation of a hub to a token of its own node (label 0 adds nothing to the score).
TOKEN_RELATIONS = ("none", "question", "anchor", "paragraph")


# --- typed hop attention --------------------------------------------------------------------------


@dataclass
class TypedHopGraph(HopGraph):
    """A `HopGraph` whose edges carry a type: edge_type[e] indexes EDGE_TYPES."""

    edge_type: torch.Tensor | None = None  # int64 [E]

    @classmethod
    def build(  # type: ignore[override]
        cls,
        edges: torch.Tensor,
        edge_type: torch.Tensor,
        num_nodes: int,
        isolated_nodes: Literal["self_loop", "zero"] = "self_loop",
        graph_offsets: torch.Tensor | None = None,
    ) -> TypedHopGraph:
        """edges [2, E] (src, dst) and their types [E]; a node without in-edges gets a `self` loop when asked to."""
        if edge_type.shape != edges[0].shape:
            raise ValueError(f"edge_type has shape {tuple(edge_type.shape)}, edges has {edges.shape[1]} edges")
        graph = HopGraph.build(edges, num_nodes, isolated_nodes, graph_offsets)
        loops = graph.src.numel() - edge_type.numel()  # HopGraph.build appends the self-loops last
        self_type = torch.full((loops,), EDGE_TYPES.index("self"), dtype=torch.long, device=edge_type.device)
        fields = {f.name: getattr(graph, f.name) for f in dataclasses.fields(HopGraph)}
        return cls(**fields, edge_type=torch.cat([edge_type.long(), self_type]))


class TypedHopAttention(nn.Module):
    """score_e = q_dst · (k_src + r_type(e)) / √d per head, softmax over each destination's in-edges."""

    def __init__(self, hidden_size: int, heads: int, num_edge_types: int = len(EDGE_TYPES), dropout: float = 0.0):
        super().__init__()
        if hidden_size % heads:
            raise ValueError(f"hop heads ({heads}) must divide the hidden size ({hidden_size})")
        self.heads, self.head_size = heads, hidden_size // heads
        self.query = nn.Linear(hidden_size, hidden_size)  # hub-to-hub query: GESA's W^Q_e2e
        self.key = nn.Linear(hidden_size, hidden_size)
        self.value = nn.Linear(hidden_size, hidden_size)
        # One relative-position vector per edge type, split over the heads like the keys; zero at the
        # start, so that the untrained step is XH's attention and the types are learned from there.
        self.relation = nn.Parameter(torch.zeros(num_edge_types, hidden_size))
        self.dropout = nn.Dropout(dropout)

    def forward(self, hubs: torch.Tensor, graph: TypedHopGraph) -> tuple[torch.Tensor, torch.Tensor]:
        """hubs [N, H] -> (ĥ [N, H], attention weights [E, heads])."""
        if graph.edge_type is None:
            raise ValueError("typed hop attention needs a TypedHopGraph with edge_type")
        n = hubs.shape[0]
        q, k, v = (proj(hubs).view(n, self.heads, self.head_size) for proj in (self.query, self.key, self.value))
        r = self.relation.view(-1, self.heads, self.head_size)[graph.edge_type]  # [E, heads, d]
        keys = k[graph.src].float() + r.float()
        scores = (q[graph.dst].float() * keys).sum(-1) / math.sqrt(self.head_size)
        weights = segment_softmax(scores, graph.dst, n)
        gathered = segment_sum(self.dropout(weights).unsqueeze(-1) * v[graph.src].float(), graph.dst, n)
        return gathered.reshape(n, -1).to(hubs.dtype), weights


class GESAHopStep(nn.Module):
    """`HopStep` with typed hop attention: same call, same parameter names, plus `attention.relation`."""

    def __init__(
        self,
        hidden_size: int,
        heads: int,
        num_edge_types: int = len(EDGE_TYPES),
        dropout: float = 0.0,
        fusion_init: Literal["identity", "random"] = "identity",
        initializer_range: float = 0.02,
    ):
        super().__init__()
        self.attention = TypedHopAttention(hidden_size, heads, num_edge_types, dropout)
        for proj in (self.attention.query, self.attention.key, self.attention.value):
            nn.init.normal_(proj.weight, std=initializer_range)  # BERT's; copy_pretrained may replace them
            nn.init.zeros_(proj.bias)
        self.fusion = fusion_layer(hidden_size, fusion_init, initializer_range)  # XH Eq. 8, as HopStep

    @torch.no_grad()
    def copy_pretrained(
        self, query: nn.Linear | None = None, key: nn.Linear | None = None, value: nn.Linear | None = None
    ) -> None:
        """Start the hub-to-hub projections as copies of a pretrained layer's (GESA §4.1 copies W^Q)."""
        for mine, given in ((self.attention.query, query), (self.attention.key, key), (self.attention.value, value)):
            if given is None:
                continue
            if given.weight.shape != mine.weight.shape:
                raise ValueError(f"pretrained projection {tuple(given.weight.shape)} != {tuple(mine.weight.shape)}")
            mine.weight.copy_(given.weight)
            if given.bias is not None:
                mine.bias.copy_(given.bias)

    def forward(self, hidden_states: torch.Tensor, graph: TypedHopGraph) -> torch.Tensor:
        """[N, L, H] -> [N, L, H] with a new hub at position 0 and every other token unchanged."""
        # outside autocast, in the parameters' dtype, as HopStep
        with torch.autocast(hidden_states.device.type, enabled=False):
            hub = hidden_states[:, 0].to(self.fusion.weight.dtype)
            gathered, weights = self.attention(hub, graph)
            new_hub = self.fusion(torch.cat([hub, gathered], dim=-1))
        graph.attention.append(weights.detach())
        return torch.cat([new_hub.to(hidden_states.dtype).unsqueeze(1), hidden_states[:, 1:]], dim=1)


# --- wiring into XHModel (`model.hop_variant: gesa`) ----------------------------------------------


def gesa_hop_steps(cfg, backbone: nn.Module, layers: nn.ModuleList) -> tuple[nn.ModuleList, HubRelations | None]:
    """XHModel's hop steps for `hop_variant: gesa` (`cfg`: ModelConfig): one GESAHopStep after each of the
    last K layers, its hub-to-hub q/k/v copied from that layer's pretrained attention (GESA §4.1), and,
    with `cfg.hub_relations`, the hub-token relation vectors on those layers' token attention."""
    config = backbone.config
    heads = cfg.hop_heads or config.num_attention_heads
    steps = nn.ModuleList(
        GESAHopStep(
            config.hidden_size,
            heads,
            dropout=cfg.hop_dropout,
            fusion_init=cfg.hop_fusion_init,
            initializer_range=getattr(config, "initializer_range", 0.02),
        )
        for _ in range(cfg.hop_layers)
    )
    hop_layers = list(layers)[len(layers) - cfg.hop_layers :]
    for step, layer in zip(steps, hop_layers):
        step.copy_pretrained(**self_attention_projections(layer))
    relations = None
    if cfg.hub_relations and cfg.hop_layers:
        size = config.hidden_size // config.num_attention_heads
        relations = HubRelations(cfg.hop_layers, config.num_attention_heads, size)
        use_hub_relations(backbone, relations, hop_layers)
    return steps, relations


class TypedHops:
    """The hop-variant interface of `XHModel` for `hop_variant: gesa` (`xh.model.hop.PlainHops` is XH's):
    GESAHopSteps, and per batch the typed graph and, with `model.hub_relations`, the hub-token labels
    that the hop layers' attention reads (`hub_relation_labels`, passed down with the layer call)."""

    def build(self, cfg, backbone: nn.Module, layers: nn.ModuleList) -> tuple[nn.ModuleList, HubRelations | None]:
        return gesa_hop_steps(cfg, backbone, layers)

    def inputs(self, batch, cfg, relations: HubRelations | None = None, tokenizer=None) -> tuple[TypedHopGraph, dict]:
        if isinstance(batch, PackedBatch):
            raise ValueError("model.hop_variant=gesa reads hubs at row starts: use train.batching=graphs")
        if (batch.edge_types < 0).any():
            raise ValueError("model.hop_variant=gesa needs typed edges: build the graphs with graphs.edge_mode=typed")
        graph = TypedHopGraph.build(
            batch.edges, batch.edge_types, batch.num_nodes, cfg.isolated_nodes, batch.graph_offsets
        )
        if relations is None:
            return graph, {}
        if tokenizer is None:
            raise ValueError("model.hub_relations needs the model's tokenizer (its separator token)")
        labels = hub_relation_labels(
            batch.input_ids, batch.token_type_ids, batch.attention_mask, tokenizer.sep_token_id
        )
        return graph, {"hub_relation_labels": hub_label_matrix(labels)}


def self_attention_projections(layer: nn.Module) -> dict[str, nn.Linear]:
    """The query / key / value Linear layers of one BERT-family encoder layer (BERT, RoBERTa, ELECTRA:
    `attention.self.query`; DistilBERT: `attention.q_lin`), for `GESAHopStep.copy_pretrained`."""
    found: dict[str, nn.Linear] = {}
    for name, module in layer.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        for role, names in (("query", ("query", "q_lin")), ("key", ("key", "k_lin")), ("value", ("value", "v_lin"))):
            if leaf in names and isinstance(module, nn.Linear) and role not in found:
                found[role] = module
    if len(found) != 3:
        raise ValueError(f"{type(layer).__name__}: no query/key/value projections found")
    return found


# --- relation labels inside a node (the optional switch) ------------------------------------------


def hub_relation_labels(
    input_ids: torch.Tensor, token_type_ids: torch.Tensor, attention_mask: torch.Tensor, sep_token_id: int
) -> torch.Tensor:
    """int64 [N, L]: each token's relation to its node's hub, an index into TOKEN_RELATIONS.

    Node layout `[CLS] question [SEP] anchor [SEP] ... paragraph [SEP]`: tokens before the first
    separator are the question, side-A tokens after it are anchors (the texts that mention this
    node's page: GESA's entity-mention label), side B is the paragraph; the hub, separators and
    padding are `none`.
    """
    is_sep = input_ids == sep_token_id
    after_first_sep = (torch.cumsum(is_sep.long(), dim=1) - is_sep.long()) > 0
    real = attention_mask.bool() & ~is_sep
    real[:, 0] = False  # the hub itself
    side_a = token_type_ids == 0
    labels = torch.zeros_like(input_ids, dtype=torch.long)
    labels[real & side_a & ~after_first_sep] = TOKEN_RELATIONS.index("question")
    labels[real & side_a & after_first_sep] = TOKEN_RELATIONS.index("anchor")
    labels[real & ~side_a] = TOKEN_RELATIONS.index("paragraph")
    return labels


def hub_label_matrix(hub_labels: torch.Tensor) -> torch.Tensor:
    """[N, L] -> [N, L, L]: label (i=0, j) and (i=j, 0) = hub_labels[j] (hub-to-token and token-to-hub), 0 elsewhere."""
    n, length = hub_labels.shape
    labels = hub_labels.new_zeros((n, length, length))
    labels[:, 0, :] = hub_labels
    labels[:, :, 0] = hub_labels
    return labels


def relation_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    labels: torch.Tensor,
    relations: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    scaling: float | None = None,
    dropout: float = 0.0,
    training: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's self-attention with relation labels (GESA Eq. 1): q_i · (k_j + r_label(ij)) · scaling.

    query, key, value: [N, heads, L, d] (as a transformers attention function receives them);
    labels: int [N, L, L], 0 = no relation (adds nothing); relations: [R, heads, d] (row 0 unused);
    attention_mask: additive, broadcastable to [N, heads, L, L]. Returns (output [N, L, heads, d],
    weights [N, heads, L, L]): the shapes of transformers' `eager_attention_forward`, so it can be
    registered as an attention function.
    """
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    scores = torch.matmul(query, key.transpose(-1, -2))
    # q_i · r_l for every relation l, then pick l = labels[i, j]: [N, heads, L, R] -> [N, heads, L, L]
    q_dot_r = torch.einsum("nhid,rhd->nhir", query, relations.to(query.dtype))
    index = labels.unsqueeze(1).expand(-1, query.shape[1], -1, -1)
    extra = q_dot_r.gather(-1, index).masked_fill(index == 0, 0.0)
    scores = (scores + extra) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = torch.softmax(scores.float(), dim=-1).to(query.dtype)
    weights = nn.functional.dropout(weights, p=dropout, training=training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


# --- wiring the relation labels into a transformers backbone --------------------------------------

HUB_RELATION_ATTENTION = "xh_hub_relations"


class HubRelations(nn.Module):
    """Relation vectors of the hub-token labels for some attention layers of a backbone. The backbone runs
    `hub_relation_attention_forward` (see `use_hub_relations`); the labels of a batch come with the call,
    as the keyword `hub_relation_labels` that transformers hands down to each layer's attention function.
    Layers it was not attached to, or a call without labels, compute plain eager attention.

        relations = HubRelations(num_layers=3, heads=12, head_size=32)
        use_hub_relations(backbone, relations, layers[-3:])
        labels = hub_label_matrix(hub_relation_labels(ids, token_types, mask, sep_id))
        out = backbone(input_ids=ids, attention_mask=mask, hub_relation_labels=labels)
    """

    def __init__(self, num_layers: int, heads: int, head_size: int, num_relations: int = len(TOKEN_RELATIONS)):
        super().__init__()
        self.vectors = nn.Parameter(torch.zeros(num_layers, num_relations, heads, head_size))  # zero: plain at start

    def attach(self, attention_modules: list[nn.Module]) -> None:
        if len(attention_modules) != self.vectors.shape[0]:
            raise ValueError(
                f"{len(attention_modules)} attention modules for {self.vectors.shape[0]} layers of vectors"
            )
        for i, module in enumerate(attention_modules):
            # in __dict__, not as an attribute: the controller must not become a submodule of the backbone
            module.__dict__["hub_relations"] = (self, i)


def hub_relation_attention_forward(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0, hub_relation_labels=None, **kwargs
):
    """A transformers attention function (`AttentionInterface`): `relation_attention` with the call's
    `hub_relation_labels` [N, L, L] and this layer's vectors from its `HubRelations`; without either, the
    same computation without relations."""
    relations, layer = module.__dict__.get("hub_relations", (None, 0))
    n, heads, length, size = query.shape
    if relations is None or hub_relation_labels is None:
        labels = torch.zeros(n, length, length, dtype=torch.long, device=query.device)
        vectors = query.new_zeros(1, heads, size)
    else:
        labels, vectors = hub_relation_labels, relations.vectors[layer]
    return relation_attention(query, key, value, labels, vectors, attention_mask, scaling, dropout, module.training)


def use_hub_relations(backbone: nn.Module, relations: HubRelations, layers: list[nn.Module]) -> None:
    """Make `backbone` run `hub_relation_attention_forward`, with `relations` on the self-attention of `layers`.

    A custom attention function also needs a mask function registered under its name (without one,
    transformers passes no padding mask at all); the eager (additive) mask is the one it expects.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(HUB_RELATION_ATTENTION, hub_relation_attention_forward)
    AttentionMaskInterface.register(HUB_RELATION_ATTENTION, eager_mask)
    relations.attach([self_attention_module(layer) for layer in layers])
    backbone.set_attn_implementation(HUB_RELATION_ATTENTION)


def self_attention_module(layer: nn.Module) -> nn.Module:
    """The module of one encoder layer that owns the query projection (BERT: `attention.self`)."""
    query = self_attention_projections(layer)["query"]
    for module in layer.modules():
        if any(child is query for child in module.children()):
            return module
    raise ValueError(f"{type(layer).__name__}: no self-attention module found")
