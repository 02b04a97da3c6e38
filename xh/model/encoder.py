"""The two halves of a transformers BERT-family encoder that `XHModel` runs itself: `embed` (what the
backbone's own forward computes before its first layer) and its layers (`xh.model.hop.find_encoder_layers`).

    x, mask = embed(backbone, input_ids=ids, attention_mask=mask, token_type_ids=types)
    for layer in find_encoder_layers(backbone):
        x = run_layer(layer, x, mask)

gives the backbone's `last_hidden_state`, so that the hop steps can run between the layers in plain
sight. BERT, RoBERTa, ELECTRA (its embedding projection included) and DistilBERT build their layer
mask the same way (`create_bidirectional_mask`); a 4-D mask (packed rows) passes through unchanged, and a
2-D padding mask becomes [R, 1, 1, T] here (boolean for sdpa, additive for eager), with no read-back.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.masking_utils import create_bidirectional_mask


def embed(
    backbone: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    token_type_ids: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(token embeddings [R, T, H], the attention mask in the form the backbone's layers take)."""
    inputs = {"input_ids": input_ids, "position_ids": position_ids}
    if token_type_ids is not None:  # DistilBERT's embeddings take none
        inputs["token_type_ids"] = token_type_ids
    x = backbone.embeddings(**inputs)
    project = getattr(backbone, "embeddings_project", None)  # ELECTRA: embedding size != hidden size
    if project is not None:
        x = project(x)
    if attention_mask is not None and attention_mask.dim() == 2:
        # [R, T] padding mask -> [R, 1, 1, T] for the layers, built here: transformers' own check whether
        # the mask can be dropped (`padding_mask.all()`) reads a value back from the device every step.
        keep = attention_mask[:, None, None, :].bool()
        if getattr(backbone.config, "_attn_implementation", "eager") == "sdpa":
            return x, keep
        return x, torch.zeros(keep.shape, dtype=x.dtype, device=x.device).masked_fill(~keep, torch.finfo(x.dtype).min)
    mask = create_bidirectional_mask(config=backbone.config, inputs_embeds=x, attention_mask=attention_mask)
    return x, mask


def cast(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`tensor.to(dtype)` without the call when it already is (each call is an operator to dispatch)."""
    return tensor if tensor.dtype == dtype else tensor.to(dtype)


def dropout(module: nn.Dropout, x: torch.Tensor) -> torch.Tensor:
    """`module(x)`, without the call where it returns `x` (p = 0, or eval): an operator less to dispatch."""
    return module(x) if module.training and module.p else x


Projection = tuple[torch.Tensor, torch.Tensor]  # a weight [out, in] and bias [out]: one Linear's, or several stacked


def stacked_projections(parts: dict[object, list[Projection]]) -> dict[object, Projection]:
    """Each key's weights and biases stacked for one product ([sum of outputs, inputs], [sum of outputs]),
    for all keys at once: one concatenation of the weights and one of the biases, split per key (views),
    where a concatenation per layer cost two operators a layer (each a kernel on a GPU; the split's
    backward is one more). Keys whose weights take another input size than the first key's get their own."""
    if not parts:
        return {}
    size = next(iter(parts.values()))[0][0].shape[1]
    same = [key for key, pairs in parts.items() if all(w.shape[1] == size for w, _ in pairs)]
    sizes = [sum(w.shape[0] for w, _ in parts[key]) for key in same]
    weights = torch.cat([w for key in same for w, _ in parts[key]]).split(sizes)
    biases = torch.cat([b for key in same for _, b in parts[key]]).split(sizes)
    stacked = dict(zip(same, zip(weights, biases)))
    return stacked | stacked_projections({key: pairs for key, pairs in parts.items() if key not in stacked})


def qkv_parts(module: nn.Module) -> list[Projection]:
    """A module's query, key and value weights and biases (its `query`, `key`, `value` Linear layers)."""
    return [(getattr(module, name).weight, getattr(module, name).bias) for name in ("query", "key", "value")]


def qkv_projections(modules: list[nn.Module]) -> dict[nn.Module, Projection]:
    """Each module's query, key and value parameters stacked for one product (`stacked_projections`)."""
    return stacked_projections({module: qkv_parts(module) for module in modules})


def run_layer(
    layer: nn.Module, x: torch.Tensor, mask: torch.Tensor | None, qkv: Projection | None = None, **kwargs
) -> torch.Tensor:
    """One encoder layer; `kwargs` reach its attention function (as the backbone's own forward passes them).
    A BERT-style layer with nothing else to pass runs as `fused_bert_layer` (with `qkv`, its query, key and
    value parameters from `qkv_projections`)."""
    if not set(kwargs) - {"position_ids"} and fusable(layer):
        return fused_bert_layer(layer, x, mask, qkv)
    out = layer(x, mask, **kwargs)
    return out[0] if isinstance(out, tuple) else out  # older layer classes return (hidden_states, ...)


def fusable(layer: nn.Module) -> bool:
    """A BERT / RoBERTa / ELECTRA encoder layer (separate query, key and value projections, no cross-attention)."""
    attention = getattr(getattr(layer, "attention", None), "self", None)
    projections = [getattr(attention, name, None) for name in ("query", "key", "value")]
    return (
        all(isinstance(p, nn.Linear) and p.bias is not None for p in projections)
        and not getattr(layer, "is_decoder", False)
        and hasattr(layer, "feed_forward_chunk")
        and getattr(attention.config, "_attn_implementation", None) in ("sdpa", "eager")
    )


def fused_bert_layer(
    layer: nn.Module, x: torch.Tensor, mask: torch.Tensor | None, qkv: Projection | None = None
) -> torch.Tensor:
    """The layer's own computation with its own parameters, query, key and value in one product, and
    `scaled_dot_product_attention` (a fused kernel on a GPU) whatever the backbone's attention function:
    a boolean mask is the sdpa one, an additive mask the eager one, and SDPA takes either."""
    attention = layer.attention.self
    rows, length, _ = x.shape
    weight, bias = qkv or qkv_projections([attention])[attention]
    qkv = F.linear(x, weight, bias).view(rows, length, 3, attention.num_attention_heads, attention.attention_head_size)
    q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each [R, heads, T, d]
    dropout = attention.dropout.p if layer.training else 0.0
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=attention.scaling)
    attended = layer.attention.output(out.transpose(1, 2).reshape(rows, length, -1), x)
    return layer.feed_forward_chunk(attended)
