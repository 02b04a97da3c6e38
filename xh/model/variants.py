"""The one place that tells the architectures apart: `model.architecture` xh or dochopper.

    model = new_model(cfg.model)                      # XHModel (any hop_variant, GESA included) or DocHopper
    model = load_saved("out/model")                   # whichever the folder holds (its config file says)
    batch = training_batch(model, rows, tokenizer, cfg.model.max_node_tokens)   # `graphs` rows -> model input
    architecture_of(model)                            # "xh" or "dochopper": the registry's flavour metadata

Both take the same `graphs` rows, return a loss from `model(batch)`, save with `save_pretrained` and
predict through `xh.inference.predict_graphs` with the same prediction keys, so that training, the
registry, promotion and batch scoring need not know which one they hold.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from xh.config import ModelConfig
from xh.model.dochopper import CONFIG_FILE as DOCHOPPER_CONFIG_FILE
from xh.model.dochopper import DocHopper, config_from_model
from xh.model.xh import XHModel


def new_model(cfg: ModelConfig) -> XHModel | DocHopper:
    """The pretrained backbone with the architecture's new parameters (random)."""
    if cfg.architecture == "dochopper":
        return DocHopper.from_backbone(config_from_model(cfg))
    return XHModel.from_backbone(cfg)


def load_saved(directory: str | Path, device: str | torch.device = "cpu") -> XHModel | DocHopper:
    """What `save_pretrained` wrote, in eval mode: a DocHopper folder holds dochopper_config.json."""
    if (Path(directory) / DOCHOPPER_CONFIG_FILE).is_file():
        return DocHopper.from_pretrained(directory, device)
    return XHModel.from_pretrained(directory, device)


def architecture_of(model) -> str:
    return "dochopper" if isinstance(model, DocHopper) else "xh"


def training_batch(model, rows: Sequence[dict], tokenizer, max_node_tokens: int):
    """`graphs` rows -> the model's batch (a GraphBatch for XH, a DocHopperBatch for DocHopper)."""
    if isinstance(model, DocHopper):
        return model.collate(model.prepare(rows))
    from xh.graph.encode import encode_graph
    from xh.model.batch import collate

    return collate([encode_graph(row, tokenizer, max_node_tokens) for row in rows])
