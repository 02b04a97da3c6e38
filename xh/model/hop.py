"""Extra hop attention (Transformer-XH, Zhao et al. 2020, Eq. 7-9) between the [CLS] hubs of graph nodes.

Every node of an evidence graph is one sequence; after each of the encoder's last K layers, the hub
(position 0) of each node attends to the hubs of its in-neighbours, and the hub is replaced by a
fusion of what it had and what it gathered. All other tokens keep the layer's output (Eq. 9).

    graph = HopGraph.build(edges, num_nodes=N, isolated_nodes="self_loop")   # edges [2, E] (src, dst)
    step = HopStep(hidden_size=384, heads=12, variant="paper")
    hidden = step(hidden, graph)                                              # [N, L, H] -> [N, L, H]

    layers = find_encoder_layers(backbone)          # the nn.ModuleList of any BERT-family encoder
    handles = attach_hop_steps(layers, steps, get_graph)   # forward hooks on the last len(steps) layers

Two attention variants:
- `paper` (default), Eq. 7: multi-head scaled dot-product, own query/key/value projections, softmax over
  the destination node's in-edges: ĥ_τ = Σ_η softmax_η(q̂_τ·k̂_η / √d) v̂_η.
- `gat`, the original release (a DGL GAT): each head reads its d = H/heads slice of the hub; one d×d
  projection shared by all heads serves as key and value; score LeakyReLU(0.2)(a_src·f_η + a_dst·f_τ);
  output ReLU(Σ α f_η + residual projection). The release used no self-loops and no dropout
  (set `hop_dropout=0` to match).

Fusion, Eq. 8: hub ← Linear([h ; ĥ]) (2H → H). `fusion_init="identity"` starts it at [I, 0] plus
N(0, initializer_range) noise, so that step 0 keeps the pretrained hub while every hop parameter still
gets a gradient; `"random"` is the release's plain N(0, initializer_range) (it discards the
pretrained hub until training rebuilds it).

A node without in-neighbours: `isolated_nodes="self_loop"` gives it one edge to itself (its hop
vector is then its own value, as the release's DGL graph kept a node's own features), `"zero"`
gives it ĥ = 0. Nodes that have in-neighbours never get a self-loop added.

Many graphs share one batch: edges are batch-global node indices and the softmax runs per
destination node, so no attention crosses graphs. Pure torch (index_add_ / scatter_reduce).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Literal

import torch
from torch import nn

from xh.model.scatter import segment_softmax, segment_sum

HopVariant = Literal["paper", "gat"]


@dataclass
class HopGraph:
    """Edges along which hubs attend: the hub of dst[e] gathers from the hub of src[e]."""

    src: torch.Tensor  # int64 [E]
    dst: torch.Tensor  # int64 [E]
    num_nodes: int
    # Filled by each HopStep that runs on this graph: its attention weights [E, heads], detached.
    attention: list[torch.Tensor] = field(default_factory=list)

    @classmethod
    def build(
        cls, edges: torch.Tensor, num_nodes: int, isolated_nodes: Literal["self_loop", "zero"] = "self_loop"
    ) -> HopGraph:
        """edges [2, E] of (src, dst); adds a self-loop to each node without in-edges when asked to."""
        src, dst = edges[0].long(), edges[1].long()
        if isolated_nodes == "self_loop":
            in_degree = torch.bincount(dst, minlength=num_nodes)
            lonely = torch.nonzero(in_degree == 0).flatten()
            src, dst = torch.cat([src, lonely]), torch.cat([dst, lonely])
        elif isolated_nodes != "zero":
            raise ValueError(f"isolated_nodes must be 'self_loop' or 'zero', not {isolated_nodes!r}")
        return cls(src=src, dst=dst, num_nodes=num_nodes)


class DotProductHopAttention(nn.Module):
    """Paper Eq. 7: multi-head scaled dot-product attention of each hub over its in-neighbours' hubs."""

    def __init__(self, hidden_size: int, heads: int, dropout: float = 0.0):
        super().__init__()
        if hidden_size % heads:
            raise ValueError(f"hop heads ({heads}) must divide the hidden size ({hidden_size})")
        self.heads, self.head_size = heads, hidden_size // heads
        self.query = nn.Linear(hidden_size, hidden_size)
        self.key = nn.Linear(hidden_size, hidden_size)
        self.value = nn.Linear(hidden_size, hidden_size)
        self.dropout = nn.Dropout(dropout)

    def forward(self, hubs: torch.Tensor, graph: HopGraph) -> tuple[torch.Tensor, torch.Tensor]:
        """hubs [N, H] -> (ĥ [N, H], attention weights [E, heads])."""
        n = hubs.shape[0]
        q, k, v = (proj(hubs).view(n, self.heads, self.head_size) for proj in (self.query, self.key, self.value))
        # Scores and weights in float32: the segment sums are short but bf16 would round the weights coarsely.
        scores = (q[graph.dst].float() * k[graph.src].float()).sum(-1) / math.sqrt(self.head_size)
        weights = segment_softmax(scores, graph.dst, n)
        gathered = segment_sum(self.dropout(weights).unsqueeze(-1) * v[graph.src].float(), graph.dst, n)
        return gathered.reshape(n, -1).to(hubs.dtype), weights


