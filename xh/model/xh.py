"""`XHModel`: Transformer-XH over any BERT-family encoder, with the task heads of one task.

    cfg = ModelConfig(backbone="path/or/name", task="hotpot", hop_layers=3)
    model = XHModel.from_backbone(cfg)          # pretrained backbone, random hop and head parameters
    out = model(collate(graphs))                # XHOutput: logits, and loss when the batch has labels
    out = model(pack(graphs, row_tokens=512))   # the same, nodes packed into rows (xh.model.packing)
    out.loss.backward()

    model.save_pretrained("out/xh")             # xh_config.json, model.safetensors, config.json, tokenizer files
    model = XHModel.from_pretrained("out/xh")   # no pickle, no torch.load, no access to the original checkpoint

The folder is the saved-model format of `xh.model.saved`, which the re-ranker and the question-type
classifier share.

`encode` runs the backbone's embeddings and layers itself (`xh.model.encoder`), with a hop step after
each of the last K layers, on the batch's hop graph passed along explicitly; the backbone keeps its own
module layout and weight names (`backbone.*`; hop parameters are `hop_steps.*`, heads `heads.*`), and
`model.backbone(...)` called on its own is the plain backbone. The hop variant (`hop_variant`: paper,
gat, gesa) is the one table `HOP_VARIANTS`: how its steps are built and what each batch gives them.
The backbone's pooler is dropped (the heads read the hub directly, and DDP refuses parameters that
get no gradient).

Loss: Σ weight × term over every term of the task (`ModelConfig.*_loss_weight`); a term whose labels the
batch lacks is exactly 0 (`xh.model.heads`) but keeps its parameters in the autograd graph (DDP needs a
gradient for each in every step). `losses` lists the terms the batch has labels for; `loss` is None when
it has none. In eval mode the output also carries the hop graph's edges and attention weights per layer;
in training the hop steps run fused attention and keep no weights.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from xh.config import ModelConfig
from xh.model.batch import GraphBatch
from xh.model.encoder import embed, fusable, qkv_parts, run_layer, stacked_projections
from xh.model.gesa import TypedHops
from xh.model.heads import FeverHeads, HotpotHeads, present
from xh.model.hop import HopGraph, PlainHops, find_encoder_layers
from xh.model.packing import encoder_inputs, node_states
from xh.model.saved import load_encoder_model, load_tokenizer, pretrained_backbone, save_encoder_model

XH_CONFIG_FILE = "xh_config.json"
FORMAT = "transformer-xh"
FORMAT_VERSION = 1
# hop_variant -> how its hop steps are built and what each batch gives them (graph, layer keywords)
HOP_VARIANTS = {"paper": PlainHops(), "gat": PlainHops(), "gesa": TypedHops()}


@dataclass
class XHOutput:
    hidden_states: torch.Tensor  # [N, L, H] final token states (hub at position 0)
    node_logits: torch.Tensor  # [N] HotpotQA: relevance; FEVER: importance logits
    loss: torch.Tensor | None = None  # weighted sum of `losses`; None when the batch has no labels
    losses: dict[str, torch.Tensor] = field(default_factory=dict)  # unweighted terms present in the batch
    # HotpotQA
    start_logits: torch.Tensor | None = None  # [N, L] float32, MASKED outside paragraph tokens
    end_logits: torch.Tensor | None = None  # [N, L]
    answer_type_logits: torch.Tensor | None = None  # [G, 3] over ANSWER_TYPES
    sentence_logits: torch.Tensor | None = None  # [N, S] per paragraph sentence, MASKED where none
    sentence_mask: torch.Tensor | None = None  # bool [N, S]: the node has tokens of that sentence
    # FEVER
    label_logits: torch.Tensor | None = None  # [N, 3] p(y|node) logits over CLAIM_LABELS
    importance: torch.Tensor | None = None  # [N] p(node) within its graph (sums to 1 per graph)
    claim_log_probs: torch.Tensor | None = None  # [G, 3] log Σ_nodes importance × p(y|node)
    # Hop attention, for analysis: edges [2, E] (src, dst; with the self-loops added for isolated nodes)
    # and per hop layer the weights [E, heads] (detached; empty when hop_layers = 0).
    hop_edges: torch.Tensor | None = None
    hop_attention: list[torch.Tensor] = field(default_factory=list)


class XHModel(nn.Module):
    architecture = "xh"  # xh.model.variants

    def __init__(self, cfg: ModelConfig, backbone: nn.Module, tokenizer=None):
        super().__init__()
        self.cfg = cfg
        self.backbone = backbone
        self.tokenizer = tokenizer  # not a module: saved with save_pretrained, used by graph encoding
        config = backbone.config
        if getattr(backbone, "pooler", None) is not None:
            backbone.pooler = None
        hidden, init_range = config.hidden_size, getattr(config, "initializer_range", 0.02)
        # A plain list: the layers are registered (and saved) once, as the backbone's.
        self.layers = list(find_encoder_layers(backbone))
        if cfg.hop_layers > len(self.layers):
            raise ValueError(f"hop_layers={cfg.hop_layers} but the encoder has only {len(self.layers)} layers")
        self.hops = HOP_VARIANTS[cfg.hop_variant]
        self.hop_steps, self.hub_relations = self.hops.build(cfg, backbone, self.layers)
        dropout = getattr(config, "hidden_dropout_prob", 0.1)
        heads_class = HotpotHeads if cfg.task == "hotpot" else FeverHeads
        self.heads = heads_class(hidden, dropout=dropout, initializer_range=init_range)
        # RoBERTa-style encoders have one token type: segment ids would index past their table.
        self._use_token_types = getattr(config, "type_vocab_size", 0) > 1

    # --- construction and persistence ---------------------------------------------------------------

    @classmethod
    def from_backbone(cls, cfg: ModelConfig) -> XHModel:
        """Pretrained backbone and tokenizer from `cfg.backbone` (name or folder); hop and head parameters random."""
        backbone = pretrained_backbone(cfg.backbone, attn_implementation=cfg.attn_implementation)
        return cls(cfg, backbone, load_tokenizer(cfg.backbone))

    def save_pretrained(self, directory: str | Path) -> Path:
        """Write weights (safetensors), xh_config.json, the backbone's config.json and the tokenizer."""
        meta = {"format": FORMAT, "version": FORMAT_VERSION, "model": self.cfg.model_dump(mode="json")}
        save_encoder_model(
            directory, XH_CONFIG_FILE, meta, self.state_dict(), backbone=self.backbone, tokenizer=self.tokenizer
        )
        return Path(directory)

    @classmethod
    def from_pretrained(cls, directory: str | Path, device: str | torch.device = "cpu") -> XHModel:
        """Load what `save_pretrained` wrote, in eval mode; only JSON and safetensors are read."""
        saved = load_encoder_model(directory, XH_CONFIG_FILE, FORMAT, FORMAT_VERSION, what="XH model")
        cfg = ModelConfig.model_validate(saved.config["model"])
        model = cls(cfg, saved.new_backbone(attn_implementation=cfg.attn_implementation), saved.tokenizer)
        model.load_state_dict(saved.weights, strict=True)
        return model.to(device).eval()

    # --- forward ------------------------------------------------------------------------------------

    def encode(self, batch: GraphBatch) -> torch.Tensor:
        """Token states [N, L, H] of every node after the backbone with hop attention in its last K layers."""
        return self._encode(batch)[0]

    def _encode(self, batch: GraphBatch) -> tuple[torch.Tensor, HopGraph]:
        # A packed batch (`xh.model.packing`) holds several nodes per encoder row: the layers read its
        # rows, hop attention finds each node's hub among them, and the heads get [N, L, H] either way.
        graph, hop_kwargs = self.hops.inputs(batch, self.cfg, self.hub_relations, self.tokenizer)
        graph.keep_attention = not self.training  # training: fused attention kernels, no weights kept
        inputs = encoder_inputs(batch, self.backbone, self._use_token_types)
        x, mask = embed(self.backbone, **inputs)
        first_hop = len(self.layers) - len(self.hop_steps)
        qkv = self._projections(fused_layers=not hop_kwargs)
        for i, layer in enumerate(self.layers):
            # token attention within each node (Eq. 9); GESA's hub relations read hop_kwargs
            x = run_layer(layer, x, mask, qkv.get(layer), position_ids=inputs.get("position_ids"), **hop_kwargs)
            if i >= first_hop:  # hub attention along the graph's edges (Eq. 7-8)
                step = self.hop_steps[i - first_hop]
                x = step(x, graph, qkv[step]) if step in qkv else step(x, graph)
        return node_states(batch, x), graph

    def _projections(self, fused_layers: bool) -> dict:
        """The query, key and value parameters of the fused backbone layers, and those of the paper hop steps
        with their fusion's hub half, stacked for all of them at once (`xh.model.encoder.stacked_projections`):
        two operators a step, not two a layer."""
        parts = {layer: qkv_parts(layer.attention.self) for layer in self.layers if fused_layers and fusable(layer)}
        w_gathered = {}
        for step in self.hop_steps:
            if getattr(step, "fuses_projection", False):
                parts[step], w_gathered[step] = step.projection_parts()
        stacked = stacked_projections(parts)
        return {key: (*p, w_gathered[key]) if key in w_gathered else p for key, p in stacked.items()}

    def forward(self, batch: GraphBatch) -> XHOutput:
        hidden, graph = self._encode(batch)
        heads = self.heads(hidden, batch)
        terms = self.heads.terms(heads, batch)
        for own in ("node_log_p", "span_logits"):  # the heads' own intermediates, shared with the losses
            heads.pop(own, None)
        losses = present(terms, batch.counts(), self.heads.KINDS)
        loss = None
        if losses:
            # every term, 0 where the batch has no labels: each head parameter stays in the autograd graph
            weights = self.loss_weights
            weighted = [t if weights[k] == 1 else weights[k] * t for k, t in terms.items()]
            # one stack and one sum for HotpotQA's four terms, where three additions were three operators
            loss = torch.stack(weighted).sum() if len(weighted) > 3 else functools.reduce(torch.add, weighted)
        hop = {}
        if graph.keep_attention:  # eval: the edges (self-loops included, a read-back) and weights per layer
            hop = {"hop_edges": torch.stack([graph.src, graph.dst]), "hop_attention": graph.attention}
        return XHOutput(hidden_states=hidden, loss=loss, losses=losses, **heads, **hop)

    @property
    def loss_weights(self) -> dict[str, float]:
        cfg = self.cfg
        return {
            "node": cfg.node_loss_weight,
            "span": cfg.span_loss_weight,
            "answer_type": cfg.answer_type_loss_weight,
            "sentence": cfg.sentence_loss_weight,
            "claim": cfg.claim_loss_weight,
            "evidence": cfg.evidence_loss_weight,
        }
