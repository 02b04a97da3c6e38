"""Extra hop attention (Transformer-XH, Zhao et al. 2020, Eq. 7-9) between the [CLS] hubs of graph nodes.

Every node of an evidence graph is one sequence; after each of the encoder's last K layers, the hub
(position 0) of each node attends to the hubs of its in-neighbours, and the hub is replaced by a
fusion of what it had and what it gathered. All other tokens keep the layer's output (Eq. 9).

    graph = HopGraph.build(edges, num_nodes=N, isolated_nodes="self_loop")    # edges [2, E] (src, dst)
    graph = HopGraph.of_batch(batch, "self_loop", hubs=None)                  # the mask collate made
    step = HopStep(hidden_size=384, heads=12, variant="paper")
    hidden = step(hidden, graph)                                              # [N, L, H] -> [N, L, H]

    layers = find_encoder_layers(backbone)          # the nn.ModuleList of any BERT-family encoder
    # XHModel runs steps[i] after each of the last len(steps) layers (xh.model.xh)

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

One dense mask. The batch's hubs attend as one set under a boolean [N, N] mask (`allowed[d, s]`: node
d's hub attends to node s's), which `collate` makes on the host with the batch (`HopGraph.of_batch`;
`build` makes it from edges on the device). Edges never cross graphs, so neither does attention, and a
node without in-neighbours has its self-loop in the mask either way (the `zero` rule then sets its ĥ to
0): every row has a key, so the fused kernel never sees an empty row. In training, q, k and v come from
one product and attention is `scaled_dot_product_attention` (one kernel each way on a GPU); no weights
are kept.

Few operators a layer (each a kernel launch on a GPU, #39). The paper step's one product of the hubs
gives q, k, v and Eq. 8's hub half h W_h^T + b (the fusion's weight read as its two halves); the fusion
is then one addmm with ĥ. The hubs are taken from and put back into the token grid by `TakeHubs` and
`PutHubs`, whose backward writes the hubs' gradient into the tokens' in one operator. Both compute what
the concatenation, the Linear and autograd's gather and scatter computed, up to float summation order
(`tests/unit/model/test_hop_dense.py`). In eval (`graph.keep_attention`) the weights are computed explicitly and also returned per
edge, in the order of `graph.src`/`graph.dst` (self-loops last, a read-back), for `xh.train.figures`.
`tests/unit/model/test_hop_dense.py` keeps the per-edge form (gathers, a softmax and a sum per
destination) as the reference both must equal. The hop step runs outside autocast, in float32.

Where the hubs are: by default position 0 of each row of `hidden` (one node per row, as `collate`
lays them out); `hubs` gives flat positions in the [rows x row_length] token grid instead, for rows
that hold several nodes (`xh.model.packing`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from xh.model.encoder import Projection, cast, dropout, qkv_parts, qkv_projections, stacked_projections

HopVariant = Literal["paper", "gat"]


@dataclass
class HopGraph:
    """Edges along which hubs attend (the hub of dst[e] gathers from the hub of src[e]), as a dense mask."""

    edges: torch.Tensor  # int64 [2, E] of (src, dst), as given
    num_nodes: int
    allowed: torch.Tensor  # bool [N, N]; allowed[d, s]: the hub of node d attends to that of node s
    lonely: torch.Tensor  # bool [N]; nodes without in-edges (their self-loop is in `allowed` either way)
    isolated_nodes: str = "self_loop"
    hubs: torch.Tensor | None = None  # int64 [N]; flat hub positions in the token grid (None: row starts)
    # Set by the model in eval mode: each HopStep then computes its weights explicitly and appends them
    # here, [E, heads] detached, in the order of `src`/`dst` (training runs one fused attention kernel).
    keep_attention: bool = True
    attention: list[torch.Tensor] = field(default_factory=list)

    @classmethod
    def build(
        cls,
        edges: torch.Tensor,
        num_nodes: int,
        isolated_nodes: Literal["self_loop", "zero"] = "self_loop",
        graph_offsets: torch.Tensor | None = None,  # noqa: ARG003 (edges never cross graphs: the mask needs none)
        hubs: torch.Tensor | None = None,
    ) -> HopGraph:
        """edges [2, E] of (src, dst). A node without in-edges attends to itself: its value with
        `self_loop`, and with `zero` its ĥ is then set to 0 (the kernel needs one key per query)."""
        if isolated_nodes not in ("self_loop", "zero"):
            raise ValueError(f"isolated_nodes must be 'self_loop' or 'zero', not {isolated_nodes!r}")
        edges = edges.long()
        allowed = torch.zeros(num_nodes, num_nodes, dtype=torch.bool, device=edges.device)
        allowed = allowed.index_put_((edges[1], edges[0]), torch.tensor(True, device=edges.device))
        lonely = ~allowed.any(-1)
        allowed.diagonal().logical_or_(lonely)
        return cls(edges, num_nodes, allowed, lonely, isolated_nodes, hubs)

    @classmethod
    def of_batch(cls, batch, isolated_nodes: Literal["self_loop", "zero"], hubs: torch.Tensor | None) -> HopGraph:
        """The batch's graph, from the mask `collate` made on the host when it did (no operator here)."""
        if batch.hop_allowed is None:
            return cls.build(batch.edges, batch.num_nodes, isolated_nodes, hubs=hubs)
        if isolated_nodes not in ("self_loop", "zero"):
            raise ValueError(f"isolated_nodes must be 'self_loop' or 'zero', not {isolated_nodes!r}")
        return cls(batch.edges, batch.num_nodes, batch.hop_allowed, batch.hop_lonely, isolated_nodes, hubs)

    @functools.cached_property
    def self_loops(self) -> torch.Tensor:
        """The nodes given a self-loop edge (`self_loop` rule): a read-back from the device."""
        if self.isolated_nodes != "self_loop":
            return self.edges.new_zeros(0)
        return torch.nonzero(self.lonely).flatten()

    @property
    def src(self) -> torch.Tensor:
        """int64 [E']: the edges' sources, then the self-loops added for nodes without in-edges."""
        return torch.cat([self.edges[0], self.self_loops])

    @property
    def dst(self) -> torch.Tensor:
        return torch.cat([self.edges[1], self.self_loops])

    def edge_weights(self, weights: torch.Tensor) -> torch.Tensor:
        """Dense weights [heads, N(dst), N(src)] -> [E', heads], in the order of src/dst."""
        return weights[:, self.dst, self.src].T

    @functools.cached_property
    def allowed_from_others(self) -> torch.Tensor:
        """`allowed` without the self-loops of nodes without in-edges under the `zero` rule (their rows
        empty): made once a batch, not once a hop layer."""
        if self.isolated_nodes == "zero":
            return self.allowed & ~self.lonely.unsqueeze(-1)
        return self.allowed

    def zero_lonely(self, gathered: torch.Tensor) -> torch.Tensor:
        """ĥ [N, H] with the rows of nodes without in-edges set to 0 under the `zero` rule."""
        if self.isolated_nodes == "zero":
            return gathered.masked_fill(self.lonely.unsqueeze(-1), 0.0)
        return gathered