class GATHopAttention(nn.Module):
    """The original release's hop attention: a GAT layer over the hubs (see the module docstring)."""

    def __init__(self, hidden_size: int, heads: int, dropout: float = 0.0, negative_slope: float = 0.2):
        super().__init__()
        if hidden_size % heads:
            raise ValueError(f"hop heads ({heads}) must divide the hidden size ({hidden_size})")
        self.heads, self.head_size = heads, hidden_size // heads
        self.fc = nn.Linear(self.head_size, self.head_size, bias=False)  # key and value, shared by all heads
        self.res_fc = nn.Linear(self.head_size, self.head_size, bias=False)
        self.attn_src = nn.Parameter(torch.empty(1, heads, self.head_size))
        self.attn_dst = nn.Parameter(torch.empty(1, heads, self.head_size))
        for weight in (self.fc.weight, self.res_fc.weight, self.attn_src, self.attn_dst):
            nn.init.xavier_normal_(weight, gain=1.414)  # as in the release
        self.leaky_relu = nn.LeakyReLU(negative_slope)
        self.dropout = nn.Dropout(dropout)

    def forward(self, hubs: torch.Tensor, graph: HopGraph) -> tuple[torch.Tensor, torch.Tensor]:
        n = hubs.shape[0]
        per_head = hubs.view(n, self.heads, self.head_size)
        features = self.fc(per_head)  # [N, heads, d]
        score_src = (features * self.attn_src).sum(-1).float()
        score_dst = (features * self.attn_dst).sum(-1).float()
        weights = segment_softmax(self.leaky_relu(score_src[graph.src] + score_dst[graph.dst]), graph.dst, n)
        gathered = segment_sum(self.dropout(weights).unsqueeze(-1) * features[graph.src].float(), graph.dst, n)
        out = torch.relu(gathered.to(hubs.dtype) + self.res_fc(per_head).to(hubs.dtype))
        return out.reshape(n, -1), weights


class HopStep(nn.Module):
    """One hop step after one encoder layer: hop attention on the hubs, then Eq. 8 fusion into position 0."""

    def __init__(
        self,
        hidden_size: int,
        heads: int,
        variant: HopVariant = "paper",
        dropout: float = 0.0,
        fusion_init: Literal["identity", "random"] = "identity",
        initializer_range: float = 0.02,
    ):
        super().__init__()
        if variant == "paper":
            self.attention: nn.Module = DotProductHopAttention(hidden_size, heads, dropout)
            for proj in (self.attention.query, self.attention.key, self.attention.value):
                nn.init.normal_(proj.weight, std=initializer_range)  # BERT's initialisation
                nn.init.zeros_(proj.bias)
        elif variant == "gat":
            self.attention = GATHopAttention(hidden_size, heads, dropout)
        else:
            raise ValueError(f"hop variant must be 'paper' or 'gat', not {variant!r}")
        self.fusion = nn.Linear(2 * hidden_size, hidden_size)
        with torch.no_grad():
            nn.init.normal_(self.fusion.weight, std=initializer_range)
            nn.init.zeros_(self.fusion.bias)
            if fusion_init == "identity":
                self.fusion.weight[:, :hidden_size] += torch.eye(hidden_size)
            elif fusion_init != "random":
                raise ValueError(f"fusion_init must be 'identity' or 'random', not {fusion_init!r}")

    def forward(self, hidden_states: torch.Tensor, graph: HopGraph) -> torch.Tensor:
        """[N, L, H] -> [N, L, H] with a new hub at position 0 and every other token unchanged."""
        hub = hidden_states[:, 0]
        gathered, weights = self.attention(hub, graph)
        graph.attention.append(weights.detach())
        new_hub = self.fusion(torch.cat([hub, gathered], dim=-1)).to(hidden_states.dtype)
        return torch.cat([new_hub.unsqueeze(1), hidden_states[:, 1:]], dim=1)


def find_encoder_layers(backbone: nn.Module) -> nn.ModuleList:
    """The transformer layers of a BERT-family encoder: the ModuleList with num_hidden_layers entries.

    BERT, RoBERTa and ELECTRA keep them at `encoder.layer`, DistilBERT at `transformer.layer`; the
    search looks for the shape rather than a name so that any such encoder works.
    """
    expected = getattr(getattr(backbone, "config", None), "num_hidden_layers", None)
    for name, module in backbone.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) == expected and name:
            return module
    raise ValueError(
        f"{type(backbone).__name__}: no nn.ModuleList of config.num_hidden_layers={expected} encoder layers found"
    )


def _hop_hook(step: HopStep, get_graph: Callable[[], HopGraph | None], module, args, output):
    graph = get_graph()
    if graph is None:  # the backbone called on its own: plain layers
        return None
    if isinstance(output, tuple):  # older layer classes return (hidden_states, attentions...)
        return (step(output[0], graph), *output[1:])
    return step(output, graph)


def attach_hop_steps(
    layers: nn.ModuleList, steps: nn.ModuleList, get_graph: Callable[[], HopGraph | None]
) -> list[torch.utils.hooks.RemovableHandle]:
    """Run steps[i] after each of the last len(steps) layers, on the graph `get_graph()` returns.

    While `get_graph()` returns None the layers behave as the plain backbone.
    `get_graph` should be a bound method (or a partial of one) so that deepcopy and pickle follow the model.
    """
    if len(steps) > len(layers):
        raise ValueError(f"hop_layers={len(steps)} but the encoder has only {len(layers)} layers")
    first = len(layers) - len(steps)
    return [
        layers[first + i].register_forward_hook(partial(_hop_hook, step, get_graph)) for i, step in enumerate(steps)
    ]