def masked_softmax(scores: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension among `allowed` entries; a row with none allowed gets all zeros.

    Masked scores are the dtype's lowest finite value rather than -inf, so an empty row is a finite
    uniform softmax that the final multiplication zeroes (-inf would give NaN, and NaN gradients)."""
    weights = torch.where(allowed, scores, torch.finfo(scores.dtype).min).softmax(-1)
    return weights * allowed


class DotProductHopAttention(nn.Module):
    """Paper Eq. 7: multi-head scaled dot-product attention of each hub over its in-neighbours' hubs.

    The query, key and value projections keep their own parameters (and names) but run as one product;
    in training the attention is `scaled_dot_product_attention` (a fused kernel on a GPU), with the
    weights computed explicitly only when the graph keeps them (eval)."""

    def __init__(self, hidden_size: int, heads: int, dropout: float = 0.0):
        super().__init__()
        if hidden_size % heads:
            raise ValueError(f"hop heads ({heads}) must divide the hidden size ({hidden_size})")
        self.heads, self.head_size = heads, hidden_size // heads
        self.query = nn.Linear(hidden_size, hidden_size)
        self.key = nn.Linear(hidden_size, hidden_size)
        self.value = nn.Linear(hidden_size, hidden_size)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self, hubs: torch.Tensor, graph: HopGraph, qkv: Projection | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """hubs [N, H] -> (ĥ [N, H], attention weights [E, heads], or None when the graph keeps none).
        `qkv`: this module's stacked query, key and value parameters (`xh.model.encoder.qkv_projections`)."""
        weight, bias = qkv or qkv_projections([self])[self]
        return self.attend(*self.split_heads(F.linear(hubs, weight, bias), 3), graph)

    def split_heads(self, projected: torch.Tensor, parts: int) -> tuple[torch.Tensor, ...]:
        """[N, parts x H] -> `parts` views [1, heads, N, d]: four dimensions, where CPUs too have a fused
        attention kernel (one unbind: one operator backward whatever the parts)."""
        n = projected.shape[0]
        return projected.view(1, n, parts, self.heads, self.head_size).permute(2, 0, 3, 1, 4).unbind(0)

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, graph: HopGraph
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Eq. 7 on q, k, v [1, heads, N, d] -> (ĥ [N, H], weights [E, heads] or None, as `forward`)."""
        n = q.shape[2]
        if graph.keep_attention:
            scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_size)  # [1, heads, N(dst), N(src)]
            weights = masked_softmax(scores, graph.allowed)
            gathered = dropout(self.dropout, weights) @ v
            return graph.zero_lonely(gathered.squeeze(0).transpose(0, 1).reshape(n, -1)), graph.edge_weights(
                weights.squeeze(0)
            )
        p = self.dropout.p if self.training else 0.0
        gathered = F.scaled_dot_product_attention(q, k, v, attn_mask=graph.allowed, dropout_p=p)
        return graph.zero_lonely(gathered.squeeze(0).transpose(0, 1).reshape(n, -1)), None


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

    def forward(self, hubs: torch.Tensor, graph: HopGraph) -> tuple[torch.Tensor, torch.Tensor | None]:
        n = hubs.shape[0]
        per_head = hubs.view(n, self.heads, self.head_size)
        features = self.fc(per_head)  # [N, heads, d]
        score_src = (features * self.attn_src).sum(-1).T  # [heads, N]
        score_dst = (features * self.attn_dst).sum(-1).T
        scores = self.leaky_relu(score_dst.unsqueeze(-1) + score_src.unsqueeze(-2))  # [heads, N(dst), N(src)]
        weights = masked_softmax(scores, graph.allowed_from_others)
        gathered = dropout(self.dropout, weights) @ features.transpose(0, 1)  # [heads, N, d]
        out = torch.relu(gathered.transpose(0, 1) + self.res_fc(per_head))
        return out.reshape(n, -1), graph.edge_weights(weights) if graph.keep_attention else None


def fusion_layer(hidden_size: int, fusion_init: str, initializer_range: float) -> nn.Linear:
    """Eq. 8's hub <- Linear([h ; ĥ]); "identity" starts it at [I, 0] plus noise, so step 0 keeps the
    pretrained hub, "random" is the release's plain N(0, initializer_range)."""
    fusion = nn.Linear(2 * hidden_size, hidden_size)
    with torch.no_grad():
        nn.init.normal_(fusion.weight, std=initializer_range)
        nn.init.zeros_(fusion.bias)
        if fusion_init == "identity":
            fusion.weight[:, :hidden_size] += torch.eye(hidden_size)
        elif fusion_init != "random":
            raise ValueError(f"fusion_init must be 'identity' or 'random', not {fusion_init!r}")
    return fusion


HopProjection = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # a paper step's stacked weight, bias and W_ĥ


class HubExchange:
    """What `PutHubs`'s backward hands to the `TakeHubs` of the same hop step: the tokens' gradient."""

    __slots__ = ("grad",)

    def __init__(self):
        self.grad: torch.Tensor | None = None


class TakeHubs(torch.autograd.Function):
    """`tokens.index_select(0, hubs)`, whose backward returns the tokens' whole gradient through both this
    and `PutHubs`: the gradient below `PutHubs` with the hub rows replaced by the hubs' gradient, one
    index_copy (autograd's own index_fill, zeros + index_add and their sum were three operators).
    Correct because the hubs taken here reach the loss only through the new hubs put back (hop attention
    and fusion), so `PutHubs`'s backward has always run before this one."""

    @staticmethod
    def forward(ctx, tokens: torch.Tensor, hubs: torch.Tensor, exchange: HubExchange) -> torch.Tensor:
        ctx.save_for_backward(hubs)
        ctx.exchange, ctx.shape = exchange, tokens.shape
        return tokens.index_select(0, hubs)

    @staticmethod
    def backward(ctx, grad_hubs: torch.Tensor):
        (hubs,) = ctx.saved_tensors
        grad, ctx.exchange.grad = ctx.exchange.grad, None
        if grad is None:  # the tokens put back reach no loss
            grad = grad_hubs.new_zeros(ctx.shape)
        return grad.index_copy(0, hubs, grad_hubs), None, None


class PutHubs(torch.autograd.Function):
    """`tokens.index_copy(0, hubs, new_hubs)`; backward hands the tokens' gradient to `TakeHubs` (above)."""

    @staticmethod
    def forward(ctx, tokens: torch.Tensor, new_hubs: torch.Tensor, hubs: torch.Tensor, exchange: HubExchange):
        ctx.save_for_backward(hubs)
        ctx.exchange = exchange
        return tokens.index_copy(0, hubs, new_hubs)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (hubs,) = ctx.saved_tensors
        if ctx.needs_input_grad[0]:
            ctx.exchange.grad = grad
        return None, grad.index_select(0, hubs), None, None


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
        self.fusion = fusion_layer(hidden_size, fusion_init, initializer_range)

    @property
    def fuses_projection(self) -> bool:
        """Paper attention: the fusion's half that reads the hub runs in the q/k/v product (`projection_parts`)."""
        return isinstance(self.attention, DotProductHopAttention)

    def projection_parts(self) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
        """(the weights and biases of one product of the hub: query, key, value and Eq. 8's h W_h^T + b;
        W_ĥ, the fusion's half that reads ĥ). Both halves are views of the fusion's one weight, by one
        unbind (one operator backward, where two slices cost three)."""
        size = self.fusion.out_features
        w_hub, w_gathered = self.fusion.weight.view(size, 2, size).unbind(1)
        return [*qkv_parts(self.attention), (w_hub, self.fusion.bias)], w_gathered

    def projection(self) -> HopProjection:
        """`projection_parts` stacked for this step alone (`XHModel` stacks them for all its layers at once)."""
        parts, w_gathered = self.projection_parts()
        return (*stacked_projections({self: parts})[self], w_gathered)

    def forward(self, hidden_states: torch.Tensor, graph: HopGraph, qkv: HopProjection | None = None) -> torch.Tensor:
        """[R, L, H] -> [R, L, H] with a new hub at each node's hub position and every other token unchanged.
        `qkv`: the paper step's `projection`, when the caller stacked it with other layers'."""
        rows, length, size = hidden_states.shape
        tokens = hidden_states.reshape(rows * length, size)
        hubs = graph.hubs if graph.hubs is not None else torch.arange(rows, device=tokens.device) * length
        exchange = HubExchange()
        # Outside autocast, in the parameters' dtype (float32 in mixed-precision training): the matrices are
        # tiny, casts to bf16 and back around each product would cost more kernels than the products, and
        # bf16 would round the attention weights coarsely.
        with torch.autocast(hidden_states.device.type, enabled=False):
            hub = cast(TakeHubs.apply(tokens, hubs, exchange), self.fusion.weight.dtype)
            if self.fuses_projection:
                new_hub, weights = self.paper_hop(hub, graph, qkv or self.projection())
            else:
                gathered, weights = self.attention(hub, graph)
                new_hub = self.fusion(torch.cat([hub, gathered], dim=-1))
        if weights is not None:
            graph.attention.append(weights.detach())
        return PutHubs.apply(tokens, cast(new_hub, tokens.dtype), hubs, exchange).view_as(hidden_states)

    def paper_hop(
        self, hub: torch.Tensor, graph: HopGraph, qkv: HopProjection
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Eq. 7-8 on the hubs [N, H]: q, k, v and h W_h^T + b from one product, attention, then
        Linear([h ; ĥ]) as that plus ĥ W_ĥ^T (one addmm, where a concatenation and a product were two
        operators forward and the hub's two gradients one more backward)."""
        weight, bias, w_gathered = qkv
        q, k, v, own = self.attention.split_heads(F.linear(hub, weight, bias), 4)
        gathered, weights = self.attention.attend(q, k, v, graph)
        return torch.addmm(own.squeeze(0).transpose(0, 1).reshape(hub.shape), gathered, w_gathered.t()), weights


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


class PlainHops:
    """XH's hop steps (`hop_variant` paper or gat) on the batch's edges: the hop-variant interface that
    `XHModel` calls (`xh.model.gesa.TypedHops` is the other one).

        steps, relations = hops.build(cfg, backbone, layers)      # one HopStep per hop layer; no extra module
        graph, layer_kwargs = hops.inputs(batch, cfg, relations, tokenizer)   # per batch
    """

    def build(self, cfg, backbone: nn.Module, layers: nn.ModuleList) -> tuple[nn.ModuleList, None]:
        config = backbone.config
        steps = nn.ModuleList(
            HopStep(
                config.hidden_size,
                cfg.hop_heads or config.num_attention_heads,
                variant=cfg.hop_variant,
                dropout=cfg.hop_dropout,
                fusion_init=cfg.hop_fusion_init,
                initializer_range=getattr(config, "initializer_range", 0.02),
            )
            for _ in range(cfg.hop_layers)
        )
        return steps, None

    def inputs(self, batch, cfg, relations=None, tokenizer=None) -> tuple[HopGraph, dict]:
        from xh.model.packing import hub_positions

        return HopGraph.of_batch(batch, cfg.isolated_nodes, hub_positions(batch)), {}
